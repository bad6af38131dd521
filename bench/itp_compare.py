"""The default profile and `default-guaranteed` (it without AntMan's kinds over time)
against `fifo` and `tiresias`, per ITP trace.

For each itp/raw/clusterNN.csv, sizes the cluster so that jobs queue: 8-GPU nodes, as
many as hold the trace's average GPU demand (GPU-seconds over its span) times
`--load-factor`, and never fewer than its largest job needs. Replays each profile
through the simulator (no locality slowdown: the ITP traces name no models; no
preemption overheads; GPU utilisation drawn as the simulator assumes, which places the
default's opportunistic jobs) and prints one Markdown table row per trace: average JCT
per profile, the average queueing delay under FIFO (proof that jobs queue), the
default against tiresias and fifo, and which profile did best. With --plot DIR, writes
each trace's JCT CDF and allocation plots under DIR/clusterNN/. `--seed N` replays the
jobs under other ids (ties fall otherwise: `_traces.renamed`), `--util-seed N` draws
other utilisations; what moves then is the size of a difference chance alone makes.

    .venv/bin/python bench/itp_compare.py [--trace-dir DIR] [--jobs 2] [--plot DIR]
        [--clusters cluster01,cluster05] [--load-factor 1.0] [--seed 0] [--util-seed 0]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _traces import add_trace_dir, itp_paths, renamed

from schedd import policy
from schedd.sim.engine import SimOptions, Simulation
from schedd.sim.locality import NoLocality
from schedd.sim.metrics import Summary, summarize
from schedd.sim.plots import write_plots
from schedd.sim.shape import ClusterShape
from schedd.sim.sharing import SharingModel
from schedd.sim.traces import Trace, read_trace

PROFILES = ("fifo", "tiresias", "default-guaranteed", "default")
GPUS_PER_NODE = 8


def cluster_for(trace: Trace, load_factor: float) -> ClusterShape:
    jobs = trace.jobs
    start = min(j.submit_s for j in jobs)
    span = max(j.submit_s + j.duration_s for j in jobs) - start
    demand = sum(j.gpus * j.duration_s for j in jobs) / span
    largest = max(j.gpus for j in jobs)
    nodes = max(math.ceil(demand * load_factor / GPUS_PER_NODE), math.ceil(largest / GPUS_PER_NODE))
    return ClusterShape(nodes, GPUS_PER_NODE)


def compare(
    path: Path, load_factor: float, plot: str | None, seed: int = 0, util_seed: int = 0
) -> tuple[str, str]:
    trace = renamed(read_trace(path, "itp"), seed)
    shape = cluster_for(trace, load_factor)
    options = SimOptions(sharing=SharingModel(seed=util_seed))
    runs = []
    for name in PROFILES:
        profile = policy.profile(name)
        result = Simulation(trace, shape, profile, options, locality=NoLocality()).run()
        runs.append((result, summarize(result)))
    if plot:
        write_plots(runs, Path(plot) / path.stem, "min")
    return path.stem, _row(path.stem, shape, [s for _, s in runs], [r.wall_s for r, _ in runs])


def _row(name: str, shape: ClusterShape, summaries: list[Summary], walls: list[float]) -> str:
    jct = {p: s.jct_avg_s / 60 for p, s in zip(PROFILES, summaries, strict=True)}
    best = min(jct, key=lambda p: jct[p])
    fifo = summaries[0]
    cells = [
        name,
        f"{fifo.jobs:,}",
        f"{shape.nodes}x{shape.gpus_per_node}",
        f"{fifo.queueing_avg_s / 60:,.1f}",
        *(f"{jct[p]:,.1f}" for p in PROFILES),
        f"{100 * (jct['default'] - jct['tiresias']) / jct['tiresias']:+.1f}%",
        f"{100 * (jct['default'] - jct['fifo']) / jct['fifo']:+.1f}%",
        best,
        " / ".join(f"{w:.0f}" for w in walls),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_dir(parser)
    parser.add_argument("--clusters", help="comma-separated names (default: all)")
    parser.add_argument("--load-factor", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=2, help="traces replayed at once")
    parser.add_argument("--plot", help="directory for the plots")
    parser.add_argument("--seed", type=int, default=0, help="tie-break seed (0: ids as they are)")
    parser.add_argument("--util-seed", type=int, default=0, help="seed of the drawn utilisations")
    args = parser.parse_args()
    paths = itp_paths(args.trace_dir, args.clusters)
    # Largest first, so that the pool does not end on one long replay.
    paths.sort(key=lambda p: -p.stat().st_size)
    print(
        "| trace | jobs | cluster | FIFO avg queueing (min) | fifo avg JCT (min) |"
        f" {' | '.join(PROFILES[1:])} | default vs tiresias | default vs fifo | best |"
        f" replay s ({' / '.join(PROFILES)}) |"
    )
    print("|" + " --- |" * (9 + len(PROFILES) - 1))
    rows = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(compare, p, args.load_factor, args.plot, args.seed, args.util_seed)
            for p in paths
        ]
        for future in futures:
            name, row = future.result()
            rows[name] = row
            print(row, flush=True)
    print()
    print("sorted by trace:")
    for name in sorted(rows):
        print(rows[name])


if __name__ == "__main__":
    main()
