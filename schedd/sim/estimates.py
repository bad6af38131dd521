"""Where a simulated job's `estimate_s` comes from, as the profile asks.

- "oracle": the job's true run time (its duration in the trace).
- "history": the mean measured run time (all attempts, wall clock) of the earlier
  finished jobs of the same user and name; None before the first one finishes.
- anything else: None (the policy uses its own default).
"""

from __future__ import annotations

from schedd.sim.traces import TraceJob

HistoryKey = tuple[str, str]  # (user, name)


class Estimates:
    def __init__(self, source: str) -> None:
        self.source = source
        self._sums: dict[HistoryKey, tuple[float, int]] = {}
        # Bumped when a key's mean changes, so cached views know they are stale.
        self.versions: dict[HistoryKey, int] = {}

    @property
    def changes_over_time(self) -> bool:
        return self.source == "history"

    def of(self, job: TraceJob) -> float | None:
        if self.source == "oracle":
            return job.duration_s
        if self.source == "history":
            found = self._sums.get((job.user, job.name))
            return None if found is None else found[0] / found[1]
        return None

    def version(self, job: TraceJob) -> int:
        return self.versions.get((job.user, job.name), 0)

    def finished(self, job: TraceJob, run_time_s: float) -> None:
        if self.source != "history":
            return
        key = (job.user, job.name)
        total, count = self._sums.get(key, (0.0, 0))
        self._sums[key] = (total + run_time_s, count + 1)
        self.versions[key] = self.versions.get(key, 0) + 1
