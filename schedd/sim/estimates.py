"""Where a simulated job's `estimate_s` comes from, as the profile (or `--estimates`) asks.

- "oracle": the job's true run time (its duration in the trace).
- "history": the mean measured run time (all attempts, wall clock) of the earlier
  finished jobs of the same user and name; None before the first one finishes.
- "forest" (`schedctl sim --estimates forest`; a profile's own `estimates` is "history"
  or "oracle"): the resource estimator (`schedd.estimator`) trained on the jobs
  finished so far, from what a trace says of them (user, name, queue, GPUs: no
  iterations or labels), trained again each time they have grown by a quarter (the
  live scheduler: every `estimator_retrain_s`); the per-name history until 20 have
  finished, and for a job the forest cannot predict.
- anything else: None (the policy uses its own default).
"""

from __future__ import annotations

from schedd.estimator.features import Features, features
from schedd.estimator.forest import MIN_JOBS, TRAIN_ON_JOBS, Estimator, Example
from schedd.sim.traces import TraceJob

HistoryKey = tuple[str, str]  # (user, name)
RETRAIN_GROWTH = 1.25  # train again once this many times as many jobs have finished


class Estimates:
    def __init__(self, source: str) -> None:
        self.source = source
        self._sums: dict[HistoryKey, tuple[float, int]] = {}
        # Bumped when a key's mean changes, so cached views know they are stale.
        self.versions: dict[HistoryKey, int] = {}
        self._examples: list[Example] = []
        self._forest: Estimator | None = None
        self._trained_at = 0  # finished jobs at the last training
        self._predicted: dict[str, float] = {}  # job id -> run time, by the current forest
        self.trainings = 0

    @property
    def changes_over_time(self) -> bool:
        return self.source in ("history", "forest")

    def of(self, job: TraceJob) -> float | None:
        if self.source == "oracle":
            return job.duration_s
        if self.source == "forest" and self._forest is not None:
            known = self._predicted.get(job.job_id)
            if known is None and (predicted := self._forest.run_times([_features(job)])):
                known = self._predicted[job.job_id] = predicted[0]
            if known is not None:
                return known
        if self.source in ("history", "forest"):
            found = self._sums.get((job.user, job.name))
            return None if found is None else found[0] / found[1]
        return None

    def version(self, job: TraceJob) -> int:
        if self.source == "forest" and self._forest is not None:
            return -self.trainings  # every view is stale after a training
        return self.versions.get((job.user, job.name), 0)

    def finished(self, job: TraceJob, run_time_s: float) -> None:
        if self.source not in ("history", "forest"):
            return
        key = (job.user, job.name)
        total, count = self._sums.get(key, (0.0, 0))
        self._sums[key] = (total + run_time_s, count + 1)
        self.versions[key] = self.versions.get(key, 0) + 1
        if self.source == "forest":
            self._examples.append(Example(_features(job), {"run_time_s": run_time_s}))
            done = len(self._examples)
            if done >= MIN_JOBS and done >= self._trained_at * RETRAIN_GROWTH:
                self._forest = Estimator.train(self._examples[-TRAIN_ON_JOBS:])
                self._trained_at = done
                self._predicted = {}
                self.trainings += 1


def _features(job: TraceJob) -> Features:
    return features(
        user=job.user, name=job.name, queue=job.queue, gpus=job.gpus, cpus=1.0, memory_mib=1024
    )
