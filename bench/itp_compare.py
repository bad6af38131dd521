"""The default profile and `las` (its 2D-LAS variant) against `fifo` and `tiresias`, per ITP trace.

For each itp/raw/clusterNN.csv, sizes the cluster so that jobs queue: 8-GPU nodes, as
many as hold the trace's average GPU demand (GPU-seconds over its span) times
`--load-factor`, and never fewer than its largest job needs. Replays each profile
through the simulator (no locality slowdown: the ITP traces name no models; no
preemption overheads) and prints one Markdown table row per trace: average JCT per
profile, the average queueing delay under FIFO (proof that jobs queue), and which
profile did best. With --plot DIR, writes each trace's JCT CDF and allocation plots
under DIR/clusterNN/.

    .venv/bin/python bench/itp_compare.py [--trace-dir DIR] [--jobs 2] [--plot DIR]
        [--clusters cluster01,cluster05] [--load-factor 1.0]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _traces import add_trace_dir, itp_paths

from schedd import policy
from schedd.sim.engine import Simulation
from schedd.sim.locality import NoLocality
from schedd.sim.metrics import Summary, summarize
from schedd.sim.plots import write_plots
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace, read_trace

PROFILES = ("fifo", "tiresias", "las", "default")
GPUS_PER_NODE = 8


def cluster_for(trace: Trace, load_factor: float) -> ClusterShape:
    jobs = trace.jobs
    start = min(j.submit_s for j in jobs)
    span = max(j.submit_s + j.duration_s for j in jobs) - start
    demand = sum(j.gpus * j.duration_s for j in jobs) / span
    largest = max(j.gpus for j in jobs)
    nodes = max(math.ceil(demand * load_factor / GPUS_PER_NODE), math.ceil(largest / GPUS_PER_NODE))
    return ClusterShape(nodes, GPUS_PER_NODE)


def compare(path: Path, load_factor: float, plot: str | None) -> tuple[str, str]:
    trace = read_trace(path, "itp")
    shape = cluster_for(trace, load_factor)
    runs = []
    for name in PROFILES:
        result = Simulation(trace, shape, policy.profile(name), locality=NoLocality()).run()
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
    args = parser.parse_args()
    paths = itp_paths(args.trace_dir, args.clusters)
    # Largest first, so that the pool does not end on one long replay.
    paths.sort(key=lambda p: -p.stat().st_size)
    print(
        "| trace | jobs | cluster | FIFO avg queueing (min) | fifo avg JCT (min) |"
        f" {' | '.join(PROFILES[1:])} | default vs tiresias | best |"
        f" replay s ({' / '.join(PROFILES)}) |"
    )
    print("|" + " --- |" * (8 + len(PROFILES) - 1))
    rows = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(compare, p, args.load_factor, args.plot) for p in paths]
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
