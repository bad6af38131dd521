"""How well the resource estimator predicts run times, on held-out jobs of a real trace.

Reads a Chronus/Philly trace (default chronus/philly_MIX2.csv: per job its virtual
cluster, model, GPU count, iterations and run time), trains the estimator's forest on
the earliest jobs (`--train`, 70% by default) as if they had finished, and predicts the
run time of each later job from what its spec would say (user = virtual cluster, name =
model, GPUs, iterations). Against two baselines: what the scheduler used before the
estimator (the mean run time of the same user's jobs of the same name, else the mean of
all), and the median of all. Prints the median absolute percentage error, the share
within 2x of the truth, and the mean absolute error. The trace carries no GPU memory or
utilisation, so those targets are not measured here.

    .venv/bin/python bench/estimator_accuracy.py [--trace-dir DIR] [--trace chronus/philly_MIX1.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from _traces import add_trace_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedd.estimator.features import Features, features
from schedd.estimator.forest import Estimator, Example


def read(path: Path) -> list[tuple[Features, str, str, float]]:
    """(features, user, name, run time in seconds) per job with GPUs, in submission order."""
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            gpus = int(r["num_gpu"])
            if gpus <= 0:
                continue
            f_ = features(
                user=r["user"],
                name=r["model_name"],
                queue=r["user"],
                gpus=gpus,
                cpus=1.0,
                memory_mib=1024,
                iterations=int(r["iterations"]),
            )
            rows.append(
                (float(r["submit_time"]), f_, r["user"], r["model_name"], 60 * float(r["duration"]))
            )
    rows.sort(key=lambda x: x[0])
    return [(f_, user, name, run) for _, f_, user, name, run in rows]


def scores(predicted: list[float], truth: list[float]) -> str:
    ape = [abs(p - t) / t for p, t in zip(predicted, truth, strict=True)]
    within = sum(1 for p, t in zip(predicted, truth, strict=True) if t / 2 <= p <= 2 * t)
    mae = statistics.fmean(abs(p - t) for p, t in zip(predicted, truth, strict=True))
    share = 100 * within / len(truth)
    return (
        f"median error {100 * statistics.median(ape):6.1f}%   within 2x {share:5.1f}%"
        f"   mean abs error {mae / 60:8.1f} min"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_dir(ap)
    ap.add_argument("--trace", default="chronus/philly_MIX2.csv")
    ap.add_argument("--train", type=float, default=0.7, help="share of jobs to train on")
    args = ap.parse_args()
    jobs = read(Path(args.trace_dir) / args.trace)
    cut = int(len(jobs) * args.train)
    train, test = jobs[:cut], jobs[cut:]
    began = time.perf_counter()
    estimator = Estimator.train([Example(f, {"run_time_s": run}) for f, _, _, run in train])
    trained_s = time.perf_counter() - began
    truth = [run for _, _, _, run in test]
    began = time.perf_counter()
    forest = estimator.run_times([f for f, _, _, _ in test]) or []
    predict_s = time.perf_counter() - began
    sums: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _, user, name, run in train:
        sums[(user, name)].append(run)
    overall = statistics.fmean(run for *_, run in train)
    history = [statistics.fmean(sums.get((u, n), [overall])) for _, u, n, _ in test]
    median = [statistics.median(run for *_, run in train)] * len(test)
    print(f"{args.trace}: trained on {len(train):,} jobs, tested on the next {len(test):,}")
    print(f"  training {trained_s:.1f} s, {len(test):,} predictions {predict_s:.2f} s")
    print(f"  forest                  {scores(forest, truth)}")
    print(f"  mean of user and name   {scores(history, truth)}")
    print(f"  median of all           {scores(median, truth)}")
    print(f"  basis: {estimator.basis('run_time_s')}")


if __name__ == "__main__":
    main()
