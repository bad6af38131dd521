"""A history of real training jobs' peak GPU memory and utilisation, and how well the
resource estimator predicts them for jobs it has not seen.

Runs `--jobs` training jobs (bench/gpu/train_job.py, each `--job-seconds` of steps),
each a configuration drawn (by `--seed`) from a grid: model (transformer or MLP),
batch, width, depth, sequence length, precision, and a host-side pause per step (the
input pipeline, which keeps the GPU idle meanwhile). Per job it records what the agent
records of a job alone on its GPU: the most GPU memory in use (here NVML's figure for
the job's own process, which is the whole GPU's for a job alone, and stays the job's
with `--parallel`), and the mean and spread of the GPU's utilisation over the job's
steps after warm-up; and PyTorch's own peak (max_memory_reserved) beside them. A job
that ran out of memory in a step is left out, as a failed job would be.

Then it trains the estimator's forests (schedd/estimator, as the scheduler does) on
the first `--train` share of the jobs, their features what a submitter would write:
name = the model, labels batch_size, width, depth, seq_len and precision. The pause is
left out of the labels, as no spec says how long a job's input pipeline takes. It
predicts the later jobs' peak memory and utilisation and compares them with the truth,
against two baselines: the mean of the training jobs with the same name, and the median
of all training jobs. Figures: median error, the share within 1.25x and 2x, and the
mean absolute error.

With `--parallel N` (N > 1) jobs run N at a time: memory is still each process's own
(where NVML names it by the job's PID; else PyTorch's peak, which leaves out the CUDA
context), but the GPU's utilisation is shared, so its figures are left out. If a job
fails, no more are started, those running end, and the records so far are written
(`--history`) before the script exits with status 1.

    .venv/bin/python bench/gpu/memory_history.py [--jobs 48] [--parallel 4] [--json h.json]

`--cpu` runs small configurations on the CPU (no NVML): it checks the wiring, with the
process's peak host memory standing in for GPU memory; those figures are not GPU
figures. `--history FILE` writes the jobs' records as CSV, which `--from-history FILE`
reads back to redo the analysis without running anything.

Exit status: 0 once the figures are printed, 1 when a job failed, 2 when PyTorch,
CUDA, NVML or gpusched's modules are missing.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import (
    CONNECT_TIMEOUT_S,
    Gpu,
    Harness,
    Job,
    JobFailed,
    add_harness_args,
    describe,
    fmt,
    measure,
    prepare,
    process_memory,
    report,
    say,
    table,
    write_json,
)

# Each list is what a drawn job may take. The GPU grid stays well inside an 80 GiB GPU
# at its largest (transformer, width 1024, depth 12, batch 32, seq 512, fp32).
GPU_GRID: dict[str, Sequence[Any]] = {
    "model": ("transformer", "mlp"),
    "batch": (4, 8, 16, 32),
    "width": (256, 512, 1024),
    "depth": (2, 4, 8, 12),
    "seq": (128, 256, 512),
    "precision": ("fp32", "bf16"),
    "idle_ms": (0, 5, 20, 50),
}
CPU_GRID: dict[str, Sequence[Any]] = {
    "model": ("transformer", "mlp"),
    "batch": (2, 4, 8),
    "width": (64, 128, 256),
    "depth": (1, 2, 4),
    "seq": (16, 32, 64),
    "precision": ("fp32", "bf16"),
    "idle_ms": (0, 5),
}
WARMUP_STEPS = 3
MEMORY = "gpu_memory_peak_mib"
UTIL = "gpu_util_pct"
UTIL_SPREAD = "gpu_util_std_pct"
FIELDS = (
    "job",
    *GPU_GRID,
    "steps",
    MEMORY,
    "memory_source",
    "torch_reserved_peak_mib",
    UTIL,
    UTIL_SPREAD,
    "util_samples",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--jobs", type=int, default=48, help="training jobs to run")
    p.add_argument("--parallel", type=int, default=1, help="jobs at a time (>1: no util)")
    p.add_argument("--job-seconds", type=float, default=6.0, help="each job's steps, seconds")
    p.add_argument("--train", type=float, default=0.7, help="share of jobs to train on")
    p.add_argument("--seed", type=int, default=0, help="draws the configurations")
    p.add_argument("--history", type=Path, help="also write the jobs' records here (CSV)")
    p.add_argument("--from-history", type=Path, help="analyse this CSV; run nothing")
    add_harness_args(p, jobs=True)
    args = p.parse_args(argv)
    if args.jobs < 2 or args.parallel < 1 or args.job_seconds <= 0:
        p.error("--jobs must be >= 2, --parallel >= 1, --job-seconds > 0")
    if not 0 < args.train < 1:
        p.error("--train must be in (0, 1)")
    return args


def draw(grid: dict[str, Sequence[Any]], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{key: rng.choice(values) for key, values in grid.items()} for _ in range(n)]


def job_args(config: dict[str, Any], seconds: float) -> list[str]:
    args = [f"--{key.replace('_', '-')}={value}" for key, value in config.items()]
    return [*args, "--seconds", str(seconds), "--report-every", "1000000"]


class HistoryBench(Harness):
    def __init__(self, args: argparse.Namespace, gpu: Gpu) -> None:
        super().__init__(gpu, args.python, WARMUP_STEPS, args.cpu)
        self.args = args
        self.claimed: set[int] = set()  # NVML pids already matched to a job

    async def one(self, index: int, config: dict[str, Any]) -> dict[str, Any]:
        key = f"job-{index:03d}"
        job = await self.launch(key, "guaranteed", job_args(config, self.args.job_seconds))
        await self.finish(job, CONNECT_TIMEOUT_S + 4 * self.args.job_seconds)
        return self.record(key, config, job)

    def record(self, key: str, config: dict[str, Any], job: Job) -> dict[str, Any]:
        summary = job.summary or {}
        row: dict[str, Any] = {"job": key, **config, "steps": summary.get("steps")}
        row["torch_reserved_peak_mib"] = summary.get("max_memory_reserved_mib")
        row[MEMORY], row["memory_source"] = None, "none"
        if self.sampler is not None:
            mem = process_memory(job, self.sampler, self.claimed)
            used = [m for _, m in mem.samples if m is not None]
            if used and mem.how == "exact":  # by order of appearance is unsafe in parallel
                row[MEMORY], row["memory_source"] = max(used), "nvml"
        if row[MEMORY] is None and row["torch_reserved_peak_mib"] is not None:
            row[MEMORY], row["memory_source"] = row["torch_reserved_peak_mib"], "torch"
        if row[MEMORY] is None and self.cpu:
            row[MEMORY], row["memory_source"] = summary.get("max_rss_mib"), "host rss"
        row[UTIL] = row[UTIL_SPREAD] = None
        row["util_samples"] = 0
        if job.oom_steps:  # its peak is the GPU's limit, not what it needs: left out
            row[MEMORY], row["memory_source"] = None, f"none: {job.oom_steps} steps out of memory"
        window = job.solo_window(WARMUP_STEPS)
        alone = self.args.parallel == 1 and not job.oom_steps
        if self.sampler is not None and alone and window is not None:
            util = [s.utilization_pct for s in self.sampler.between(*window)]
            known = [u for u in util if u is not None]
            row["util_samples"] = len(known)
            if len(known) >= 2:
                row[UTIL] = statistics.fmean(known)
                row[UTIL_SPREAD] = statistics.pstdev(known)
        say(
            f"{key}: {config['model']} b{config['batch']} w{config['width']} "
            f"d{config['depth']} {config['precision']}: {fmt(row[MEMORY], 'd')} MiB "
            f"({row['memory_source']}), utilisation {fmt(row[UTIL], '.0f', '%')}"
        )
        return row

    async def run(self) -> list[dict[str, Any]]:
        grid = CPU_GRID if self.cpu else GPU_GRID
        configs = draw(grid, self.args.jobs, self.args.seed)
        gate = asyncio.Semaphore(self.args.parallel)
        rows: list[dict[str, Any]] = []
        failed: list[JobFailed] = []

        async def gated(i: int, config: dict[str, Any]) -> None:
            async with gate:
                if failed:
                    return  # one failed: start no more, let those running end
                try:
                    rows.append(await self.one(i, config))
                except JobFailed as exc:
                    failed.append(exc)

        self.start()
        try:
            await asyncio.gather(*(gated(i, c) for i, c in enumerate(configs)))
        finally:
            await self.close()
            rows.sort(key=lambda r: int(str(r["job"]).rpartition("-")[2]))  # as drawn
            if self.args.history is not None:
                write_history(self.args.history, rows)
        if failed:
            raise JobFailed(f"{failed[0]} ({len(rows)} jobs recorded before)")
        return rows


# ---- the analysis: the estimator on held-out jobs ----------------------------------------


def features_of(row: dict[str, Any]) -> dict[str, float | str]:
    from schedd.estimator.features import features

    labels = {
        "batch_size": str(row["batch"]),
        "width": str(row["width"]),
        "depth": str(row["depth"]),
        "precision": str(row["precision"]),
    }
    if row["model"] == "transformer":
        labels["seq_len"] = str(row["seq"])
    return features(
        user="bench",
        name=str(row["model"]),
        queue="default",
        gpus=1,
        cpus=1.0,
        memory_mib=4096,
        labels=labels,
    )


def scores(predicted: Sequence[float], truth: Sequence[float]) -> dict[str, float]:
    """Memory: relative errors (a peak is never near 0)."""
    pairs = list(zip(predicted, truth, strict=True))
    ratio = [max(p, 1e-9) / max(t, 1e-9) for p, t in pairs]
    return {
        "median_error_pct": 100 * statistics.median(abs(p - t) / max(t, 1e-9) for p, t in pairs),
        "within_1_25x_pct": 100 * sum(1 for r in ratio if 0.8 <= r <= 1.25) / len(pairs),
        "within_2x_pct": 100 * sum(1 for r in ratio if 0.5 <= r <= 2.0) / len(pairs),
        "mean_abs_error": statistics.fmean(abs(p - t) for p, t in pairs),
    }


def point_scores(predicted: Sequence[float], truth: Sequence[float]) -> dict[str, float]:
    """Utilisation, in percentage points: absolute errors (a spread may well be 0)."""
    errors = [abs(p - t) for p, t in zip(predicted, truth, strict=True)]
    return {
        "median_abs_error": statistics.median(errors),
        "within_5_points_pct": 100 * sum(1 for e in errors if e <= 5) / len(errors),
        "within_10_points_pct": 100 * sum(1 for e in errors if e <= 10) / len(errors),
        "mean_abs_error": statistics.fmean(errors),
    }


def accuracy(rows: Sequence[dict[str, Any]], train_share: float) -> dict[str, Any]:
    """Per target: the forest and the two baselines on the jobs after the cut."""
    from schedd.estimator.forest import MIN_JOBS, Estimator, Example

    cut = int(len(rows) * train_share)
    train, test = rows[:cut], rows[cut:]
    estimator = Estimator.train(
        [
            Example(
                features_of(r),
                {t: float(r[t]) for t in (MEMORY, UTIL, UTIL_SPREAD) if r[t] is not None},
            )
            for r in train
        ]
    )
    out: dict[str, Any] = {"train_jobs": len(train), "test_jobs": len(test)}
    for target in (MEMORY, UTIL, UTIL_SPREAD):
        known = [r for r in test if r[target] is not None]
        seen = [r for r in train if r[target] is not None]
        forest = estimator.values(target, [features_of(r) for r in known])
        if forest is None or not known:
            why = f"{len(seen)} training jobs report it, {MIN_JOBS} needed"
            out[target] = {"not_measured": why}
            continue
        by_name: dict[str, list[float]] = defaultdict(list)
        for r in seen:
            by_name[str(r["model"])].append(float(r[target]))
        overall = statistics.median(float(r[target]) for r in seen)
        name_mean = [
            statistics.fmean(by_name[str(r["model"])]) if by_name[str(r["model"])] else overall
            for r in known
        ]
        truth = [float(r[target]) for r in known]
        score = scores if target == MEMORY else point_scores
        out[target] = {
            "jobs": len(known),
            "top_features": list(estimator.models[target].top_features),
            "forest": score(forest, truth),
            "mean of the same name": score(name_mean, truth),
            "median of all": score([overall] * len(known), truth),
        }
    return out


# ---- the history as CSV ----------------------------------------------------------------


def write_history(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k) for k in FIELDS})
    say(f"history written to {path}")


def read_history(path: Path) -> list[dict[str, Any]]:
    numbers = {"batch", "width", "depth", "seq", "idle_ms", "steps", "util_samples"}
    floats = {MEMORY, "torch_reserved_peak_mib", UTIL, UTIL_SPREAD}
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = dict(raw)
            for key in numbers | floats:
                text = raw.get(key) or ""
                convert: Callable[[str], Any] = int if key in numbers else float
                row[key] = convert(text) if text else None
            rows.append(row)
    return rows


# ---- output ----------------------------------------------------------------------------


def show(result: dict[str, Any], args: argparse.Namespace) -> None:
    if "conditions" in result:
        print(describe(result["conditions"]))
    rows = result["jobs"]
    sources = sorted({r["memory_source"] for r in rows})
    print(f"{len(rows)} jobs; memory from: {', '.join(sources)}")
    if "host rss" in sources:
        print("(--cpu: peak host memory stands in for GPU memory; a wiring check only)")
    acc = result["accuracy"]
    print(f"trained on the first {acc['train_jobs']}, tested on the {acc['test_jobs']} after\n")
    for target in (MEMORY, UTIL, UTIL_SPREAD):
        figures = acc[target]
        if "not_measured" in figures:
            print(f"{target}: not measured: {figures['not_measured']}\n")
            continue
        most = ", ".join(figures["top_features"])
        print(f"{target} ({figures['jobs']} jobs; counts most: {most})")
        by = [(who, s) for who, s in figures.items() if isinstance(s, dict)]
        if target == MEMORY:
            header = ["predicted by", "median error", "within 1.25x", "within 2x", "MAE"]
            keys, units = ("median_error_pct", "within_1_25x_pct", "within_2x_pct"), " MiB"
        else:
            header = ["predicted by", "median error", "within 5 points", "within 10", "MAE"]
            keys, units = ("median_abs_error", "within_5_points_pct", "within_10_points_pct"), ""
        lines = [
            [
                who,
                fmt(s[keys[0]], ".1f", "%" if target == MEMORY else " points"),
                fmt(s[keys[1]], ".0f", "%"),
                fmt(s[keys[2]], ".0f", "%"),
                fmt(s["mean_abs_error"], ".1f", units or " points"),
            ]
            for who, s in by
        ]
        print(table(header, lines))
        print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {
        "jobs": args.jobs,
        "parallel": args.parallel,
        "job_seconds": args.job_seconds,
        "train": args.train,
        "seed": args.seed,
        "cpu_wiring_check": args.cpu,
    }
    if args.from_history is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
        rows = read_history(args.from_history)
        settings = {"from_history": str(args.from_history), "train": args.train}
        result = {"settings": settings, "jobs": rows, "accuracy": accuracy(rows, args.train)}
        show(result, args)
        write_json(args.json, result)
        return 0
    torch_info, gpu = prepare(args)
    rows = measure(gpu, HistoryBench(args, gpu).run)
    return report(
        "memory_history",
        args,
        torch_info,
        gpu,
        settings,
        show,
        jobs=rows,
        accuracy=accuracy(rows, args.train),
    )


if __name__ == "__main__":
    sys.exit(main())
