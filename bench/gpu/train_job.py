"""A real PyTorch training job on synthetic data, each step wrapped in `shim.step()`.

The model is a stack of transformer encoder layers (`--model transformer`, the default)
or of residual MLP blocks (`--model mlp`), sized by `--width`, `--depth`, `--seq` and
`--batch`, trained with AdamW on random inputs and targets (MSE loss). Every step:

    with shim.step():
        sleep --idle-ms       # the host fetching the next batch: the GPU is idle meanwhile
        forward, backward, optimizer step
        loss.item()           # a sync, as most training loops have: the step's wall
                              # time then includes its GPU work

The shim is loaded from the repository's shared/shim.py by path (or `--shim FILE`), so
the job needs nothing of gpusched installed. It talks to the agent only if
GPUSCHED_SHIM_SOCKET is set; `--no-shim` leaves it out altogether (a plain loop with
the same sync), to measure what the shim costs.

Output, on stdout, one JSON object a line:
- `{"event": "progress", ...}` every `--report-every` steps: the rate and step times of
  those steps;
- `{"event": "oom", ...}` for a step that ran out of GPU memory (the job goes on, up to
  `--max-oom` of them);
- `{"event": "summary", ...}` at the end: steps/s, mean and median step time, time in
  the step body and in the shim's boundary, the most memory PyTorch reserved, the
  process's peak host memory.

The figures leave out the first `--warmup` steps. The job stops after `--steps` steps,
after `--seconds` seconds, or on SIGTERM/SIGINT, and prints the summary each time.

    python bench/gpu/train_job.py --batch 16 --width 1024 --idle-ms 30 --seconds 60

Exit status: 0 done, 2 no PyTorch or no CUDA (`--device cpu` runs without CUDA, to check
the wiring only), 3 more than `--max-oom` steps ran out of memory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import resource
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_SHIM = ROOT / "shared" / "shim.py"
MIB = 1024 * 1024
EXIT_NO_TORCH = 2
EXIT_OOM = 3


class Stopped(Exception):
    """SIGTERM or SIGINT: end the loop and print the summary."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="A PyTorch training job on synthetic data, each step in shim.step().",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    p.add_argument("--batch", type=int, default=16, help="samples per step")
    p.add_argument("--width", type=int, default=1024, help="model width (d_model)")
    p.add_argument("--depth", type=int, default=4, help="layers")
    p.add_argument("--seq", type=int, default=256, help="tokens per sample (transformer)")
    p.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16"),
        default="tf32",
        help="fp32; fp32 with TF32 matmuls; bf16 autocast",
    )
    p.add_argument("--idle-ms", type=float, default=0.0, help="host-side sleep in each step")
    p.add_argument("--steps", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: none)")
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of figures")
    p.add_argument("--report-every", type=int, default=50, help="steps per progress line")
    p.add_argument("--max-oom", type=int, default=20, help="out-of-memory steps before exit 3")
    p.add_argument("--no-shim", action="store_true", help="no shim at all (plain loop)")
    p.add_argument("--shim", type=Path, default=DEFAULT_SHIM, help="the shim.py to load")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("batch", "width", "depth", "seq", "report_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.model == "transformer" and args.width % 64:
        p.error("--width must be a multiple of 64 for the transformer (64 per head)")
    if args.steps <= 0 and args.seconds <= 0:
        p.error("give --steps or --seconds (or both)")
    return args


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, separators=(",", ":")), flush=True)


def fail(message: str, status: int) -> NoReturn:
    print(f"train_job: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def load_shim(path: Path) -> ModuleType:
    """shared/shim.py by path: it is stdlib-only, so nothing else of gpusched is needed."""
    spec = importlib.util.spec_from_file_location("gpusched_shim", path)
    if spec is None or spec.loader is None:
        fail(f"cannot load the shim from {path}", EXIT_NO_TORCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def import_torch(device: str) -> ModuleType:
    try:
        import torch
    except ImportError as exc:
        fail(
            f"PyTorch is not installed for {sys.executable} ({exc}); "
            "install it first, e.g. `.venv/bin/pip install torch`",
            EXIT_NO_TORCH,
        )
    if device == "cuda" and not torch.cuda.is_available():
        fail(
            f"PyTorch {torch.__version__} sees no CUDA GPU (CUDA build: "
            f"{torch.version.cuda or 'none'}); `--device cpu` only checks the wiring",
            EXIT_NO_TORCH,
        )
    return torch


def build_model(torch: ModuleType, args: argparse.Namespace) -> Any:
    nn = torch.nn
    if args.model == "transformer":
        layer = nn.TransformerEncoderLayer(
            d_model=args.width,
            nhead=args.width // 64,
            dim_feedforward=4 * args.width,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        return nn.TransformerEncoder(layer, num_layers=args.depth, enable_nested_tensor=False)

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    return nn.Sequential(*(Block(args.width) for _ in range(args.depth)))


def batch_shape(args: argparse.Namespace) -> tuple[int, ...]:
    if args.model == "transformer":
        return (args.batch, args.seq, args.width)
    return (args.batch, args.width)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = import_torch(args.device)  # only now: --help works without PyTorch
    shim_mode = (
        "off"
        if args.no_shim
        else "socket"
        if os.environ.get("GPUSCHED_SHIM_SOCKET")
        else "no-socket"
    )
    shim_step: Callable[[], contextlib.AbstractContextManager[None]] = (
        contextlib.nullcontext if args.no_shim else load_shim(args.shim).step
    )

    torch.manual_seed(args.seed)
    cuda = args.device == "cuda"
    device = torch.device(args.device)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    # Building the model on the GPU initialises CUDA, which the shim looks for.
    model = build_model(torch, args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [
        (
            torch.randn(batch_shape(args), device=device),
            torch.randn(batch_shape(args), device=device),
        )
        for _ in range(4)
    ]
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
        (lambda: torch.autocast(device_type=args.device, dtype=torch.bfloat16))
        if args.precision == "bf16"
        else contextlib.nullcontext
    )
    params = sum(p.numel() for p in model.parameters())
    idle_s = args.idle_ms / 1000

    step_s: list[float] = []  # the whole loop iteration: body, shim, throttle
    body_s: list[float] = []
    boundary_s: list[float] = []  # inside shim.step() but outside the body
    done, ooms, stopped_by = 0, 0, "steps"
    started = time.perf_counter()
    measured_from: float | None = None
    interval_from, interval_steps = started, 0
    loss_value = math.nan

    def stop(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)  # one is enough: the summary must get out
        raise Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while True:
            now = time.perf_counter()
            if args.steps and done >= args.steps:
                break
            if args.seconds and now - started >= args.seconds:
                stopped_by = "seconds"
                break
            if done == args.warmup and measured_from is None:
                measured_from = now
            x, y = batches[done % len(batches)]
            t0 = time.perf_counter()
            try:
                with shim_step():
                    t1 = time.perf_counter()
                    if idle_s:
                        time.sleep(idle_s)
                    with autocast():
                        loss = torch.nn.functional.mse_loss(model(x).float(), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    loss_value = loss.item()  # the sync most training loops have
                    t2 = time.perf_counter()
                t3 = time.perf_counter()
            except torch.cuda.OutOfMemoryError as exc:
                ooms += 1
                loss = None
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                emit("oom", step=done, count=ooms, message=str(exc).splitlines()[0][:300])
                if ooms > args.max_oom:
                    stopped_by = "oom"
                    break
                continue
            done += 1
            if done > args.warmup:
                step_s.append(t3 - t0)
                body_s.append(t2 - t1)
                boundary_s.append((t1 - t0) + (t3 - t2))
            interval_steps += 1
            if done % args.report_every == 0:
                at = time.perf_counter()
                emit(
                    "progress",
                    step=done,
                    t=round(at - started, 3),
                    steps_per_s=round(interval_steps / (at - interval_from), 3),
                    step_ms=ms(median(step_s[-interval_steps:])),
                    loss=round(loss_value, 5),
                    mem_reserved_mib=torch.cuda.memory_reserved() // MIB if cuda else None,
                )
                interval_from, interval_steps = at, 0
    except Stopped as why:
        stopped_by = str(why)
    ended = time.perf_counter()
    measured_s = ended - measured_from if measured_from is not None else 0.0
    emit(
        "summary",
        pid=os.getpid(),
        shim=shim_mode,
        job_kind=os.environ.get("GPUSCHED_JOB_KIND") or "guaranteed",
        model=args.model,
        params=params,
        batch=args.batch,
        width=args.width,
        depth=args.depth,
        seq=args.seq if args.model == "transformer" else None,
        precision=args.precision,
        idle_ms=args.idle_ms,
        device=torch.cuda.get_device_name() if cuda else "cpu",
        torch=torch.__version__,
        stopped_by=stopped_by,
        steps=done,
        measured_steps=len(step_s),
        measured_s=round(measured_s, 3),
        steps_per_s=round(len(step_s) / measured_s, 4) if measured_s > 0 else None,
        step_ms_mean=ms(mean(step_s)),
        step_ms_median=ms(median(step_s)),
        body_ms_median=ms(median(body_s)),
        boundary_ms_mean=ms(mean(boundary_s)),
        boundary_ms_median=ms(median(boundary_s)),
        oom_steps=ooms,
        max_memory_reserved_mib=torch.cuda.max_memory_reserved() // MIB if cuda else None,
        max_memory_allocated_mib=torch.cuda.max_memory_allocated() // MIB if cuda else None,
        # Host memory: on Linux ru_maxrss is in KiB.
        max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    )
    return EXIT_OOM if stopped_by == "oom" else 0


if __name__ == "__main__":
    sys.exit(main())
