"""A guaranteed training job alone, then with an opportunistic one under the coordinator.

Runs in one process tree, without schedd or agentd: this process holds a real
`ShimServer` (agentd/shim_server.py) on a fresh socket directory and a real
`GpuCoordinator` (agentd/coordinator.py) for the GPU, and starts real PyTorch jobs
(bench/gpu/train_job.py) with GPUSCHED_SHIM_SOCKET and GPUSCHED_JOB_KIND set, as the
agent would. Phases, one after the other on one GPU:

1. overhead: the guaranteed job's flags, --overhead-steps steps, three ways: no shim
   at all, the shim without a socket, the shim with a socket; --overhead-repeats times.
2. guaranteed solo, --solo-seconds: its solo throughput.
3. opportunistic solo, --solo-seconds: its solo throughput.
4. together, --seconds: the guaranteed job starts; once it runs, the opportunistic job
   starts. The coordinator is fed as the agent would feed it: `job_joined` when a job is
   started (the guaranteed job's solo peak as its expected memory), `step` for each step
   report; each decision goes to the job's shim with `ShimServer.set_limits`. Figures are
   taken over the steady part, from --steady-from of the way in to the end.

It reports the guaranteed job's slowdown (its steps/s alone over its steps/s together),
the opportunistic job's steps/s together as a share of its steps/s alone, the shares
the coordinator set over time, the memory cap asked for the opportunistic job against
what NVML says its process used, and the shim's overhead per step. Then one JSON object
with all of it and the conditions (GPU model, driver, PyTorch, date).

    .venv/bin/pip install torch       # a CUDA build
    .venv/bin/python bench/gpu/coordinated_pair.py --seconds 120 [--json pair.json]

Targets (the issue's): guaranteed slowdown at most 5 %, opportunistic at least 30 % of
its solo throughput, beside a guaranteed job that leaves the GPU partly idle (here a
host-side sleep in each step, --idle-ms in its flags). Figures only: the exit status is
0 whether or not a target is met; 1 when a job failed, 2 when PyTorch, CUDA, NVML or
gpusched's modules are missing. `--cpu` runs the jobs on the CPU to check the wiring on
a machine without a GPU; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _common import (
    CONNECT_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Gpu,
    Harness,
    Job,
    JobFailed,
    Unavailable,
    add_harness_args,
    describe,
    fmt,
    measure,
    outside_allocator,
    pct,
    prepare,
    process_memory,
    report,
    say,
    table,
    time_weighted_mean,
    wait_until,
)

GUARANTEED_ARGS = "--model transformer --batch 16 --width 1024 --depth 4 --seq 256 --idle-ms 30"
OPPORTUNISTIC_ARGS = "--model transformer --batch 16 --width 1024 --depth 4 --seq 256"
TARGET_SLOWDOWN = 0.05
TARGET_OT_SHARE = 0.30
G_KEY, O_KEY = "g-pair", "o-pair"  # the jobs' shim keys in the together phase


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=120.0, help="the together phase")
    p.add_argument("--solo-seconds", type=float, default=30.0, help="each solo phase")
    p.add_argument(
        "--steady-from",
        type=float,
        default=0.5,
        help="together figures are taken from this fraction of --seconds to the end",
    )
    p.add_argument("--guaranteed-args", default=GUARANTEED_ARGS, help="train_job.py flags")
    p.add_argument("--opportunistic-args", default=OPPORTUNISTIC_ARGS, help="train_job.py flags")
    p.add_argument("--warmup", type=int, default=20, help="steps left out at each job's start")
    p.add_argument("--overhead-steps", type=int, default=200, help="per run; 0 skips phase 1")
    p.add_argument("--overhead-repeats", type=int, default=2)
    p.add_argument("--slowdown", type=float, default=0.05, help="CoordinatorSettings.slowdown")
    p.add_argument("--decrease", type=float, default=0.5, help="CoordinatorSettings.decrease")
    p.add_argument("--increase", type=int, default=5, help="CoordinatorSettings.increase")
    p.add_argument("--window", type=int, default=20, help="CoordinatorSettings.window")
    p.add_argument("--solo-samples", type=int, default=50, help="CoordinatorSettings.solo_samples")
    add_harness_args(p, jobs=True)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.solo_seconds <= 0:
        p.error("--seconds and --solo-seconds must be positive")
    if not 0 <= args.steady_from < 1:
        p.error("--steady-from must be in [0, 1)")
    if args.warmup < 0 or args.overhead_steps < 0 or args.overhead_repeats < 1:
        p.error("--warmup and --overhead-steps must be >= 0, --overhead-repeats >= 1")
    args.g_args = shlex.split(args.guaranteed_args)
    args.o_args = shlex.split(args.opportunistic_args)
    return args


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass
class Solo:
    job: Job
    window: tuple[float, float]

    @property
    def rate(self) -> float | None:
        return self.job.rate(*self.window)

    @property
    def wall_s(self) -> float | None:
        return median([s.wall_s for s in self.job.steps_between(*self.window)])

    @property
    def wall_mean_s(self) -> float | None:
        return _mean([s.wall_s for s in self.job.steps_between(*self.window)])


@dataclass
class Together:
    g: Job
    o: Job
    start: float  # the opportunistic job was started
    end: float
    steady: float  # figures from here to the end
    decisions: list[Any]  # the coordinator's, for the opportunistic job, while both ran
    learned: list[tuple[float, float]]  # (when, solo step time) each time it was learned
    final_solo_s: float | None


class Bench(Harness):
    def __init__(self, args: argparse.Namespace, gpu: Gpu, settings: Any) -> None:
        super().__init__(gpu, args.python, args.warmup, args.cpu)
        self.args, self.settings = args, settings
        self.coordinator: Any = None
        self.decisions: list[Any] = []
        self.learned: list[tuple[float, float]] = []

    # ---- the agent's part: step reports in, decisions out ----

    def after_event(self, key: str, msg: Any, now: float) -> None:
        c = self.coordinator
        if c is not None and type(msg).__name__ == "Step":
            unknown = c.solo_step_s is None
            self.apply(c.step(key, msg.wall_s, msg.mem_peak_mib, now))
            if unknown and c.solo_step_s is not None:
                self.learned.append((now, c.solo_step_s))

    def apply(self, decisions: list[Any]) -> None:
        for d in decisions:
            self.decisions.append(d)
            if self.server.is_open(d.job_key):
                self.server.set_limits(d.job_key, share=d.share, memory_cap_mib=d.memory_cap_mib)

    # ---- phases ----

    async def overhead(self) -> dict[str, list[dict[str, Any]]]:
        a = self.args
        variants: list[tuple[str, list[str], bool]] = [
            ("off", ["--no-shim"], False),
            ("no-socket", [], False),
            ("socket", [], True),
        ]
        found: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
        steps = a.overhead_steps + a.warmup
        for r in range(a.overhead_repeats):
            for name, flags, socket in variants:
                key = f"overhead-{name}-{r}"
                job = await self.launch(
                    key, "guaranteed", a.g_args, "--steps", str(steps), *flags, socket=socket
                )
                await self.finish(job, 3600)
                summary = job.summary or {}
                found[name].append(summary)
                say(
                    f"overhead {r + 1}/{a.overhead_repeats}, shim {name}: median step "
                    f"{fmt(summary.get('step_ms_median'), '.3f')} ms"
                )
        return found

    async def solo(self, key: str, kind: str, job_args: list[str]) -> Solo:
        seconds = self.args.solo_seconds
        job = await self.launch(key, kind, job_args, "--seconds", str(seconds))
        await self.finish(job, seconds + CONNECT_TIMEOUT_S + STOP_TIMEOUT_S)
        window = job.solo_window(self.args.warmup)
        if window is None:
            raise JobFailed(
                f"job {key} reported fewer than {self.args.warmup + 2} steps in "
                f"{seconds:g}s: give it more --solo-seconds"
            )
        solo = Solo(job, window)
        say(f"{kind} alone: {fmt(solo.rate, '.2f')} steps/s")
        return solo

    async def together(self, g_solo: Solo) -> Together:
        from agentd.coordinator import GpuCoordinator

        a = self.args
        c = GpuCoordinator(self.gpu.uuid, self.gpu.total_mib, self.settings)
        self.coordinator = c
        lifetime = str(a.seconds + 2 * CONNECT_TIMEOUT_S)  # it is stopped before that
        g = o = None
        try:
            self.apply(
                c.job_joined(
                    G_KEY, "guaranteed", time.monotonic(), expected_peak_mib=g_solo.job.peak_mib()
                )
            )
            g = await self.launch(G_KEY, "guaranteed", a.g_args, "--seconds", lifetime)
            await wait_until(lambda: len(g.steps) >= a.warmup, CONNECT_TIMEOUT_S, g)
            await self.server.open_job(O_KEY)  # so that what the coordinator asks is held for it
            self.apply(c.job_joined(O_KEY, "opportunistic", time.monotonic()))
            o = await self.launch(O_KEY, "opportunistic", a.o_args, "--seconds", lifetime)
            start = time.monotonic()
            end = start + a.seconds
            next_note = start + min(10.0, a.seconds / 4)
            while (now := time.monotonic()) < end:
                for job in (g, o):
                    if job.proc is not None and job.proc.returncode is not None:
                        await job.wait()
                        raise job.failure("it ended during the together phase")
                if now >= next_note:
                    share = self.decisions[-1].share if self.decisions else None
                    say(
                        f"together {now - start:.0f}/{a.seconds:g}s: share {share}, "
                        f"guaranteed {fmt(g.rate(now - 10, now), '.2f')} steps/s, "
                        f"opportunistic {fmt(o.rate(now - 10, now), '.2f')} steps/s"
                    )
                    next_note = now + 10.0
                await asyncio.sleep(min(0.5, end - now))
            decisions = [d for d in self.decisions if d.job_key == O_KEY]
            final_solo = c.solo_step_s
        finally:
            await asyncio.gather(*(j.stop() for j in (g, o) if j is not None))
            self.coordinator = None
            for key in (O_KEY, G_KEY):  # as the agent would; nothing is left to steer
                c.job_left(key, time.monotonic())
            for key in (G_KEY, O_KEY):
                await self.server.close_job(key)
        return Together(
            g,
            o,
            start,
            end,
            start + a.steady_from * a.seconds,
            decisions,
            list(self.learned),
            final_solo,
        )

    async def run(self) -> dict[str, Any]:
        a = self.args
        self.start()
        try:
            overhead = await self.overhead() if a.overhead_steps else None
            g_solo = await self.solo("g-solo", "guaranteed", a.g_args)
            o_solo = await self.solo("o-solo", "opportunistic", a.o_args)
            pair = await self.together(g_solo)
        finally:
            await self.close()
        return self.figures(overhead, g_solo, o_solo, pair)

    # ---- figures ----

    def figures(
        self,
        overhead: dict[str, list[dict[str, Any]]] | None,
        g_solo: Solo,
        o_solo: Solo,
        pair: Together,
    ) -> dict[str, Any]:
        g, o = pair.g, pair.o
        figures: dict[str, Any] = {}
        for part, since in (("steady", pair.steady), ("whole", pair.start)):
            g_rate, o_rate = g.rate(since, pair.end), o.rate(since, pair.end)
            g_walls = [s.wall_s for s in g.steps_between(since, pair.end)]
            figures[part] = {
                "from_s": round(since - pair.start, 1),
                "to_s": round(pair.end - pair.start, 1),
                "guaranteed_steps_per_s": g_rate,
                "guaranteed_slowdown": _ratio(g_solo.rate, g_rate, minus_one=True),
                "guaranteed_wall_slowdown": _ratio(median(g_walls), g_solo.wall_s, minus_one=True),
                "guaranteed_wall_mean_slowdown": _ratio(
                    _mean(g_walls), g_solo.wall_mean_s, minus_one=True
                ),
                "opportunistic_steps_per_s": o_rate,
                "opportunistic_share_of_solo": _ratio(o_rate, o_solo.rate),
                "mean_share": self._mean_share(pair, since),
                "paused_fraction": self._paused(pair, since),
                "gpu_utilization_pct": self._utilization(since, pair.end),
            }
        solo_util = self._utilization(*g_solo.window)
        return {
            "solo": {
                "guaranteed_steps_per_s": g_solo.rate,
                "guaranteed_step_wall_ms": _ms(g_solo.wall_s),
                "guaranteed_gpu_utilization_pct": solo_util,
                "guaranteed_peak_mib": g_solo.job.peak_mib(),
                "opportunistic_steps_per_s": o_solo.rate,
                "opportunistic_peak_mib": o_solo.job.peak_mib(),
            },
            "together": figures,
            "coordinator": self._coordinator(pair),
            "timeline": self._timeline(pair, g_solo, o_solo),
            "memory": self._memory(pair),
            "overhead": _overhead(overhead),
            "jobs": {key: _compact(job.summary) for key, job in self.jobs.items()},
            "targets": {
                "guaranteed_slowdown_at_most": TARGET_SLOWDOWN,
                "opportunistic_share_at_least": TARGET_OT_SHARE,
                "guaranteed_slowdown_met": _at_most(
                    figures["steady"]["guaranteed_slowdown"], TARGET_SLOWDOWN
                ),
                "opportunistic_share_met": _at_least(
                    figures["steady"]["opportunistic_share_of_solo"], TARGET_OT_SHARE
                ),
            },
        }

    def _shares(self, pair: Together) -> list[tuple[float, float]]:
        return [(d.at, float(d.share)) for d in pair.decisions]

    def _mean_share(self, pair: Together, since: float) -> float | None:
        return time_weighted_mean(self._shares(pair), since, pair.end)

    def _paused(self, pair: Together, since: float) -> float | None:
        paused = [(t, 1.0 if share == 0 else 0.0) for t, share in self._shares(pair)]
        return time_weighted_mean(paused, since, pair.end)

    def _utilization(self, a: float, b: float) -> float | None:
        if self.sampler is None:
            return None
        found = [s.utilization_pct for s in self.sampler.between(a, b)]
        values = [v for v in found if v is not None]
        return round(statistics.fmean(values), 1) if values else None

    def _coordinator(self, pair: Together) -> dict[str, Any]:
        ds = pair.decisions
        reasons = [d.reason for d in ds]
        return {
            "decisions": len(ds),
            "cuts": sum(1 for d in ds if 0 < d.share < d.previous_share),
            "raises": sum(1 for d in ds if d.share > d.previous_share and d.previous_share > 0),
            "pauses": sum(1 for d in ds if d.share == 0 and d.previous_share != 0),
            "relearned": sum(1 for r in reasons if "re-learning" in r),
            "solo_step_ms_learned": [_ms(s) for _, s in pair.learned],
            "solo_step_ms_at_end": _ms(pair.final_solo_s),
            "final_share": ds[-1].share if ds else None,
            "final_cap_mib": ds[-1].memory_cap_mib if ds else None,
            "first_reasons": reasons[:3],
            "last_reasons": reasons[-3:],
        }

    def _timeline(self, pair: Together, g_solo: Solo, o_solo: Solo) -> list[dict[str, Any]]:
        buckets = 12
        width = (pair.end - pair.start) / buckets
        rows = []
        for i in range(buckets):
            a, b = pair.start + i * width, pair.start + (i + 1) * width
            g_rate, o_rate = pair.g.rate(a, b), pair.o.rate(a, b)
            rows.append(
                {
                    "from_s": round(a - pair.start, 1),
                    "to_s": round(b - pair.start, 1),
                    "mean_share": time_weighted_mean(self._shares(pair), a, b),
                    "guaranteed_slowdown": _ratio(g_solo.rate, g_rate, minus_one=True),
                    "opportunistic_share_of_solo": _ratio(o_rate, o_solo.rate),
                    "gpu_utilization_pct": self._utilization(a, b),
                }
            )
        return rows

    def _memory(self, pair: Together) -> dict[str, Any]:
        g, o = pair.g, pair.o
        caps = [(d.at, d.memory_cap_mib) for d in pair.decisions]
        asked = [c for t, c in caps if t <= pair.end and c is not None]
        acks = [ack for ack in o.caps if ack.cap_mib is not None]
        since = acks[0].t if acks else pair.start
        figures: dict[str, Any] = {
            "guaranteed_peak_mib": g.peak_mib(),
            "opportunistic_cap_asked_mib": asked[-1] if asked else None,
            "opportunistic_caps_asked_mib": sorted(set(asked)),
            "opportunistic_cap_applied_met": [ack.met for ack in acks][-3:],
            "opportunistic_reserved_max_mib": _max(
                [s.reserved_mib for s in o.steps if s.t >= since]
            ),
            "opportunistic_steps_cap_not_met": sum(1 for s in o.steps if s.cap_met is False),
            "opportunistic_spilling_steps": sum(1 for s in o.steps if s.spilling),
            "nvml": None,
        }
        if self.sampler is not None:
            claimed: set[int] = set()
            g_mem = process_memory(g, self.sampler, claimed)
            o_mem = process_memory(o, self.sampler, claimed)
            capped = [m for t, m in o_mem.samples if t >= since and m is not None]
            figures["nvml"] = {
                "guaranteed_pid_match": g_mem.how,
                "guaranteed_used_max_mib": _max([m for _, m in g_mem.samples]),
                "opportunistic_pid_match": o_mem.how,
                "opportunistic_used_max_mib": _max(capped),
                "opportunistic_outside_allocator_mib": outside_allocator(o, o_mem.samples, since),
                "samples": len(o_mem.samples),
            }
        return figures


def _overhead(found: dict[str, list[dict[str, Any]]] | None) -> dict[str, Any] | None:
    if found is None:
        return None

    def med(name: str, figure: str) -> float | None:
        values = [s[figure] for s in found[name] if s.get(figure) is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {
        name: {
            "step_ms_median": med(name, "step_ms_median"),
            "step_ms_mean": med(name, "step_ms_mean"),
            "boundary_ms_median": med(name, "boundary_ms_median"),
            "runs": len(found[name]),
        }
        for name in found
    }
    for figure in ("step_ms_median", "step_ms_mean"):
        off, no_socket, socket = (out[n][figure] for n in ("off", "no-socket", "socket"))
        out[f"shim_ms_per_step_{figure.removeprefix('step_ms_')}"] = _diff(socket, off)
        out[f"socket_ms_per_step_{figure.removeprefix('step_ms_')}"] = _diff(socket, no_socket)
    return out


def _compact(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a job said of itself at the end, without what the settings already say."""
    if summary is None:
        return None
    keep = (
        "shim", "stopped_by", "measured_steps", "steps_per_s", "step_ms_mean", "step_ms_median",
        "body_ms_median", "boundary_ms_mean", "boundary_ms_median", "oom_steps",
        "max_memory_reserved_mib", "params", "device",
    )  # fmt: skip
    return {k: summary.get(k) for k in keep}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _ratio(a: float | None, b: float | None, minus_one: bool = False) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b - (1 if minus_one else 0)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "n/a"}[met]


def show(result: dict[str, Any], args: argparse.Namespace) -> None:
    c, f = result["conditions"], result["figures"]
    steady, whole, solo = f["together"]["steady"], f["together"]["whole"], f["solo"]
    mem, ov, t = f["memory"], f["overhead"], f["targets"]
    print(describe(c))
    print(f"guaranteed job:    {args.guaranteed_args}")
    print(f"opportunistic job: {args.opportunistic_args}")
    print(
        f"together {args.seconds:g}s, steady part from {steady['from_s']:g}s; "
        f"solo runs {args.solo_seconds:g}s each\n"
    )
    rows = [
        [
            "guaranteed slowdown (steps/s alone / together - 1)",
            pct(steady["guaranteed_slowdown"]),
            pct(whole["guaranteed_slowdown"]),
            f"<= +{TARGET_SLOWDOWN:.0%}: {_verdict(t['guaranteed_slowdown_met'])}",
        ],
        [
            "  as the coordinator sees it (median step wall time)",
            pct(steady["guaranteed_wall_slowdown"]),
            pct(whole["guaranteed_wall_slowdown"]),
            "",
        ],
        [
            "  the same, mean step wall time",
            pct(steady["guaranteed_wall_mean_slowdown"]),
            pct(whole["guaranteed_wall_mean_slowdown"]),
            "",
        ],
        [
            "opportunistic steps/s together / alone",
            fmt(steady["opportunistic_share_of_solo"], ".1%"),
            fmt(whole["opportunistic_share_of_solo"], ".1%"),
            f">= {TARGET_OT_SHARE:.0%}: {_verdict(t['opportunistic_share_met'])}",
        ],
        [
            "opportunistic share set (time-weighted mean)",
            fmt(steady["mean_share"], ".1f"),
            fmt(whole["mean_share"], ".1f"),
            "",
        ],
        [
            "  time paused (share 0)",
            fmt(steady["paused_fraction"], ".0%"),
            fmt(whole["paused_fraction"], ".0%"),
            "",
        ],
        [
            "GPU utilisation (NVML; guaranteed alone: "
            f"{fmt(solo['guaranteed_gpu_utilization_pct'], '.0f', '%')})",
            fmt(steady["gpu_utilization_pct"], ".0f", "%"),
            fmt(whole["gpu_utilization_pct"], ".0f", "%"),
            "",
        ],
    ]
    print(table(["figure", "steady", "whole run", "target"], rows))
    print(
        f"\nalone: guaranteed {fmt(solo['guaranteed_steps_per_s'], '.2f')} steps/s "
        f"(median step {fmt(solo['guaranteed_step_wall_ms'], '.2f')} ms), opportunistic "
        f"{fmt(solo['opportunistic_steps_per_s'], '.2f')} steps/s"
    )
    co = f["coordinator"]
    print(
        f"coordinator: {co['decisions']} decisions ({co['cuts']} cuts, {co['raises']} raises, "
        f"{co['pauses']} pauses, {co['relearned']} re-learns); solo step learned "
        f"{co['solo_step_ms_learned']} ms; final share {co['final_share']}, "
        f"cap {co['final_cap_mib']} MiB"
    )
    for reason in co["last_reasons"]:
        print(f"  {reason}")
    print("\nover time (together):")
    print(
        table(
            ["from s", "to s", "share", "guaranteed slowdown", "opportunistic / solo", "GPU use"],
            [
                [
                    f"{r['from_s']:g}",
                    f"{r['to_s']:g}",
                    fmt(r["mean_share"], ".0f"),
                    pct(r["guaranteed_slowdown"]),
                    fmt(r["opportunistic_share_of_solo"], ".0%"),
                    fmt(r["gpu_utilization_pct"], ".0f", "%"),
                ]
                for r in f["timeline"]
            ],
        )
    )
    nvml = mem["nvml"] or {}
    print("\nmemory (MiB):")
    print(
        table(
            ["figure", "value"],
            [
                ["guaranteed peak reserved (PyTorch)", fmt(mem["guaranteed_peak_mib"], "d")],
                ["opportunistic cap asked", fmt(mem["opportunistic_cap_asked_mib"], "d")],
                [
                    "opportunistic used, NVML, max while capped",
                    f"{fmt(nvml.get('opportunistic_used_max_mib'), 'd')} "
                    f"(pid {nvml.get('opportunistic_pid_match', 'n/a')})",
                ],
                [
                    "opportunistic reserved (PyTorch), max while capped",
                    fmt(mem["opportunistic_reserved_max_mib"], "d"),
                ],
                [
                    "  NVML less reserved: context, workspaces (median)",
                    fmt(nvml.get("opportunistic_outside_allocator_mib"), "d"),
                ],
                [
                    "cap met, as the shim said (last acks)",
                    str(mem["opportunistic_cap_applied_met"]),
                ],
                [
                    "steps over the cap / spilling",
                    f"{mem['opportunistic_steps_cap_not_met']} / "
                    f"{mem['opportunistic_spilling_steps']}",
                ],
            ],
        )
    )
    if ov is not None:
        print("\nshim overhead (guaranteed job's flags, ms per step, median over runs):")
        print(
            table(
                ["shim", "median step", "mean step", "inside shim.step(), outside the body"],
                [
                    [
                        name,
                        fmt(ov[name]["step_ms_median"], ".3f"),
                        fmt(ov[name]["step_ms_mean"], ".3f"),
                        fmt(ov[name]["boundary_ms_median"], ".4f"),
                    ]
                    for name in ("off", "no-socket", "socket")
                ],
            )
        )
        print(
            f"shim with socket - no shim: {fmt(ov['shim_ms_per_step_median'], '+.3f')} ms "
            f"(median), {fmt(ov['shim_ms_per_step_mean'], '+.3f')} ms (mean); of which the "
            f"socket: {fmt(ov['socket_ms_per_step_median'], '+.3f')} ms (median)"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch_info, gpu = prepare(args)
    from agentd.coordinator import CoordinatorSettings

    try:
        settings = CoordinatorSettings(
            slowdown=args.slowdown,
            decrease=args.decrease,
            increase=args.increase,
            window=args.window,
            solo_samples=args.solo_samples,
        )
    except ValueError as exc:
        print(f"cannot measure: {exc}", file=sys.stderr)
        return 2
    figures = measure(gpu, Bench(args, gpu, settings).run)
    run = {
        "guaranteed_args": args.guaranteed_args,
        "opportunistic_args": args.opportunistic_args,
        "seconds": args.seconds,
        "solo_seconds": args.solo_seconds,
        "steady_from": args.steady_from,
        "warmup_steps": args.warmup,
        "coordinator": dataclasses.asdict(settings),
        "cpu_wiring_check": args.cpu,
    }
    return report("coordinated_pair", args, torch_info, gpu, run, show, figures=figures)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Unavailable as exc:  # a check that came late
        print(f"cannot measure: {exc}", file=sys.stderr)
        sys.exit(2)
