"""Each GPU's busiest recent figures: what a policy reads as the utilisation and memory
a GPU kept below some mark over a window (AntMan places opportunistic jobs by it).

Agents send a GPU's sample when a figure moves past their threshold, so a figure holds
from its sample until the next one: the peak over [now - window, now] is the highest of
the samples inside the window and of the last one before it.
"""

from __future__ import annotations

from collections import deque


class GpuWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}

    def add(self, uuid: str, at: float, utilization_pct: int, memory_used_mib: int) -> None:
        samples = self._samples.setdefault(uuid, deque())
        samples.append((at, utilization_pct, memory_used_mib))
        # Keep one sample from before the window: it held into it.
        while len(samples) > 1 and samples[1][0] <= at - self.window_s:
            samples.popleft()

    def peak(self, uuid: str, now: float) -> tuple[int, int]:
        """(utilisation %, memory used MiB), each the highest over the window; (0, 0)
        for a GPU never sampled."""
        samples = self._samples.get(uuid)
        if not samples:
            return 0, 0
        start = now - self.window_s
        util = memory = 0
        ends = [*(at for at, _, _ in list(samples)[1:]), now]  # when each figure stopped holding
        for (_, u, m), until in zip(samples, ends, strict=True):
            if until > start:  # held at some time inside the window
                util, memory = max(util, u), max(memory, m)
        return util, memory
