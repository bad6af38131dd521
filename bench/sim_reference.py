"""The simulator's check against an independent one: FIFO on chronus/philly_MIX2.csv.

Runs the `fifo` profile on 120 nodes x 8 GPUs, no locality slowdown, no preemption or
checkpoint overheads, jobs with 0 GPUs dropped: the conditions of the Tiresias
simulator's FIFO row published with the Chronus traces. Prints our figures next to that
reference (avg JCT 2,427.5 min, 71.4% of SLO jobs missing their first deadline).

    .venv/bin/python bench/sim_reference.py [--trace-dir DIR]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _traces import add_trace_dir

from schedd import policy
from schedd.sim.engine import Simulation
from schedd.sim.locality import NoLocality
from schedd.sim.metrics import summarize
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import read_trace

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_JCT_MIN = 2427.5
REFERENCE_MISS = 0.714


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_dir(parser)
    args = parser.parse_args()
    path = Path(args.trace_dir) / "chronus" / "philly_MIX2.csv"
    trace = read_trace(path, "chronus")
    result = Simulation(
        trace, ClusterShape(120, 8), policy.profile("fifo"), locality=NoLocality()
    ).run()
    s = summarize(result)
    jct = s.jct_avg_s / 60
    miss = s.deadline_miss_rate or 0.0
    print(f"{path.name}: {s.jobs:,} jobs ({s.dropped_zero_gpu} with 0 GPUs dropped), 120x8 GPUs,")
    print("fifo profile, no locality slowdown, no overheads")
    print(f"replayed in {result.wall_s:.1f} s; {s.finished:,} finished, {s.never_finished} never")
    print()
    print("                       ours   reference  difference")
    print(
        f"avg JCT (min)    {jct:>10,.1f}  {REFERENCE_JCT_MIN:>10,.1f}  "
        f"{100 * (jct - REFERENCE_JCT_MIN) / REFERENCE_JCT_MIN:>+9.1f}%"
    )
    print(
        f"SLO jobs missing {100 * miss:>9.1f}%  {100 * REFERENCE_MISS:>9.1f}%  "
        f"{100 * (miss - REFERENCE_MISS):>+8.1f} pts"
    )
    print(
        f"p50 / p95 / p99 JCT (min): {s.jct_p50_s / 60:,.1f} / {s.jct_p95_s / 60:,.1f} / "
        f"{s.jct_p99_s / 60:,.1f}; avg queueing {s.queueing_avg_s / 60:,.1f} min; "
        f"GPU allocation {100 * s.allocation_avg:.1f}%"
    )


if __name__ == "__main__":
    main()
