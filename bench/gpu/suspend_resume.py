"""What a time-slicing switch costs: a job suspended with its GPU memory freed, then resumed.

Gandiva's time-slicing (the `gandiva` profile) suspends a job at a step boundary, frees
the GPU memory PyTorch caches, and resumes it at its next turn. This measures that on
one training job (bench/gpu/train_job.py, kind guaranteed) served by a real
`ShimServer` (agentd/shim_server.py) from this process. After --warm-steps steps, each
of --cycles cycles:

1. suspend (free_memory), as the agent asks it: the time until the shim says
   `suspended` (the step under way finishes first), and what it freed (its figure);
2. --pause-seconds suspended: what NVML says the job's process holds meanwhile, against
   what it held while running (its tensors stay on the GPU: only the cache goes);
3. resume: the time until the shim says `resumed`, until the first step after it is
   reported, and how much longer that step took than the job's median step (the
   allocator takes its memory back);
4. --between-steps steps before the next cycle.

Then the medians over the cycles, and one JSON object with every figure and the
conditions.

    .venv/bin/python bench/gpu/suspend_resume.py [--cycles 5] [--json switch.json]

Figures only: the exit status is 0 whatever they are; 1 when the job failed, 2 when
PyTorch, CUDA, NVML or gpusched's modules are missing. `--cpu` runs the job on the CPU
to check the wiring; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from typing import Any

from _common import (
    CONNECT_TIMEOUT_S,
    Gpu,
    Harness,
    Job,
    add_harness_args,
    describe,
    fmt,
    measure,
    prepare,
    process_memory,
    report,
    say,
    table,
    wait_until,
)

JOB_ARGS = "--model transformer --batch 16 --width 1024 --depth 8 --seq 1024"
KEY = "switch"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--job-args", default=JOB_ARGS, help="train_job.py flags")
    p.add_argument("--warm-steps", type=int, default=20, help="steps before the first cycle")
    p.add_argument("--cycles", type=int, default=5, help="suspend/resume cycles")
    p.add_argument("--pause-seconds", type=float, default=2.0, help="suspended, each cycle")
    p.add_argument("--between-steps", type=int, default=10, help="steps between cycles")
    add_harness_args(p)
    args = p.parse_args(argv)
    if args.warm_steps < 2 or args.cycles < 1 or args.between_steps < 1:
        p.error("--warm-steps must be >= 2, --cycles and --between-steps >= 1")
    if args.pause_seconds <= 0:
        p.error("--pause-seconds must be > 0")
    args.job = shlex.split(args.job_args)
    return args


class SwitchBench(Harness):
    def __init__(self, args: argparse.Namespace, gpu: Gpu) -> None:
        super().__init__(gpu, args.python, min(10, args.warm_steps - 1), args.cpu)
        self.args = args
        self.freed: list[tuple[float, int | None]] = []  # (when, MiB) of each `suspended`

    def after_event(self, key: str, msg: Any, now: float) -> None:
        if type(msg).__name__ == "Suspended":
            self.freed.append((now, msg.freed_mib))

    async def run(self) -> dict[str, Any]:
        self.start()
        try:
            return await self._cycles()
        finally:
            await self.close()

    async def _cycles(self) -> dict[str, Any]:
        a = self.args
        lifetime = str(4 * CONNECT_TIMEOUT_S + a.cycles * (a.pause_seconds + 60))
        job = await self.launch(KEY, "guaranteed", a.job, "--seconds", lifetime)
        await wait_until(lambda: len(job.steps) >= a.warm_steps, 2 * CONNECT_TIMEOUT_S, job)
        cycles: list[dict[str, Any]] = []
        for n in range(a.cycles):
            running_from = job.steps[-min(len(job.steps), a.between_steps)].t
            asked = time.monotonic()
            self.server.suspend(KEY, free_memory=True)
            await wait_until(lambda n=n: len(self.freed) > n, CONNECT_TIMEOUT_S, job)
            suspended, freed_mib = self.freed[n]
            resume_at = time.monotonic() + a.pause_seconds
            await wait_until(lambda t=resume_at: time.monotonic() >= t, a.pause_seconds + 5, job)
            steps_before = len(job.steps)
            resumed = time.monotonic()
            self.server.resume(KEY)
            await wait_until(lambda k=steps_before: len(job.steps) > k, CONNECT_TIMEOUT_S, job)
            first = job.steps[steps_before]
            woke = next((t for t, what in job.pauses if what == "resumed" and t >= resumed), None)
            cycles.append(
                {
                    "running_from": running_from,
                    "asked": asked,
                    "suspended": suspended,
                    "resumed": resumed,
                    "woke": woke,
                    "first_step_at": first.t,
                    "first_step_wall_s": first.wall_s,
                    "freed_mib": freed_mib,
                }
            )
            say(
                f"cycle {n + 1}/{a.cycles}: suspended {1000 * (suspended - asked):.0f} ms after"
                f" asking, freed {fmt(freed_mib, 'd')} MiB; first step"
                f" {1000 * (first.t - resumed):.0f} ms after resuming"
            )
            target = len(job.steps) + a.between_steps
            await wait_until(lambda k=target: len(job.steps) >= k, CONNECT_TIMEOUT_S, job)
        await job.stop()
        await self.server.close_job(KEY)
        return self.figures(job, cycles)

    def figures(self, job: Job, cycles: list[dict[str, Any]]) -> dict[str, Any]:
        paused = [(c["suspended"], c["resumed"]) for c in cycles]
        steady = [
            s.wall_s
            for s in job.steps
            if s.step > self.warmup and not any(a <= s.t <= b + 1.0 for a, b in paused)
        ]
        median_s = statistics.median(steady) if steady else None
        memory = None
        if self.sampler is not None:
            mem = process_memory(job, self.sampler, set())
            memory = {"pid_match": mem.how, "cycles": []}
            for c in cycles:
                held = [m for t, m in mem.samples if c["running_from"] <= t <= c["asked"] and m]
                during = [m for t, m in mem.samples if c["suspended"] < t < c["resumed"] and m]
                memory["cycles"].append(
                    {
                        "running_max_mib": max(held, default=None),
                        "suspended_max_mib": max(during, default=None),
                    }
                )
        rows = []
        for i, c in enumerate(cycles):
            nvml = memory["cycles"][i] if memory is not None else {}
            rows.append(
                {
                    "suspend_ms": round(1000 * (c["suspended"] - c["asked"]), 1),
                    "freed_mib": c["freed_mib"],
                    "nvml_running_max_mib": nvml.get("running_max_mib"),
                    "nvml_suspended_max_mib": nvml.get("suspended_max_mib"),
                    "resumed_ms": None
                    if c["woke"] is None
                    else round(1000 * (c["woke"] - c["resumed"]), 1),
                    "resume_to_first_step_ms": round(1000 * (c["first_step_at"] - c["resumed"]), 1),
                    "first_step_extra_ms": None
                    if median_s is None
                    else round(1000 * (c["first_step_wall_s"] - median_s), 1),
                }
            )
        return {
            "median_step_ms": None if median_s is None else round(1000 * median_s, 2),
            "cycles": rows,
            "medians": {k: _median([r[k] for r in rows]) for k in rows[0]},
            "pid_match": None if memory is None else memory["pid_match"],
            "exit_status": None if job.proc is None else job.proc.returncode,
        }


def _median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def _mib(value: float | None) -> str:
    return fmt(value, ",.0f")


def show(result: dict[str, Any], args: argparse.Namespace) -> None:
    f = result["figures"]
    print(describe(result["conditions"]))
    print(f"job: {args.job_args}; its median step {fmt(f['median_step_ms'])} ms\n")
    heads = [
        "cycle",
        "suspended after, ms",
        "freed, MiB",
        "NVML running / suspended, MiB",
        "resumed after, ms",
        "first step after resume, ms",
        "its extra, ms",
    ]
    rows = [
        [
            label,
            fmt(r["suspend_ms"]),
            _mib(r["freed_mib"]),
            f"{_mib(r['nvml_running_max_mib'])} / {_mib(r['nvml_suspended_max_mib'])}",
            fmt(r["resumed_ms"]),
            fmt(r["resume_to_first_step_ms"]),
            fmt(r["first_step_extra_ms"]),
        ]
        for label, r in [
            *((str(i + 1), r) for i, r in enumerate(f["cycles"])),
            ("median", f["medians"]),
        ]
    ]
    print(table(heads, rows))
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch_info, gpu = prepare(args)
    figures = measure(gpu, SwitchBench(args, gpu).run)
    settings = {
        "job_args": args.job_args,
        "warm_steps": args.warm_steps,
        "cycles": args.cycles,
        "pause_seconds": args.pause_seconds,
        "between_steps": args.between_steps,
        "cpu_wiring_check": args.cpu,
    }
    return report("suspend_resume", args, torch_info, gpu, settings, show, figures=figures)


if __name__ == "__main__":
    sys.exit(main())
