"""The seed systems' profiles on the ITP traces: average JCT, makespan, GPU allocation
and compute utilisation.

For each itp/raw/clusterNN.csv, on the cluster `itp_compare.py` sizes (8-GPU nodes
holding the trace's average demand, so that jobs queue), replays each profile and
prints one Markdown row per (trace, profile). Besides the named profiles, a variant
`NAME@PLACE` is the profile with its placement plugin replaced by PLACE: the difference
is what a placement buys under the same order (`liquid@best_fit`: Liquid's order
without its network-aware placement and batch packing; `default@network`: the default
with Liquid's placement); `NAME+ANTICIPATE` adds an anticipate plugin
(`default-guaranteed+opportunistic`: `default-guaranteed` with AntMan's kinds over
time, as the default has them).

Multi-node jobs run at `--locality` of full speed (the ITP traces name no models, so
no per-model table applies; 1.0: no slowdown), and at `--cross-rack` of that again when
their nodes span racks of `--rack-size` nodes. No preemption overheads. Each job keeps
its GPUs busy a utilisation drawn from `--gpu-util` (the simulator's assumed model,
sim/sharing.py), which places opportunistic jobs and gives the utilisation column;
`--elastic` makes that share of the multi-GPU jobs elastic (half to all their GPUs,
sim/elastic.py), for Gandiva's grow/shrink.
`--traces`
chooses the ITP traces, chronus/philly_MIX2.csv (on 120x8, with its model_info.json),
or both. `--plot DIR` writes each trace's JCT CDF and GPU allocation over time, one
line per profile, under DIR/<trace>/.

    .venv/bin/python bench/seed_policies.py [--trace-dir DIR] [--jobs 2]
        [--profiles liquid,liquid@best_fit,tiresias,default] [--clusters cluster01]
        [--locality 0.8] [--rack-size 4] [--cross-rack 0.8] [--traces itp,mix2]
        [--gpu-util 10-100] [--elastic 0.5] [--plot DIR]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _traces import add_trace_dir, itp_paths
from _version import code_version
from itp_compare import cluster_for

from schedd import policy
from schedd.policy.profiles import BUILTIN
from schedd.sim.elastic import check_fraction
from schedd.sim.engine import SimOptions, Simulation
from schedd.sim.locality import LocalityModel, load_table
from schedd.sim.metrics import Summary, summarize
from schedd.sim.outcome import SimResult
from schedd.sim.plots import write_plots
from schedd.sim.shape import parse_shape
from schedd.sim.sharing import SharingError, SharingModel, parse_util_range
from schedd.sim.traces import read_trace

MIX2 = "philly_MIX2.csv"


def profile(name: str) -> policy.Profile:
    """A built-in profile, or a variant: NAME@PLACE, NAME+ANTICIPATE, or both."""
    base, _, extra = name.partition("+")
    base, _, place = base.partition("@")
    if not place and not extra:
        return policy.profile(name)
    spec = BUILTIN[base]
    if place:
        spec = dataclasses.replace(spec, place=place)
    if extra in spec.anticipate:
        raise ValueError(f"{name}: {base} already has {extra}")
    if extra:
        spec = dataclasses.replace(spec, anticipate=(*spec.anticipate, extra))
    return policy.build(name, spec)


def replay(
    path: Path,
    name: str,
    locality: float,
    rack_size: int | None,
    cross_rack: float,
    sharing: SharingModel,
    elastic: float = 0.0,
    keep: bool = False,
) -> tuple[str, tuple[SimResult, Summary] | None]:
    """One replay's Markdown row, and with `keep` its result for the plots (sent back
    from the worker only then: a large trace's result is megabytes)."""
    if path.name == MIX2:
        trace = read_trace(path, "chronus")
        shape = dataclasses.replace(parse_shape("120x8"), nodes_per_rack=rack_size)
        table = load_table(path.parent / "model_info.json")
        model = LocalityModel(table, default=locality, cross_rack=cross_rack)
    else:
        trace = read_trace(path, "itp")
        shape = dataclasses.replace(cluster_for(trace, 1.0), nodes_per_rack=rack_size)
        model = LocalityModel(default=locality, cross_rack=cross_rack)
    options = SimOptions(sharing=sharing, elastic=elastic)
    result = Simulation(trace, shape, profile(name), options, locality=model).run()
    s = summarize(result)
    cells = [
        path.stem,
        str(shape),
        name,
        f"{s.jct_avg_s / 60:,.1f}",
        f"{s.queueing_avg_s / 60:,.1f}",
        f"{s.makespan_s / 60:,.0f}",
        f"{100 * s.allocation_avg:.1f}%",
        f"{100 * s.utilization_avg:.1f}%",
        f"{100 * s.utilization_backlogged:.1f}%",
        f"{s.actions.get('SetKind opportunistic', 0):,}",
        f"{s.preemptions:,}",
        " / ".join(f"{n:,}" for n in (s.suspensions, s.migrations, s.resizes, s.packs)),
        f"{result.wall_s:.0f}",
    ]
    return "| " + " | ".join(cells) + " |", ((result, s) if keep else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_dir(parser)
    parser.add_argument("--profiles", default="liquid,liquid@best_fit,tiresias,default")
    parser.add_argument("--clusters", help="comma-separated names (default: all)")
    parser.add_argument("--locality", type=float, default=1.0)
    parser.add_argument("--rack-size", type=int)
    parser.add_argument("--cross-rack", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=2, help="replays run at once")
    parser.add_argument("--traces", default="itp", help="itp, mix2 or itp,mix2 (default: itp)")
    parser.add_argument("--gpu-util", default="10-100", help="LOW-HIGH percent (default 10-100)")
    parser.add_argument(
        "--elastic", type=float, default=0.0, help="share of multi-GPU jobs made elastic (0-1)"
    )
    parser.add_argument("--plot", help="directory for each trace's plots")
    args = parser.parse_args()
    try:
        check_fraction(args.elastic)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        sharing = SharingModel(*parse_util_range(args.gpu_util))
    except SharingError as exc:
        parser.error(str(exc))
    names = args.profiles.split(",")
    for name in names:
        try:
            profile(name)  # a wrong name fails before any replay
        except (KeyError, ValueError) as exc:
            parser.error(f"--profiles: {exc}")
    kinds = set(args.traces.split(","))
    if not kinds or kinds - {"itp", "mix2"}:
        parser.error(f"--traces: expected itp, mix2 or both, got {args.traces!r}")
    paths = itp_paths(args.trace_dir, args.clusters) if "itp" in kinds else []
    if "mix2" in kinds:
        paths.append(Path(args.trace_dir) / "chronus" / MIX2)
    print(
        f"code: {code_version()}; locality {args.locality}; rack size {args.rack_size};"
        f" cross-rack {args.cross_rack}; GPU utilisation {args.gpu_util}% (assumed);"
        f" elastic {args.elastic:g} of multi-GPU jobs (assumed)"
    )
    print(
        "| trace | cluster | profile | avg JCT (min) | avg queueing (min) | makespan (min)"
        " | GPU allocation | GPU utilisation | utilisation while jobs wait"
        " | turned opportunistic | preemptions | suspends / migrations / resizes / packs"
        " | replay s |"
    )
    print("|" + " --- |" * 13)
    with ProcessPoolExecutor(args.jobs) as pool:
        # Taken off as they are read, so that no result is kept beyond its trace's plots.
        futures = deque(
            pool.submit(
                replay,
                p,
                n,
                args.locality,
                args.rack_size,
                args.cross_rack,
                sharing,
                args.elastic,
                bool(args.plot),
            )
            for p in paths
            for n in names
        )
        runs: list[tuple[SimResult, Summary]] = []
        for i in range(len(futures)):
            row, run = futures.popleft().result()
            print(row, flush=True)
            if run is not None:
                runs.append(run)
            if args.plot and (i + 1) % len(names) == 0:  # the trace's last profile
                write_plots(runs, Path(args.plot) / paths[i // len(names)].stem, "min")
                runs = []


if __name__ == "__main__":
    main()
