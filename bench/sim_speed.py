"""How fast `schedctl sim` replays real traces, for every policy profile there is.

Replays itp/raw/cluster04.csv (the largest ITP cluster, 15,801 jobs) and
chronus/philly_MIX2.csv (30,940 jobs) through each profile in `schedd.policy.PROFILES`
and prints, per run: jobs replayed, wall seconds, jobs per second, plan() calls, the
share of the time spent inside plan(), and the average JCT (a sanity check that the run
did what it should). The traces live outside the project: --trace-dir or $GPUSCHED_TRACES.

    .venv/bin/python bench/sim_speed.py [--trace-dir DIR] [--profiles fifo,tiresias]
        [--limit N] [--itp-cluster 64x8] [--chronus-cluster 120x8]

Figures only: nothing here asserts on a timing.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from _traces import add_trace_dir
from _version import code_version

from schedd import policy
from schedd.policy import Profile
from schedd.policy.actions import Plan
from schedd.policy.snapshot import Snapshot
from schedd.sim.engine import Simulation
from schedd.sim.locality import LocalityModel, load_table
from schedd.sim.metrics import summarize
from schedd.sim.shape import parse_shape
from schedd.sim.traces import read_trace


def timed(profile: Profile) -> tuple[Profile, list[float]]:
    """The profile with its plan() wrapped to add up the seconds spent inside it and in
    finding its recheck (where the engine reads that)."""
    spent = [0.0]

    def plan(snapshot: Snapshot, now: float) -> Plan:
        began = time.perf_counter()
        try:
            made = profile.plan(snapshot, now)
        finally:
            spent[0] += time.perf_counter() - began
        # Its recheck, found only if the engine reads it, counted as the plan's too.
        timed_plan = Plan(made.actions, made.waiting, claimants=made.claimants)
        timed_plan.defer_recheck(lambda: recheck(made))
        return timed_plan

    def recheck(made: Plan) -> float | None:
        began = time.perf_counter()
        try:
            return made.recheck_at
        finally:
            spent[0] += time.perf_counter() - began

    wrapped = Profile(profile.name, plan, profile.pending_window, profile.tick_s, profile.estimates)
    return wrapped, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_dir(parser)
    parser.add_argument("--profiles", help="comma-separated (default: every profile)")
    parser.add_argument("--limit", type=int, help="replay only the N earliest rows")
    parser.add_argument("--itp-cluster", default="64x8", help="512 GPUs: cluster04's demand")
    parser.add_argument("--chronus-cluster", default="120x8")
    args = parser.parse_args()
    traces = Path(args.trace_dir)
    names = args.profiles.split(",") if args.profiles else list(policy.PROFILES)
    model_info = traces / "chronus" / "model_info.json"
    locality = LocalityModel(load_table(model_info)) if model_info.exists() else LocalityModel()
    runs = [
        ("itp", traces / "itp" / "raw" / "cluster04.csv", args.itp_cluster),
        ("chronus", traces / "chronus" / "philly_MIX2.csv", args.chronus_cluster),
    ]
    print(f"code: commit {code_version()}")
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}"
    )
    print("locality: chronus model_info.json where the trace names models (ITP raw: none)")
    header = (
        "trace                  cluster  profile   jobs   wall s   jobs/s   plans  in plan  avg JCT"
    )
    print(header)
    for fmt, path, cluster in runs:
        trace = read_trace(path, fmt, args.limit)
        for name in names:
            profile, spent = timed(policy.profile(name))
            sim = Simulation(trace, parse_shape(cluster), profile, locality=locality)
            result = sim.run()
            s = summarize(result)
            print(
                f"{path.name:<22} {cluster:>7}  {name:<8} {s.jobs:>6,} {result.wall_s:>8.1f} "
                f"{s.jobs / result.wall_s:>8,.0f} {s.plan_calls:>7,} "
                f"{100 * spent[0] / result.wall_s:>7.0f}% {s.jct_avg_s / 60:>8,.1f} min",
                flush=True,
            )


if __name__ == "__main__":
    main()
