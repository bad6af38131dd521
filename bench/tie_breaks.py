"""How much of a MIX2 result is tie-breaking: the same replay with the jobs under other ids.

Policies break ties (equal rank, equal submission second; 30,042 of MIX2's 30,746 jobs
share their second with another) by job id, an order that says nothing of the jobs.
Seed 0 replays chronus/philly_MIX2.csv as it is (120x8, its model_info.json, as in
docs/evaluation.md); seed N > 0 gives every job a random prefix to its id, drawn from
N, and nothing else changes: the same jobs, instants, deadlines and cluster. The spread
over seeds is the size of a difference that tie-breaking alone can make. Prints one
Markdown row per (profile, seed): deadlines missed, average and best-effort JCT.
`--overheads lose` adds the page's preemption overheads (60 s idle, then the work since
the last half-hourly checkpoint lost); `--overheads save`, 60 s idle and nothing lost (a
job that saves a checkpoint when it is preempted, as a live job with the shim does).
`--gpu-util LOW-HIGH` sets the range of the simulator's assumed utilisation
(sim/sharing.py; the engine's default, 10-100, otherwise), as `bench/seed_policies.py`
does, and a profile may be one of its variants (`default-guaranteed+opportunistic`).

    .venv/bin/python bench/tie_breaks.py [--trace-dir DIR] [--jobs 2]
        [--profiles default,default-deadlines] [--seeds 0,1,2,3] [--overheads none|save|lose]
        [--gpu-util 10-100]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _traces import add_trace_dir, renamed
from _version import code_version
from seed_policies import profile as named_profile

from schedd.sim.engine import SimOptions, Simulation
from schedd.sim.locality import LocalityModel, load_table
from schedd.sim.metrics import summarize
from schedd.sim.shape import parse_shape
from schedd.sim.sharing import SharingModel, parse_util_range
from schedd.sim.traces import read_trace

CLUSTER = "120x8"


OVERHEADS = {
    "none": None,
    "save": SimOptions(preempt_overhead_s=60.0),
    "lose": SimOptions(preempt_overhead_s=60.0, checkpoint_interval_s=1800.0),
}


def replay(trace_dir: str, profile: str, seed: int, overheads: str, gpu_util: str | None) -> str:
    chronus = Path(trace_dir) / "chronus"
    trace = renamed(read_trace(chronus / "philly_MIX2.csv", "chronus"), seed)
    options = OVERHEADS[overheads]
    if gpu_util is not None:
        sharing = SharingModel(*parse_util_range(gpu_util))
        options = dataclasses.replace(options or SimOptions(), sharing=sharing)
    locality = LocalityModel(load_table(chronus / "model_info.json"))
    sim = Simulation(trace, parse_shape(CLUSTER), named_profile(profile), options, locality)
    result = sim.run()
    s = summarize(result)
    assert s.deadline_miss_rate is not None
    cells = [
        profile,
        overheads,
        str(seed),
        f"{100 * s.deadline_miss_rate:.2f}% ({s.deadline_missed:,})",
        f"{s.jct_avg_s / 60:,.1f}",
        f"{s.jct_best_effort_avg_s / 60:,.1f}",
        f"{result.wall_s:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_trace_dir(parser)
    parser.add_argument("--profiles", default="default,default-deadlines")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--overheads", choices=sorted(OVERHEADS), default="none")
    parser.add_argument("--jobs", type=int, default=2, help="replays at once")
    parser.add_argument("--gpu-util", help="the assumed utilisation range, LOW-HIGH percent")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [(p, s) for p in args.profiles.split(",") for s in seeds]
    util = f"GPU utilisation {args.gpu_util or '10-100'}% (assumed)"
    print(f"MIX2 on {CLUSTER}, jobs renamed by seed, {util}; {code_version()}")
    heads = ["profile", "overheads", "seed", "deadlines missed", "avg JCT (min)"]
    heads += ["best-effort JCT (min)", "replay s"]
    print("| " + " | ".join(heads) + " |")
    print("|" + " --- |" * len(heads))
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [
            pool.submit(replay, args.trace_dir, p, s, args.overheads, args.gpu_util)
            for p, s in runs
        ]
        for row in rows:
            print(row.result(), flush=True)


if __name__ == "__main__":
    main()
