"""Ask a memory cap of a job that would use more; what NVML then sees against the cap.

One training job (bench/gpu/train_job.py, kind opportunistic) alone on the GPU, served
by a real `ShimServer` (agentd/shim_server.py) from this process, in two cases:

1. capped while running: the job runs uncapped for --warm-steps steps, which shows its
   peak (PyTorch's max_memory_reserved, from its step reports). Then the cap is asked
   with `set_limits`: --cap-mib, or --cap-fraction of that peak rounded down to 64 MiB.
   The shim applies it at its next step boundary (the allocator's memory fraction, then
   `empty_cache`) and answers `cap_applied` (met or not). As the job needed more than
   the cap, the shim spills the tensors autograd saves to pinned host memory from then
   on. The job runs --capped-seconds more.
2. capped from the start: the same cap is asked before the job connects, so it holds
   from the first step. The shim has not yet seen the job's peak, so it does not spill:
   a job that needs more than the cap runs out of memory at each step (the job counts
   these and exits with status 3 after --max-oom of them).

For each case it reports the peak uncapped, the cap asked, what the shim said
(`cap_applied` met and reserved; steps whose `cap_met` was false; spilling), the most
memory NVML says the job's process used before and after the cap, how far that is over
the cap and how much of it PyTorch's allocator does not see (the CUDA context, library
workspaces, which no cap counts), steps/s before and after (the price of spilling), and
the steps that ran out of memory. Then one JSON object with the conditions.

    .venv/bin/python bench/gpu/memory_cap.py [--cap-fraction 0.5] [--json cap.json]

Figures only: the exit status is 0 whatever they are; 1 when a job failed in a way the
case does not expect, 2 when PyTorch, CUDA, NVML or gpusched's modules are missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import sys
import time
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
    outside_allocator,
    prepare,
    process_memory,
    report,
    say,
    table,
    wait_until,
)

JOB_ARGS = "--model transformer --batch 16 --width 1024 --depth 8 --seq 1024"
CAP_STEP_MIB = 64
EXIT_OOM = 3  # train_job.py: too many steps ran out of memory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--job-args", default=JOB_ARGS, help="train_job.py flags")
    p.add_argument("--warm-steps", type=int, default=30, help="uncapped steps first (case 1)")
    p.add_argument("--cap-mib", type=int, help="the cap; default: --cap-fraction of the peak")
    p.add_argument("--cap-fraction", type=float, default=0.5, help="of the uncapped peak")
    p.add_argument("--capped-seconds", type=float, default=30.0, help="each case, once capped")
    p.add_argument("--max-oom", type=int, default=5, help="out-of-memory steps before exit 3")
    p.add_argument("--case", choices=("both", "running", "start"), default="both")
    add_harness_args(p)
    args = p.parse_args(argv)
    if args.warm_steps < 2 or args.capped_seconds <= 0 or args.max_oom < 0:
        p.error("--warm-steps must be >= 2, --capped-seconds > 0, --max-oom >= 0")
    if args.cap_mib is not None and args.cap_mib < 0:
        p.error("--cap-mib must be >= 0")
    if not 0 < args.cap_fraction < 1:
        p.error("--cap-fraction must be in (0, 1)")
    if args.case == "start" and args.cap_mib is None:
        p.error("--case start needs --cap-mib: there is no uncapped run to size the cap from")
    args.job = [*shlex.split(args.job_args), "--max-oom", str(args.max_oom)]
    return args


class CapBench(Harness):
    def __init__(self, args: argparse.Namespace, gpu: Gpu) -> None:
        super().__init__(gpu, args.python, min(10, args.warm_steps - 1), args.cpu)
        self.args = args
        self.claimed: set[int] = set()  # NVML pids already matched to a job

    def cap_for(self, peak_mib: int | None) -> int:
        if self.args.cap_mib is not None:
            return int(self.args.cap_mib)
        if peak_mib is None:  # no CUDA (--cpu): any cap will do, there is nothing to cap
            return 1024
        cap = int(peak_mib * self.args.cap_fraction)
        return cap - cap % CAP_STEP_MIB

    async def capped_while_running(self) -> dict[str, Any]:
        a = self.args
        lifetime = str(a.capped_seconds + 4 * CONNECT_TIMEOUT_S)  # it is stopped before that
        job = await self.launch("cap-running", "opportunistic", a.job, "--seconds", lifetime)
        await wait_until(lambda: len(job.steps) >= a.warm_steps, 2 * CONNECT_TIMEOUT_S, job)
        peak = job.peak_mib()
        cap = self.cap_for(peak)
        asked = time.monotonic()
        self.server.set_limits(job.key, memory_cap_mib=cap)
        say(f"capped while running: peak {fmt(peak, 'd')} MiB uncapped, cap {cap} MiB asked")
        await self._run_capped(job, cap)
        return self.figures(job, "capped while running", cap, asked, peak)

    async def capped_from_start(self, cap: int) -> dict[str, Any]:
        a = self.args
        key = "cap-start"
        await self.server.open_job(key)
        self.server.set_limits(key, memory_cap_mib=cap)  # held until its shim connects
        asked = time.monotonic()
        lifetime = str(a.capped_seconds + 4 * CONNECT_TIMEOUT_S)
        job = await self.launch(key, "opportunistic", a.job, "--seconds", lifetime)
        say(f"capped from the start: cap {cap} MiB asked before the job connected")
        await self._run_capped(job, cap)
        return self.figures(job, "capped from the start", cap, asked, None)

    async def _run_capped(self, job: Job, cap: int) -> None:
        """From the shim's `cap_applied` on, --capped-seconds, or until the job ends."""

        def acked() -> bool:
            return any(ack.cap_mib == cap for ack in job.caps)

        deadline = time.monotonic() + 2 * CONNECT_TIMEOUT_S
        while not acked() and job.proc is not None and job.proc.returncode is None:
            if time.monotonic() > deadline:
                raise JobFailed(f"job {job.key}'s shim never said it applied the cap")
            await asyncio.sleep(0.05)
        assert job.proc is not None
        with contextlib.suppress(TimeoutError):  # ending by itself is an outcome too (OOM)
            await asyncio.wait_for(job.proc.wait(), self.args.capped_seconds)
        await job.stop()
        await self.server.close_job(job.key)
        code = job.proc.returncode if job.proc is not None else None
        if code is not None and code > 0 and code != EXIT_OOM:  # < 0: the stop's signal
            raise job.failure("it failed")

    def figures(
        self, job: Job, case: str, cap: int, asked: float, peak: int | None
    ) -> dict[str, Any]:
        acks = [ack for ack in job.caps if ack.cap_mib == cap]
        applied = acks[0].t if acks else None
        end = job.ended if job.ended is not None else time.monotonic()
        before = [s for s in job.steps if s.t <= asked and s.step > self.warmup]
        after = [s for s in job.steps if applied is not None and s.t > applied]
        nvml: dict[str, Any] | None = None
        if self.sampler is not None:
            mem = process_memory(job, self.sampler, self.claimed)
            used_before = [m for t, m in mem.samples if t <= asked and m is not None]
            used_after = [
                m for t, m in mem.samples if applied is not None and t > applied and m is not None
            ]
            most = max(used_after) if used_after else None
            nvml = {
                "pid_match": mem.how,
                "used_max_before_mib": max(used_before) if used_before else None,
                "used_max_after_mib": most,
                "over_cap_mib": None if most is None else most - cap,
                "outside_allocator_mib": outside_allocator(job, mem.samples, applied),
                "samples": len(mem.samples),
            }
        summary = job.summary or {}
        return {
            "case": case,
            "peak_uncapped_mib": peak,
            "cap_asked_mib": cap,
            "cap_applied": None
            if not acks
            else {
                "after_s": round(acks[0].t - asked, 3),
                "met": acks[0].met,
                "reserved_mib": acks[0].reserved_mib,
                "spilling": acks[0].spilling,
            },
            "steps_before": len(before),
            "steps_after": len(after),
            "steps_per_s_before": _rate(before),
            "steps_per_s_after": _rate(after),
            "reserved_max_after_mib": max(
                (s.reserved_mib for s in after if s.reserved_mib is not None), default=None
            ),
            "steps_cap_not_met": sum(1 for s in after if s.cap_met is False),
            "steps_spilling": sum(1 for s in after if s.spilling),
            "oom_steps": job.oom_steps,
            "exit_status": None if job.proc is None else job.proc.returncode,
            "stopped_by": summary.get("stopped_by"),
            "ran_s": round(end - job.started, 1),
            "nvml": nvml,
        }

    async def run(self) -> list[dict[str, Any]]:
        self.start()
        cases = []
        try:
            if self.args.case in ("both", "running"):
                cases.append(await self.capped_while_running())
            if self.args.case in ("both", "start"):
                cap = cases[0]["cap_asked_mib"] if cases else self.args.cap_mib
                cases.append(await self.capped_from_start(cap))
        finally:
            await self.close()
        return cases


def _rate(steps: list[Any]) -> float | None:
    if len(steps) < 2 or steps[-1].t <= steps[0].t:
        return None
    return (len(steps) - 1) / (steps[-1].t - steps[0].t)


def show(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(describe(result["conditions"]))
    print(f"job: {args.job_args}\n")
    cases = result["cases"]
    rows: list[list[str]] = []

    def row(label: str, get: Any) -> None:
        rows.append([label, *(str(get(case)) for case in cases)])

    def nv(case: dict[str, Any], key: str) -> str:
        return "n/a" if case["nvml"] is None else fmt(case["nvml"][key], "d")

    def ack(case: dict[str, Any], key: str) -> Any:
        return "none" if case["cap_applied"] is None else case["cap_applied"][key]

    row("peak reserved uncapped (PyTorch), MiB", lambda x: fmt(x["peak_uncapped_mib"], "d"))
    row("cap asked, MiB", lambda x: x["cap_asked_mib"])
    row("cap_applied: met", lambda x: ack(x, "met"))
    row("cap_applied: reserved, MiB", lambda x: ack(x, "reserved_mib"))
    row("cap_applied: spilling", lambda x: ack(x, "spilling"))
    row("NVML used, max before the cap, MiB", lambda x: nv(x, "used_max_before_mib"))
    row("NVML used, max once capped, MiB", lambda x: nv(x, "used_max_after_mib"))
    row("  NVML over the cap, MiB", lambda x: nv(x, "over_cap_mib"))
    row("  NVML less reserved (not capped), MiB", lambda x: nv(x, "outside_allocator_mib"))
    row("  NVML pid", lambda x: "n/a" if x["nvml"] is None else x["nvml"]["pid_match"])
    row("reserved max once capped, MiB", lambda x: fmt(x["reserved_max_after_mib"], "d"))
    row(
        "steps once capped / over the cap",
        lambda x: f"{x['steps_after']} / {x['steps_cap_not_met']}",
    )
    row("steps spilling", lambda x: x["steps_spilling"])
    row(
        "steps/s before / once capped",
        lambda x: f"{fmt(x['steps_per_s_before'], '.2f')} / {fmt(x['steps_per_s_after'], '.2f')}",
    )
    row("steps out of memory", lambda x: x["oom_steps"])
    row("job's exit status (stopped by)", lambda x: f"{x['exit_status']} ({x['stopped_by']})")
    print(table(["", *(case["case"] for case in cases)], rows))
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch_info, gpu = prepare(args)
    cases = measure(gpu, CapBench(args, gpu).run)
    settings = {
        "job_args": args.job_args,
        "warm_steps": args.warm_steps,
        "cap_fraction": args.cap_fraction,
        "cap_mib": args.cap_mib,
        "capped_seconds": args.capped_seconds,
        "max_oom": args.max_oom,
        "cpu_wiring_check": args.cpu,
    }
    return report("memory_cap", args, torch_info, gpu, settings, show, cases=cases)


if __name__ == "__main__":
    sys.exit(main())
