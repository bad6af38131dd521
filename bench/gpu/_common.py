"""What the GPU benchmarks share: checks, NVML, the jobs, their shim reports, figures.

Nothing here imports PyTorch, pynvml or gpusched at import time, so every script's
`--help` works anywhere. `require_*` raise `Unavailable` with a message that says what is
missing; the scripts print it and exit with status 2, never a traceback.

Times are `time.monotonic()` everywhere (the event loop's clock on Linux), so shim
reports, NVML samples and coordinator decisions line up.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import functools
import importlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAIN_JOB = HERE / "train_job.py"
EXIT_UNAVAILABLE = 2
MIB = 1024 * 1024
STOP_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 180.0  # a job's start: Python, PyTorch, the CUDA context, the model

if str(HERE.parent) not in sys.path:  # bench/: what every benchmark shares
    sys.path.insert(0, str(HERE.parent))
from _version import code_version  # noqa: E402


class Unavailable(Exception):
    """PyTorch, CUDA, NVML or gpusched's own modules are not there: exit 2."""


class JobFailed(Exception):
    """A training job exited with an error, or never got going."""


# ---- what is needed ------------------------------------------------------------------

_TORCH_PROBE = """
import json
try:
    import torch
except ImportError as exc:
    print(json.dumps({"error": f"PyTorch is not installed ({exc})"}))
    raise SystemExit(0)
ok = torch.cuda.is_available()
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cuda_available": ok,
    "devices": torch.cuda.device_count() if ok else 0,
}))
"""


def require_torch(python: str, cpu: bool) -> dict[str, Any]:
    """What PyTorch the jobs' interpreter has, probed in a subprocess.

    A subprocess, so that this process never makes a CUDA context of its own: NVML
    would list it beside the jobs, and it would take GPU memory.
    """
    try:
        found = subprocess.run(
            [python, "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"cannot run {python} to look for PyTorch: {exc}") from None
    try:
        info: dict[str, Any] = json.loads(found.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (found.stderr or found.stdout).strip()[-600:]
        raise Unavailable(f"{python} could not import PyTorch:\n{tail}") from None
    if "error" in info:
        raise Unavailable(
            f"{info['error']} for {python}. Install it first, e.g. "
            "`.venv/bin/pip install torch` (a CUDA build: see pytorch.org)"
        )
    if not cpu and not info["cuda_available"]:
        raise Unavailable(
            f"PyTorch {info['torch']} (CUDA build: {info['cuda'] or 'none'}) sees no CUDA "
            "GPU: these benchmarks need an NVIDIA GPU and a CUDA build of PyTorch "
            "(--cpu only checks the wiring)"
        )
    return info


def require_project() -> None:
    """gpusched's own modules (the shim server, the coordinator) and what they import."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        for name in ("agentd.coordinator", "agentd.shim_server", "shared.shim_protocol"):
            importlib.import_module(name)
        logging = importlib.import_module("shared.logging")
    except ImportError as exc:
        raise Unavailable(
            f"cannot import gpusched's modules ({exc}): run with the project's "
            "virtualenv, e.g. `.venv/bin/python bench/gpu/...` after `make` has set it up"
        ) from None
    # The shim server logs each connection at info: keep the figures readable.
    logging.configure("bench-gpu", "warning", sys.stderr)


def attempt(problems: list[str], requirement: Callable[..., Any], *args: Any) -> Any:
    """`requirement(*args)`, or None with its problem noted when something is missing."""
    try:
        return requirement(*args)
    except Unavailable as exc:
        problems.append(str(exc))
        return None


def exit_if_unavailable(problems: Sequence[str]) -> None:
    """Print every problem found and exit with status 2 if there is one."""
    if problems:
        for problem in problems:
            print(f"cannot measure: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE)


def say(text: str) -> None:
    """Progress, on stderr: stdout carries only the figures."""
    print(text, file=sys.stderr, flush=True)


def add_harness_args(
    p: argparse.ArgumentParser, *, jobs: bool = False, gpu: str = "measure", cpu: bool = True
) -> None:
    """The flags every GPU benchmark takes, last: the GPU, the jobs' interpreter, the
    JSON summary and, where the benchmark has one, the CPU stand-in (`--cpu`; without
    it `args.cpu` is False, as `prepare` reads it)."""
    whose = "jobs'" if jobs else "job's"
    p.add_argument("--gpu", type=int, default=0, help=f"NVML index of the GPU to {gpu}")
    p.add_argument("--python", default=sys.executable, help=f"the {whose} interpreter")
    p.add_argument("--json", type=Path, help="also write the JSON summary here")
    if cpu:
        on_cpu = "jobs on the CPU" if jobs else "the job on the CPU"
        p.add_argument("--cpu", action="store_true", help=f"{on_cpu}: a wiring check only")
    else:
        p.set_defaults(cpu=False)


def prepare(args: Any) -> tuple[dict[str, Any], Gpu]:
    """PyTorch, gpusched and the GPU (or the CPU stand-in) a benchmark needs, each
    checked; every one missing is said at once, and the script exits 2."""
    problems: list[str] = []
    torch_info = attempt(problems, require_torch, args.python, args.cpu)
    attempt(problems, require_project)
    gpu = attempt(problems, Gpu.cpu if args.cpu else functools.partial(Gpu.open, args.gpu))
    exit_if_unavailable(problems)
    return torch_info, gpu


def measure(gpu: Gpu, run: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """The benchmark's figures; a failed job ends the script with status 1, an
    interruption with 130. The GPU is closed either way."""
    others = gpu.processes()
    if others:
        say(f"note: other processes use this GPU ({sorted(others)}): the figures are disturbed")
    try:
        return asyncio.run(run())
    except JobFailed as exc:
        print(f"measurement failed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        gpu.close()


# ---- NVML ----------------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class Gpu:
    """One GPU through NVML; `Gpu.cpu()` stands in for none in a --cpu wiring check."""

    index: int
    name: str
    uuid: str
    total_mib: int
    driver: str
    cuda_driver: str
    nvml: ModuleType | None = None
    handle: Any = None

    @classmethod
    def open(cls, index: int) -> Gpu:
        try:
            import pynvml
        except ImportError:
            raise Unavailable(
                "pynvml is not installed (package nvidia-ml-py, in the project's "
                "dependencies: use the project's virtualenv)"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unavailable(f"NVML cannot start ({exc}): no NVIDIA driver here?") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            if not 0 <= index < count:
                raise Unavailable(f"NVML sees {count} GPU(s); there is no GPU {index}")
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            return cls(
                index=index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                total_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                driver=_text(pynvml.nvmlSystemGetDriverVersion()),
                cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}",
                nvml=pynvml,
                handle=handle,
            )
        except pynvml.NVMLError as exc:
            raise Unavailable(f"NVML cannot read GPU {index}: {exc}") from None

    @classmethod
    def cpu(cls) -> Gpu:
        return cls(-1, "none (--cpu wiring check)", "GPU-none", 16384, "none", "none")

    def processes(self) -> dict[int, int | None]:
        """pid -> GPU memory used (MiB; None where the driver will not say) of each process."""
        if self.nvml is None:
            return {}
        try:
            running = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nvml.NVMLError:
            return {}
        return {
            int(p.pid): None if p.usedGpuMemory is None else int(p.usedGpuMemory) // MIB
            for p in running
        }

    def utilization(self) -> int | None:
        if self.nvml is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except self.nvml.NVMLError:
            return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "memory_mib": self.total_mib,
            "driver": self.driver,
            "cuda_driver": self.cuda_driver,
        }

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


@dataclass(frozen=True)
class Sample:
    t: float
    used_mib: dict[int, int | None]  # by pid, as NVML lists the GPU's compute processes
    utilization_pct: int | None


class Sampler(threading.Thread):
    """NVML every `interval_s` in a thread (NVML calls block): processes' memory, use."""

    def __init__(self, gpu: Gpu, interval_s: float = 0.25) -> None:
        super().__init__(name="nvml-sampler", daemon=True)
        self.gpu, self.interval_s = gpu, interval_s
        self.samples: list[Sample] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            sample = Sample(time.monotonic(), self.gpu.processes(), self.gpu.utilization())
            self.samples.append(sample)  # list.append is atomic under the GIL
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def between(self, a: float, b: float) -> list[Sample]:
        return [s for s in list(self.samples) if a <= s.t <= b]


# ---- the jobs and what their shims say --------------------------------------------------


@dataclass(frozen=True)
class StepReport:
    t: float  # when the agent side received it
    step: int
    wall_s: float
    gpu_s: float | None
    reserved_mib: int | None
    peak_mib: int | None
    cap_met: bool | None
    spilling: bool


@dataclass(frozen=True)
class CapAck:
    t: float
    cap_mib: int | None
    met: bool | None
    reserved_mib: int | None
    spilling: bool


@dataclass
class Job:
    """One training job: its process, its stdout events, and its shim's reports."""

    key: str
    kind: str  # guaranteed | opportunistic
    started: float = 0.0
    ended: float | None = None
    proc: asyncio.subprocess.Process | None = None
    pid: int | None = None  # from the process; the shim's hello says the same
    hello_at: float | None = None
    steps: list[StepReport] = field(default_factory=list)
    caps: list[CapAck] = field(default_factory=list)
    pauses: list[tuple[float, str]] = field(default_factory=list)  # suspended | resumed
    events: list[dict[str, Any]] = field(default_factory=list)  # its JSON stdout lines
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40))
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any] | None:
        found = [e for e in self.events if e.get("event") == "summary"]
        return found[-1] if found else None

    @property
    def oom_steps(self) -> int:
        return sum(1 for e in self.events if e.get("event") == "oom")

    def on_shim(self, msg: Any, now: float) -> None:
        """A message from the job's shim (shared/shim_protocol.py), by its type's name."""
        kind = type(msg).__name__
        if kind == "Hello":
            self.hello_at = self.hello_at or now
        elif kind == "Step":
            self.steps.append(
                StepReport(
                    now,
                    msg.step,
                    msg.wall_s,
                    msg.gpu_s,
                    msg.mem_reserved_mib,
                    msg.mem_peak_mib,
                    msg.cap_met,
                    msg.spilling,
                )
            )
        elif kind == "CapApplied":
            self.caps.append(
                CapAck(now, msg.memory_cap_mib, msg.met, msg.mem_reserved_mib, msg.spilling)
            )
        elif kind in ("Suspended", "Resumed"):
            self.pauses.append((now, kind.lower()))

    def steps_between(self, a: float, b: float) -> list[StepReport]:
        return [s for s in self.steps if a < s.t <= b]

    def rate(self, a: float, b: float) -> float | None:
        """Steps per second whose reports arrived in (a, b]."""
        if b <= a:
            return None
        return len(self.steps_between(a, b)) / (b - a)

    def solo_window(self, warmup: int) -> tuple[float, float] | None:
        """From the report of step `warmup` to the last one: a solo run's steady part."""
        later = [s for s in self.steps if s.step >= warmup]
        if len(later) < 2:
            return None
        return later[0].t, later[-1].t

    def peak_mib(self) -> int | None:
        peaks = [s.peak_mib for s in self.steps if s.peak_mib is not None]
        return max(peaks) if peaks else None

    async def start(self, command: Sequence[str], env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # a Ctrl-C at the terminal goes to the harness only
        )
        self.pid, self.started = self.proc.pid, time.monotonic()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._read_stdout(self.proc.stdout)),
            asyncio.create_task(self._read_stderr(self.proc.stderr)),
        ]

    async def _read_stdout(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").strip()
            try:
                event = json.loads(line)
            except ValueError:
                self.stderr.append(line)
                continue
            if isinstance(event, dict):
                self.events.append(event)

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            self.stderr.append(raw.decode(errors="replace").rstrip())

    async def wait(self, timeout_s: float | None = None) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        await asyncio.gather(*self._readers, return_exceptions=True)
        self.ended = self.ended or time.monotonic()
        return code

    async def stop(self) -> int | None:
        """SIGTERM (the job prints its summary and exits), then SIGKILL if it lingers."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.ended = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                return await self.wait(STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
        return await self.wait()

    def failure(self, what: str) -> JobFailed:
        tail = "\n".join(f"    {line}" for line in list(self.stderr)[-20:]) or "    (nothing)"
        code = None if self.proc is None else self.proc.returncode
        return JobFailed(f"{what}: job {self.key} exited with {code}; its stderr ends:\n{tail}")


def job_env(gpu: Gpu, socket: Path | None, kind: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    env["PYTHONUNBUFFERED"] = "1"
    if gpu.nvml is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # the job's cuda:0 is the GPU measured
    env["GPUSCHED_JOB_KIND"] = kind
    if socket is not None:
        env["GPUSCHED_SHIM_SOCKET"] = str(socket)
    return env


def job_command(python: str, job_args: Sequence[str], *extra: str, cpu: bool) -> list[str]:
    """train_job.py with the user's flags, then the harness's own (which win)."""
    return [python, str(TRAIN_JOB), *job_args, *extra, *(["--device", "cpu"] if cpu else [])]


async def wait_until(condition: Callable[[], bool], timeout_s: float, job: Job) -> None:
    """Poll `condition`; JobFailed if the job exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job.proc is not None and job.proc.returncode is not None:
            await job.wait()
            raise job.failure("it ended before it got going")
        if time.monotonic() > deadline:
            raise JobFailed(f"job {job.key} did not get going within {timeout_s:g}s")
        await asyncio.sleep(0.05)


def short_socket_dir() -> Path:
    """A fresh directory for the shim sockets; a short path (a socket's fits 107 bytes)."""
    base = "/tmp" if Path("/tmp").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="gs-", dir=base))


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- the agent's side: a shim server and the jobs it serves ------------------------------


class Harness:
    """A real `ShimServer` on a fresh socket directory, the jobs it serves, NVML samples.

    `on_event` files each shim message with its job, then calls `after_event`, which a
    benchmark overrides to play more of the agent (feeding a coordinator, say).
    """

    def __init__(self, gpu: Gpu, python: str, warmup: int, cpu: bool) -> None:
        from agentd.shim_server import ShimServer

        self.gpu, self.python, self.warmup, self.cpu = gpu, python, warmup, cpu
        self.socket_dir = short_socket_dir()
        self.server = ShimServer(self.socket_dir, self.on_event)
        self.sampler = Sampler(gpu) if gpu.nvml is not None else None
        self.jobs: dict[str, Job] = {}

    def on_event(self, key: str, msg: Any) -> None:
        now = time.monotonic()
        job = self.jobs.get(key)
        if job is not None:
            job.on_shim(msg, now)
            self.after_event(key, msg, now)

    def after_event(self, key: str, msg: Any, now: float) -> None:
        pass

    def start(self) -> None:
        if self.sampler is not None:
            self.sampler.start()

    async def close(self) -> None:
        """Stop every job still running, close the sockets, stop sampling."""
        await asyncio.gather(*(job.stop() for job in self.jobs.values()))
        await self.server.close()
        if self.sampler is not None:
            self.sampler.stop()
        remove_dir(self.socket_dir)

    async def launch(
        self, key: str, kind: str, job_args: Sequence[str], *extra: str, socket: bool = True
    ) -> Job:
        """Start train_job.py as `kind`, with a shim socket unless `socket` is False."""
        path = await self.server.open_job(key) if socket else None
        job = Job(key, kind)
        self.jobs[key] = job
        command = job_command(
            self.python, job_args, "--warmup", str(self.warmup), *extra, cpu=self.cpu
        )
        await job.start(command, job_env(self.gpu, path, kind))
        return job

    async def finish(self, job: Job, timeout_s: float, ok: Sequence[int] = (0,)) -> int:
        """Wait for the job to end; JobFailed unless its status is in `ok` with a summary."""
        try:
            code = await job.wait(timeout_s)
        except TimeoutError:
            await job.stop()
            raise JobFailed(f"job {job.key} did not end within {timeout_s:g}s") from None
        finally:
            await self.server.close_job(job.key)
        if code not in ok:
            raise job.failure("it failed")
        if job.summary is None:
            raise job.failure("it printed no summary")
        return code


# ---- NVML per process ----------------------------------------------------------------


@dataclass(frozen=True)
class ProcessMemory:
    nvml_pid: int | None
    how: str  # exact | by order of appearance | not listed
    samples: list[tuple[float, int | None]]  # (time, MiB used) while the job ran


def process_memory(job: Job, sampler: Sampler, claimed: set[int]) -> ProcessMemory:
    """What NVML says the job's process used, sample by sample.

    NVML names processes by their PID in the host's namespace. In a container that is
    not the PID this process sees: then the job's process is taken to be the first
    process that appeared on the GPU after the job started and that no other job has
    claimed (`claimed`). Start jobs one after the other for this to hold.
    """
    end = job.ended if job.ended is not None else time.monotonic()
    during = sampler.between(job.started, end)
    before = {pid for s in sampler.samples if s.t < job.started for pid in s.used_mib}
    pid, how = job.pid, "exact"
    if pid is None or not any(pid in s.used_mib for s in during):
        new = [p for s in during for p in s.used_mib if p not in before and p not in claimed]
        pid, how = (new[0], "by order of appearance") if new else (None, "not listed")
    if pid is not None:
        claimed.add(pid)
    return ProcessMemory(
        pid, how, [(s.t, s.used_mib[pid]) for s in during if pid is not None and pid in s.used_mib]
    )


def outside_allocator(
    job: Job, samples: Sequence[tuple[float, int | None]], since: float | None = None
) -> int | None:
    """Median of NVML's figure less PyTorch's reserved at the step report before it.

    That is the memory no cap counts: the CUDA context, cuBLAS and cuDNN workspaces.
    Only samples after `since` count, when given.
    """
    diffs: list[int] = []
    steps, i = job.steps, 0
    for t, used in samples:
        while i + 1 < len(steps) and steps[i + 1].t <= t:
            i += 1
        if used is None or (since is not None and t <= since) or not steps or steps[i].t > t:
            continue
        reserved = steps[i].reserved_mib
        if reserved is not None:
            diffs.append(used - reserved)
    return int(statistics.median(diffs)) if diffs else None


# ---- figures ---------------------------------------------------------------------------


def time_weighted_mean(changes: Sequence[tuple[float, float]], a: float, b: float) -> float | None:
    """Mean over [a, b] of a value set to `v` at each (t, v) of `changes` (sorted by t).

    Before the first change the value is unknown: that part of [a, b] is left out.
    """
    total = known = 0.0
    for i, (t, v) in enumerate(changes):
        start = max(t, a)
        end = min(changes[i + 1][0] if i + 1 < len(changes) else b, b)
        if end > start:
            total += v * (end - start)
            known += end - start
    return total / known if known > 0 else None


def fmt(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def conditions(gpu: Gpu, torch_info: dict[str, Any], python: str) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu.describe(),
        "torch": torch_info.get("torch"),
        "torch_cuda": torch_info.get("cuda"),
        "python": platform.python_version(),
        "jobs_python": python,
        "host": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
        "code": code_version(),
    }


def describe(conditions: dict[str, Any]) -> str:
    """One line of what was measured on: GPU, driver, PyTorch, date, code."""
    c, gpu = conditions, conditions["gpu"]
    return (
        f"GPU {gpu['name']} ({gpu['memory_mib']} MiB), driver {gpu['driver']} "
        f"(CUDA {gpu['cuda_driver']}), PyTorch {c['torch']} (CUDA {c['torch_cuda']}), "
        f"{c['date']}, code {c['code']}"
    )


def report(
    benchmark: str,
    args: Any,
    torch_info: dict[str, Any],
    gpu: Gpu,
    settings: dict[str, Any],
    show: Callable[[dict[str, Any], Any], None],
    **figures: Any,
) -> int:
    """A benchmark's result (its name, conditions, settings and figures): shown as a
    table by `show(result, args)`, then as JSON, also to `args.json`; exit status 0."""
    result = {
        "benchmark": benchmark,
        "conditions": conditions(gpu, torch_info, args.python),
        "settings": settings,
        **figures,
    }
    show(result, args)
    write_json(args.json, result)
    return 0


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=2, default=str)
    print(text)
    if path is not None:
        path.write_text(text + "\n")
        print(f"(written to {path})", file=sys.stderr)
