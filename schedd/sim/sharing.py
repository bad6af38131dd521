"""GPU sharing in the simulator (AntMan): how busy jobs keep their GPUs, and how fast
jobs that share a GPU run. Both are assumptions, stated here, since no trace we replay
records utilisation.

- Utilisation: each job keeps its GPUs busy a fixed percentage, drawn once per job
  from a uniform range (default 10-100 %), seeded by the job's position in the trace so
  that every profile replays the same jobs. The policy sees it as the placed job's
  `utilization_pct`, as the live scheduler sees a GPU's windowed peak.
- Speed: the agent's coordinator keeps a guaranteed job within `slowdown` of its solo
  speed (its default bound, 5 %) while an opportunistic job shares one of its GPUs; the
  opportunistic job gets the compute the guaranteed one leaves idle, so it runs at
  `1 - u/100` of its solo speed next to a guaranteed job of utilisation `u` (on a gang,
  at the pace of its busiest GPU), and at full speed on GPUs no guaranteed job holds.
- A GPU's compute utilisation is what its guaranteed holder uses plus what its sharer
  uses at its speed, at most 100 %: the figure behind AntMan's "+34 % compute".
  GPU memory is not modelled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


class SharingError(ValueError):
    """A bad utilisation range or slowdown, in words naming the option."""


@dataclass(frozen=True, slots=True)
class SharingModel:
    util_low: int = 10
    util_high: int = 100
    slowdown: float = 0.05  # of a guaranteed job that shares a GPU
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.util_low <= self.util_high <= 100:
            raise SharingError(
                f"--gpu-util: expected LOW-HIGH with 0 <= LOW <= HIGH <= 100, got "
                f"{self.util_low}-{self.util_high}"
            )
        if not 0 <= self.slowdown < 1:
            raise SharingError(f"--share-slowdown: expected 0 <= x < 1, got {self.slowdown}")

    def utilization(self, seq: int) -> int:
        """The job's assumed utilisation of its GPUs, in percent."""
        return random.Random(self.seed * 1_000_003 + seq).randint(self.util_low, self.util_high)

    def guaranteed_speed(self, shared: bool) -> float:
        return 1.0 - self.slowdown if shared else 1.0

    @staticmethod
    def opportunistic_speed(busiest_holder_pct: int | None) -> float:
        """Next to guaranteed holders (the busiest one's utilisation), or alone (None)."""
        return 1.0 if busiest_holder_pct is None else 1.0 - busiest_holder_pct / 100


def parse_util_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise SharingError(
            f"--gpu-util: expected LOW-HIGH in percent, e.g. 10-100, got {text!r}"
        ) from None
