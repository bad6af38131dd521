"""The simulator's record of service that finished jobs took, for `Snapshot.service_history`.

The history object is rebuilt only when it has grown by `GROWTH` since the last build
(and from its first `MIN_SAMPLES` jobs on): a policy's table built from it is then
reused across many instants, as the live scheduler reuses its periodic reading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from schedd.policy.gittins import MIN_SAMPLES, ServiceHistory

GROWTH = 0.1


class ServiceBook:
    def __init__(self) -> None:
        self._gpu_s: list[float] = []
        self._built_at = 0
        self.history: ServiceHistory | None = None

    def finished(self, gpu_s: float, unfinished: Callable[[], Iterable[float]]) -> None:
        """Count a finished job; `unfinished` gives the service so far of the jobs not
        finished yet, read only when the history is rebuilt."""
        self._gpu_s.append(gpu_s)
        n = len(self._gpu_s)
        if n >= MIN_SAMPLES and n >= self._built_at * (1 + GROWTH):
            self.history = ServiceHistory.of(self._gpu_s, unfinished())
            self._built_at = n
