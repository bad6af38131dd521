"""Choosing victims: free just enough for a job, losing the least work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedd.policy.placement import NoFit, Placement
from schedd.policy.snapshot import PendingJob, PlacedJob, shard_requests
from schedd.policy.view import View

PlaceFn = Callable[[PendingJob, View], Placement | NoFit]


@dataclass(frozen=True, slots=True)
class Eviction:
    victims: tuple[PlacedJob, ...]
    reason: str  # told to each victim, e.g. "reclaimed by queue a for job 7"


def work_at_risk(job: PlacedJob, view: View) -> float:
    """Seconds of work a preemption would lose: since its start or last checkpoint."""
    since = view.started(job)
    if job.checkpointed_at is not None:
        since = max(since, job.checkpointed_at)
    return max(view.now - since, 0.0)


def protected(job: PlacedJob, view: View) -> bool:
    """Too young to preempt, or already on its way out."""
    if not job.stoppable or job.job_id in view.stopping:
        return True
    return view.now - view.started(job) < view.settings.min_run_s


def leaving_jobs(view: View) -> list[PlacedJob]:
    """Placed jobs already on their way out when the cycle began (in the snapshot)."""
    key = ("leaving",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = [j for j in view.snapshot.placed if not j.stoppable]
    return known  # type: ignore[return-value]


def by_work_at_risk(view: View) -> list[PlacedJob]:
    """Placed jobs, those that would lose the least work first (ties by job id)."""
    key = ("by_work_at_risk",)
    known = view.memo.get(key)
    if known is None:
        placed = view.snapshot.placed
        known = view.memo[key] = sorted(placed, key=lambda j: (work_at_risk(j, view), j.job_id))
    return known  # type: ignore[return-value]


def protection_ends(view: View) -> float | None:
    """The earliest time a running job, too young to preempt now, no longer is."""
    key = ("protection_ends",)
    if key not in view.memo:
        min_run = view.settings.min_run_s
        ends = [
            j.started_at + min_run
            for j in view.snapshot.placed
            if j.started_at is not None and j.stoppable and j.started_at + min_run > view.now
        ]
        view.memo[key] = min(ends, default=None)
    return view.memo[key]  # type: ignore[return-value]


def fewest_victims(
    job: PendingJob, view: View, ranked: Sequence[PlacedJob], place: PlaceFn
) -> tuple[PlacedJob, ...] | None:
    """The shortest prefix of `ranked` (less protected jobs) whose release lets `job`
    fit, less those on nodes the job would not use (their release would not help it);
    None if no prefix does."""
    free_total = view.free_gpu_count()
    # Jobs already on their way out free their GPUs soon: if that is enough, wait for
    # them (no new victims) rather than preempt more.
    leaving = leaving_jobs(view)
    if leaving and isinstance(_place_without(job, view, leaving, place), Placement):
        return ()
    eligible = [v for v in ranked if not protected(v, view)]
    # The shortest prefix with enough GPUs in all, then the shortest that lets the job
    # fit: a longer prefix frees more, so a fit found at k holds at every k after it,
    # and a binary search finds the first in a few placements instead of one per victim.
    freed = free_total + sum(j.request.gpus for j in leaving)
    lo = None
    for k, victim in enumerate(eligible, start=1):
        freed += victim.request.gpus
        if freed >= job.request.gpus:
            lo = k
            break
    if lo is None:
        return None
    hi = len(eligible)
    found = _place_without(job, view, leaving + eligible[:hi], place)
    if not isinstance(found, Placement):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        placed = _place_without(job, view, leaving + eligible[:mid], place)
        if isinstance(placed, Placement):
            hi, found = mid, placed
        else:
            lo = mid + 1
    used = {s.node_id for s in found.shards}
    return tuple(v for v in eligible[:hi] if any(s.node_id in used for s in v.shards))


def _place_without(
    job: PendingJob,
    view: View,
    victims: list[PlacedJob],
    place: PlaceFn,
) -> Placement | NoFit:
    """Place `job` as if the victims had gone, then put the view back as it was."""
    undo = []
    for victim in victims:
        for shard, part in zip(
            victim.shards, shard_requests(victim.request, victim.shards), strict=True
        ):
            cap = view.capacity[shard.node_id]
            del view.by_free[len(cap.free_gpus)][shard.node_id]
            cap.give_back([view.gpu(u) for u in shard.gpu_uuids], part)
            view.by_free[len(cap.free_gpus)][shard.node_id] = None
            undo.append((shard, part))
    try:
        return place(job, view)
    finally:
        for shard, part in undo:
            cap = view.capacity[shard.node_id]
            del view.by_free[len(cap.free_gpus)][shard.node_id]
            cap.take(shard.gpu_uuids, part)
            view.by_free[len(cap.free_gpus)][shard.node_id] = None
