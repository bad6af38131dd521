"""The agent's NVML backend on a real GPU: what it reads, and what a sample costs.

It builds the backend the way agentd does (`agentd.gpu.choose` with gpu_backend =
"nvml"), then, on the GPU --gpu:

1. inventory: each GPU as the agent offers it to schedd (index, UUID, model, memory);
2. idle: --samples samples, each timed (the agent takes one every
   gpu_sample_interval_s, from a worker thread, and sends it only when `changed`);
3. with a job: a real training job (bench/gpu/train_job.py, no shim socket) starts;
   sampling goes on until a new process with memory is listed on the GPU, then
   --samples more: the job's process as the agent reports it, the GPU's utilisation
   and memory, whether `changed` pushes the sample, and the sample's cost with a
   process listed;
4. after: the job is stopped, and sampling goes on until its process is gone;
5. XID events: the agent's watcher registers the GPUs for critical XID events (how
   many it could watch) and stops again.

Then one JSON object with every figure and the conditions.

    .venv/bin/python bench/gpu/nvml_backend.py [--json nvml.json]

Exit status: 0 once the figures are printed; 1 when the job failed or never showed up
on the GPU; 2 when PyTorch, CUDA, NVML or gpusched's modules are missing.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from typing import Any

from _common import (
    CONNECT_TIMEOUT_S,
    Gpu,
    Harness,
    JobFailed,
    add_harness_args,
    describe,
    fmt,
    measure,
    prepare,
    report,
    say,
    table,
    wait_until,
)

JOB_ARGS = "--model transformer --batch 16 --width 1024 --depth 4 --seq 256 --report-every 10"
SAMPLE_GAP_S = 0.25  # between samples in the loops below


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--job-args", default=JOB_ARGS, help="train_job.py flags")
    p.add_argument("--samples", type=int, default=40, help="timed samples, idle and busy")
    add_harness_args(p, gpu="watch", cpu=False)  # no CPU stand-in for this check
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error("--samples must be >= 1")
    args.job = shlex.split(args.job_args)
    return args


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median_ms": None, "max_ms": None}
    return {
        "median_ms": round(1000 * statistics.median(values), 3),
        "max_ms": round(1000 * max(values), 3),
    }


class BackendCheck(Harness):
    def __init__(self, args: argparse.Namespace, gpu: Gpu) -> None:
        super().__init__(gpu, args.python, warmup=0, cpu=False)
        self.args = args

    async def run(self) -> dict[str, Any]:
        self.start()
        try:
            return await self._check()
        finally:
            await self.close()

    async def _check(self) -> dict[str, Any]:
        from agentd import gpu as agent_gpu
        from agentd import gpu_events
        from shared.config import AgentConfig

        backend = agent_gpu.choose(AgentConfig(gpu_backend="nvml"))
        assert isinstance(backend, agent_gpu.NvmlBackend)
        mine = next((g for g in backend.inventory() if g.uuid == self.gpu.uuid), None)
        if mine is None:
            raise JobFailed(f"the agent's inventory has no GPU {self.gpu.uuid}")

        def one() -> tuple[Any, float]:
            t0 = time.perf_counter()
            samples = backend.sample()
            cost = time.perf_counter() - t0
            return next(s for s in samples if s.uuid == mine.uuid), cost

        idle, idle_costs = await self._samples(one, self.args.samples)
        known = {p.pid for s in idle for p in s.processes}
        say(f"idle: {len(idle)} samples; processes already listed: {sorted(known) or 'none'}")

        lifetime = str(4 * CONNECT_TIMEOUT_S)  # it is stopped long before that
        job = await self.launch(
            "nvml-check", "guaranteed", self.args.job, "--seconds", lifetime, socket=False
        )
        appeared = await self._until(one, lambda s: _new(s, known), job)
        if appeared is None:
            await job.stop()
            raise JobFailed(
                "NVML listed no new process with memory on the GPU within "
                f"{CONNECT_TIMEOUT_S:g}s of the job's start"
            )
        seen_after_s = appeared[1]
        say(f"job's process listed {seen_after_s:.1f}s after its start")
        # Listed once its CUDA context exists; its steps start later. The busy samples
        # are taken once it reports steps, so that they see it train.
        await wait_until(lambda: _progress(job) is not None, CONNECT_TIMEOUT_S, job)
        training_after_s = time.monotonic() - job.started
        busy, busy_costs = await self._samples(one, self.args.samples)
        progress = _progress(job)
        pid = _new(appeared[0], known)
        assert pid is not None
        ours = [p for s in busy for p in s.processes if p.pid == pid]
        pushed = agent_gpu.changed(
            {mine.uuid: idle[-1]},
            [appeared[0]],
            AgentConfig().gpu_util_threshold_pct,
            AgentConfig().gpu_memory_threshold_mib,
        )
        await job.stop()
        stopped = time.monotonic()
        gone = await self._until(one, lambda s: pid not in {p.pid for p in s.processes}, None)

        faults: list[Any] = []
        watcher = gpu_events.for_backend(backend, faults.append)
        watched = watcher.start()
        stopped_cleanly = watcher.stop(timeout_s=10)

        return {
            "inventory": [
                {"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
                for g in backend.inventory()
            ],
            "idle": {
                "samples": len(idle),
                "utilization_pct_max": max(s.utilization_pct for s in idle),
                "memory_used_mib_max": max(s.memory_used_mib for s in idle),
                "processes_listed": sorted(known),
                "errors": sorted({s.error for s in idle if s.error}),
                "sample_cost": _ms(idle_costs),
            },
            "with_job": {
                "listed_after_s": round(seen_after_s, 2),
                "training_after_s": round(training_after_s, 2),
                "job_steps_per_s": None if progress is None else progress.get("steps_per_s"),
                "nvml_pid": pid,
                "pid_is_the_jobs": pid == job.pid,
                "job_memory_mib_max": max((p.memory_used_mib for p in ours), default=None),
                "listed_in_samples": f"{len(ours)}/{len(busy)}",
                "utilization_pct_median": statistics.median(s.utilization_pct for s in busy),
                "memory_used_mib_max": max(s.memory_used_mib for s in busy),
                "changed_pushes_it": pushed,
                "errors": sorted({s.error for s in busy if s.error}),
                "sample_cost": _ms(busy_costs),
            },
            "after_stop": {
                "gone_after_s": None if gone is None else round(time.monotonic() - stopped, 2),
            },
            "xid_watcher": {
                "gpus_watched": watched,
                "of": len(backend.inventory()),
                "stopped": stopped_cleanly,
                "faults": [f.error for f in faults],
            },
        }

    async def _samples(self, one: Any, n: int) -> tuple[list[Any], list[float]]:
        samples, costs = [], []
        for _ in range(n):
            sample, cost = await asyncio.to_thread(one)
            samples.append(sample)
            costs.append(cost)
            await asyncio.sleep(SAMPLE_GAP_S)
        return samples, costs

    async def _until(self, one: Any, condition: Any, job: Any) -> tuple[Any, float] | None:
        """The first sample meeting `condition` and when, or None after the connect
        timeout; JobFailed if `job` ends first."""
        start = time.monotonic()
        while time.monotonic() - start < CONNECT_TIMEOUT_S:
            sample, _ = await asyncio.to_thread(one)
            if condition(sample):
                return sample, time.monotonic() - start
            if job is not None and job.proc is not None and job.proc.returncode is not None:
                await job.wait()
                raise job.failure("it ended before NVML listed it")
            await asyncio.sleep(SAMPLE_GAP_S)
        return None


def _progress(job: Any) -> dict[str, Any] | None:
    """The job's latest progress line: it has run --report-every steps."""
    found = [e for e in job.events if e.get("event") == "progress"]
    return found[-1] if found else None


def _new(sample: Any, known: set[int]) -> int | None:
    """A process on the GPU, with memory, that was not there while it was idle."""
    fresh = [p.pid for p in sample.processes if p.pid not in known and p.memory_used_mib > 0]
    return fresh[0] if fresh else None


def show(result: dict[str, Any], args: argparse.Namespace) -> None:
    c, r = result["conditions"], result["figures"]
    print(describe(c))
    print(
        table(
            ["index", "uuid", "model", "MiB"], [list(map(str, g.values())) for g in r["inventory"]]
        )
    )
    i, w, x = r["idle"], r["with_job"], r["xid_watcher"]
    rows = [
        [
            "sample cost, median / max ms",
            f"{fmt(i['sample_cost']['median_ms'])} / {fmt(i['sample_cost']['max_ms'])}",
            f"{fmt(w['sample_cost']['median_ms'])} / {fmt(w['sample_cost']['max_ms'])}",
        ],
        [
            "utilisation %",
            f"max {i['utilization_pct_max']}",
            f"median {w['utilization_pct_median']}",
        ],
        ["GPU memory used, max MiB", str(i["memory_used_mib_max"]), str(w["memory_used_mib_max"])],
        ["job's process: pid / same as the job's", "", f"{w['nvml_pid']} / {w['pid_is_the_jobs']}"],
        ["job's process memory, max MiB", "", fmt(w["job_memory_mib_max"], "d")],
        ["job listed in samples", "", w["listed_in_samples"]],
        ["listed after the job's start, s", "", fmt(w["listed_after_s"])],
        ["training after the job's start, s", "", fmt(w["training_after_s"])],
        ["job's steps/s while sampled", "", fmt(w["job_steps_per_s"])],
        ["`changed` pushes the sample", "", str(w["changed_pushes_it"])],
        ["errors", ", ".join(i["errors"]) or "none", ", ".join(w["errors"]) or "none"],
    ]
    print()
    print(table(["", "idle", "with the job"], rows))
    gone = r["after_stop"]["gone_after_s"]
    print(f"\njob's process gone from the samples {fmt(gone)}s after the stop")
    print(
        f"XID watcher: {x['gpus_watched']} of {x['of']} GPUs watched, stopped {x['stopped']}, "
        f"faults {x['faults'] or 'none'}"
    )
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch_info, gpu = prepare(args)
    figures = measure(gpu, BackendCheck(args, gpu).run)
    settings = {"job_args": args.job_args, "samples": args.samples}
    return report("nvml_backend", args, torch_info, gpu, settings, show, figures=figures)


if __name__ == "__main__":
    sys.exit(main())
