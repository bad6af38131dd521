"""The seed systems' profiles on the ITP traces: average JCT, makespan, GPU allocation.

For each itp/raw/clusterNN.csv, on the cluster `itp_compare.py` sizes (8-GPU nodes
holding the trace's average demand, so that jobs queue), replays each profile and
prints one Markdown row per (trace, profile). Besides the named profiles, a variant
`NAME-bestfit` is the profile with its placement replaced by plain best fit: the
difference is what the profile's own placement buys (`liquid-bestfit`: Liquid's order
and backfill without its network-aware placement and batch packing).

Multi-node jobs run at `--locality` of full speed (the ITP traces name no models, so
no per-model table applies; 1.0: no slowdown), and at `--cross-rack` of that again when
their nodes span racks of `--rack-size` nodes. No preemption overheads.

    .venv/bin/python bench/seed_policies.py [--trace-dir DIR] [--jobs 2]
        [--profiles liquid,liquid-bestfit,tiresias,default] [--clusters cluster01]
        [--locality 0.8] [--rack-size 4] [--cross-rack 0.8]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _traces import add_trace_dir
from _version import code_version
from itp_compare import cluster_for

from schedd import policy
from schedd.policy.profiles import BUILTIN
from schedd.sim.engine import Simulation
from schedd.sim.locality import LocalityModel
from schedd.sim.metrics import summarize
from schedd.sim.traces import read_trace

BESTFIT = "-bestfit"


def profile(name: str) -> policy.Profile:
    if name.endswith(BESTFIT):
        base = name.removesuffix(BESTFIT)
        return policy.build(name, dataclasses.replace(BUILTIN[base], place="best_fit"))
    return policy.profile(name)


def replay(path: Path, name: str, locality: float, rack_size: int | None, cross_rack: float) -> str:
    trace = read_trace(path, "itp")
    shape = dataclasses.replace(cluster_for(trace, 1.0), nodes_per_rack=rack_size)
    result = Simulation(
        trace, shape, profile(name), locality=LocalityModel(default=locality, cross_rack=cross_rack)
    ).run()
    s = summarize(result)
    cells = [
        path.stem,
        str(shape),
        name,
        f"{s.jct_avg_s / 60:,.1f}",
        f"{s.queueing_avg_s / 60:,.1f}",
        f"{s.makespan_s / 60:,.0f}",
        f"{100 * s.allocation_avg:.1f}%",
        f"{s.preemptions:,}",
        f"{result.wall_s:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_dir(parser)
    parser.add_argument("--profiles", default="liquid,liquid-bestfit,tiresias,default")
    parser.add_argument("--clusters", help="comma-separated names (default: all)")
    parser.add_argument("--locality", type=float, default=1.0)
    parser.add_argument("--rack-size", type=int)
    parser.add_argument("--cross-rack", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=2, help="replays run at once")
    args = parser.parse_args()
    names = args.profiles.split(",")
    for name in names:
        profile(name)  # a wrong name fails before any replay
    paths = sorted((Path(args.trace_dir) / "itp" / "raw").glob("cluster*.csv"))
    if args.clusters:
        wanted = set(args.clusters.split(","))
        paths = [p for p in paths if p.stem in wanted]
    print(
        f"code: {code_version()}; locality {args.locality}; rack size {args.rack_size};"
        f" cross-rack {args.cross_rack}"
    )
    print(
        "| trace | cluster | profile | avg JCT (min) | avg queueing (min) | makespan (min)"
        " | GPU allocation | preemptions | replay s |"
    )
    print("|" + " --- |" * 9)
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(replay, p, n, args.locality, args.rack_size, args.cross_rack)
            for p in paths
            for n in names
        ]
        for future in futures:
            print(future.result(), flush=True)


if __name__ == "__main__":
    main()
