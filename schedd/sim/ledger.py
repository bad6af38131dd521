"""What the engine counts as it goes: allocation over time, per-queue GPU-seconds, time
below guarantee, and the plans' waits and actions. The figures are derived in metrics.py."""

from __future__ import annotations

from collections import Counter, defaultdict
from operator import attrgetter
from typing import TypeVar

from schedd.policy.actions import Plan
from schedd.policy.queues import QueueSpec, lineage
from schedd.sim.jobs import SimJob

_code = attrgetter("code")

T = TypeVar("T", int, float)


class Ledger:
    def __init__(self, start_s: float, queues: tuple[QueueSpec, ...]) -> None:
        self.start_s = self.now = start_s
        self.allocated = (
            0  # GPUs held right now (by a guaranteed job, an opportunistic one or both)
        )
        self.series: list[tuple[float, int]] = [(start_s, 0)]  # (time, GPUs) at each change
        # The GPUs' compute utilisation summed, in GPUs (sharing.py's assumed model).
        self.busy = 0.0
        self.busy_series: list[tuple[float, float]] = [(start_s, 0.0)]
        # While any job waits: how long, and the busy GPUs integrated over that time.
        self.pending_jobs = 0
        self.backlog_s = 0.0
        self.backlog_busy_gpu_s = 0.0
        # GPU-seconds held, by the job's own queue.
        self.queue_gpu_seconds: defaultdict[str, float] = defaultdict(float)
        self.guarantees = {q.name: q.guarantee.gpus for q in queues if q.guarantee.gpus > 0}
        self.held_under: Counter[str] = Counter()  # GPUs held in each guaranteed subtree
        self.pending_under: Counter[str] = Counter()
        self.below_guarantee_s: defaultdict[str, float] = defaultdict(float)
        self._guarded: dict[str, tuple[str, ...]] = {}
        self.waits: Counter[str] = Counter()  # jobs waiting at the end of each instant, by code
        self.actions: Counter[str] = Counter()  # applied, by type
        self.unsupported: Counter[str] = Counter()  # ignored: the simulator cannot apply them
        self.refused: Counter[str] = Counter()  # actions that did not apply, by why
        self.plan_calls = 0
        self.replan_cap_hits = 0

    def _guarded_by(self, queue: str) -> tuple[str, ...]:
        """The guaranteed queues whose subtree holds `queue`."""
        found = self._guarded.get(queue)
        if found is None:
            found = tuple(q for q in lineage(queue) if q in self.guarantees)
            self._guarded[queue] = found
        return found

    def advance(self, now: float) -> None:
        elapsed = now - self.now
        if elapsed <= 0:
            return
        if self.pending_jobs > 0:
            self.backlog_s += elapsed
            self.backlog_busy_gpu_s += self.busy * elapsed
        for name, guarantee in self.guarantees.items():
            if self.pending_under[name] > 0 and self.held_under[name] < guarantee:
                self.below_guarantee_s[name] += elapsed
        self.now = now

    def close_instant(self) -> None:
        _close(self.series, self.now, self.allocated)
        _close(self.busy_series, self.now, self.busy)

    def occupy(self, gpus: int, busy_pct: float) -> None:
        """GPUs newly held (or, negative, freed), and the change of their utilisation."""
        self.allocated += gpus
        self.busy += busy_pct / 100

    def hold(self, job: SimJob) -> None:
        for name in self._guarded_by(job.spec.queue):
            self.held_under[name] += job.gpus

    def release(self, job: SimJob, now: float) -> None:
        assert job.held_since is not None
        self.queue_gpu_seconds[job.spec.queue] += job.gpus * (now - job.held_since)
        for name in self._guarded_by(job.spec.queue):
            self.held_under[name] -= job.gpus

    def pending_changed(self, job: SimJob, delta: int) -> None:
        self.pending_jobs += delta
        for name in self._guarded_by(job.spec.queue):
            self.pending_under[name] += delta

    def planned(self, plan: Plan) -> None:
        """The waits of the last plan at an instant: the reasons jobs stood waiting."""
        self.waits.update(map(_code, plan.waiting.values()))


def _close(series: list[tuple[float, T]], now: float, value: T) -> None:
    """Record the value at the end of an instant, if it changed."""
    if series[-1][1] != value:
        if series[-1][0] == now:
            series[-1] = (now, value)
        else:
            series.append((now, value))
