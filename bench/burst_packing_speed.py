"""Burst packing speed: how long Liquid's grouping GA takes at the bounds a plan sets it.

The GA (`schedd/policy/place/grouping_ga.py`) is bounded by work, not by a clock, so
that a replay places alike on any machine; this prints what that bound costs in time.
`place.network` hands it at most `batch_max_jobs` (64) jobs and at most four nodes per
job, so a burst of 64 jobs over 256 partly used 8-GPU nodes is the most it is ever
given. Each case passes that cap of nodes, fullest first: an upper bound, since the
plan passes fewer where the nodes' free GPUs hold twice the burst sooner (and orders
them by rack too, and leaves out nodes too full for the smallest job). Each case is
timed with the default budget (20 generations of 8, stopping after 5 without progress)
and with the stall rule off, every generation run: the worst case.
Median and maximum over `--runs` seeds; job sizes drawn from 1, 2, 4, 8 (what divides a
node) or from 1 to 8 (what strands GPUs one by one), free GPUs per node from 1 to 8.

    .venv/bin/python bench/burst_packing_speed.py [--runs 20]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedd.policy.place.grouping_ga import DEFAULT_BUDGET, Bin, Budget, pack
from schedd.policy.settings import Settings

SIZES = {"1,2,4,8": (1, 2, 4, 8), "1-8": tuple(range(1, 9))}


def burst(jobs: int, sizes: tuple[int, ...], seed: int) -> tuple[list, list[Bin]]:
    rng = random.Random(seed)
    items = [(f"job-{i}", rng.choice(sizes)) for i in range(jobs)]
    bins = [Bin(f"node-{b:04d}", 8, rng.randint(1, 8)) for b in range(4 * jobs)]
    bins.sort(key=lambda b: (b.free, b.node_id))  # fullest first, as the plan orders them
    return items, bins


def timed(jobs: int, sizes: tuple[int, ...], budget: Budget, runs: int) -> list[float]:
    took = []
    for seed in range(runs):
        items, bins = burst(jobs, sizes, seed)
        start = time.perf_counter()
        pack(items, bins, seed=seed, budget=budget)
        took.append(1000 * (time.perf_counter() - start))
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    most = Settings().batch_max_jobs
    worst = Budget(DEFAULT_BUDGET.generations, DEFAULT_BUDGET.population, stall=10**9)
    print(f"python {sys.version.split()[0]}; {args.runs} seeds per row; ms per burst")
    print("| jobs | nodes | sizes | budget | median ms | max ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for jobs in (16, most):
        for label, sizes in SIZES.items():
            for name, budget in (("default", DEFAULT_BUDGET), ("no stall", worst)):
                took = timed(jobs, sizes, budget, args.runs)
                print(
                    f"| {jobs} | {4 * jobs} | {label} | {name} |"
                    f" {statistics.median(took):.1f} | {max(took):.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
