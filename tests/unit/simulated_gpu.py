"""A small model of one GPU shared by a guaranteed job and opportunistic jobs.

The guaranteed job's step takes `solo_s * (1 + interference * sum(shares) / 100)`, times
`1 + noise * N(0, 1)` from a seeded generator; a fake clock moves on by each step. The
opportunistic jobs apply each decision before the next step (the shim applies controls
at its step boundaries, and they step in lockstep here). The model checks every
decision against what the job applies now: it must name it as the previous setting and
change it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agentd.coordinator import Decision, GpuCoordinator, JobKind

GUARANTEED = "g.1"


@dataclass
class FakeClock:
    now: float = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class GuaranteedStep:
    at: float
    wall_s: float
    slowdown: float  # wall_s / solo_s, noise included
    total_share: int  # of the opportunistic jobs during the step


@dataclass
class SimulatedGpu:
    coordinator: GpuCoordinator
    solo_s: float = 0.1
    interference: float = 0.1
    noise: float = 0.0
    seed: int = 0
    guaranteed_peak_mib: int = 8000
    clock: FakeClock = field(default_factory=FakeClock)
    # What each opportunistic job applies now: (share, memory cap).
    applied: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    history: list[GuaranteedStep] = field(default_factory=list)
    guaranteed: str | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def join(self, key: str, kind: JobKind, expected_peak_mib: int | None = None) -> list[Decision]:
        if kind == "guaranteed":
            self.guaranteed = key
        else:
            self.applied[key] = (100, None)  # the shim's own defaults
        return self._apply(
            self.coordinator.job_joined(
                key, kind, self.clock.now, expected_peak_mib=expected_peak_mib
            )
        )

    def leave(self, key: str) -> list[Decision]:
        if key == self.guaranteed:
            self.guaranteed = None
        self.applied.pop(key, None)
        return self._apply(self.coordinator.job_left(key, self.clock.now))

    def total_share(self) -> int:
        return sum(share for share, _ in self.applied.values())

    def step(self) -> list[Decision]:
        """One step of the guaranteed job, then one report from each opportunistic job."""
        assert self.guaranteed is not None
        share = self.total_share()
        wall_s = self.solo_s * (1 + self.interference * share / 100)
        wall_s *= max(0.05, 1 + self.noise * self.rng.gauss(0.0, 1.0))
        self.clock.advance(wall_s)
        self.history.append(GuaranteedStep(self.clock.now, wall_s, wall_s / self.solo_s, share))
        out = self._apply(
            self.coordinator.step(self.guaranteed, wall_s, self.guaranteed_peak_mib, self.clock.now)
        )
        for key, (_, cap) in list(self.applied.items()):
            # An opportunistic job's report never moves anything.
            assert self.coordinator.step(key, self.solo_s, cap, self.clock.now) == []
        return out

    def run(self, steps: int) -> list[Decision]:
        out: list[Decision] = []
        for _ in range(steps):
            out += self.step()
        return out

    def _apply(self, decisions: list[Decision]) -> list[Decision]:
        for d in decisions:
            before = self.applied[d.job_key]
            assert (d.previous_share, d.previous_memory_cap_mib) == before, d
            assert (d.share, d.memory_cap_mib) != before, f"a decision that changes nothing: {d}"
            self.applied[d.job_key] = (d.share, d.memory_cap_mib)
        self.decisions += decisions
        return decisions

    def recent(self, steps: int) -> list[GuaranteedStep]:
        return self.history[-steps:]
