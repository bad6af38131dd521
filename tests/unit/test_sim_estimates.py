"""Where the simulator's estimates come from: the truth, per-name history, or the forest."""

from __future__ import annotations

from schedd.sim.estimates import Estimates
from schedd.sim.traces import TraceJob


def job(i: int, name: str, duration: float) -> TraceJob:
    return TraceJob(f"j{i}", float(i), duration, 1, "alice", "default", name)


def test_oracle_is_the_true_run_time_and_history_the_mean_of_the_name() -> None:
    assert Estimates("oracle").of(job(0, "a", 123.0)) == 123.0
    history = Estimates("history")
    assert history.of(job(0, "a", 1.0)) is None
    history.finished(job(1, "a", 1.0), 100.0)
    history.finished(job(2, "a", 1.0), 300.0)
    assert history.of(job(3, "a", 1.0)) == 200.0
    assert history.of(job(3, "b", 1.0)) is None


def test_the_forest_takes_over_from_history_once_enough_jobs_finished() -> None:
    forest = Estimates("forest")
    for i in range(10):
        forest.finished(job(i, "short", 60.0), 60.0)
    assert forest.trainings == 0
    assert forest.of(job(100, "short", 0.0)) == 60.0  # per-name history meanwhile
    assert forest.of(job(100, "long", 0.0)) is None
    before = forest.version(job(100, "long", 0.0))
    for i in range(10, 40):
        name, run = ("short", 60.0) if i % 2 else ("long", 6000.0)
        forest.finished(job(i, name, run), run)
    assert forest.trainings >= 1
    assert forest.version(job(100, "long", 0.0)) != before  # cached views go stale
    long_estimate = forest.of(job(101, "long", 0.0))
    assert long_estimate is not None and 4000.0 < long_estimate < 7000.0
    short_estimate = forest.of(job(102, "short", 0.0))
    assert short_estimate is not None and short_estimate < 120.0
