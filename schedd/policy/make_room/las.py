"""Tiresias' preemption: a job in a higher 2D-LAS queue displaces jobs in lower ones.

Victims are taken from the lowest queue up (most attained service, latest started
first), within the job's own tenant queue, and none younger than `min_run_s`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    fewest_victims,
    known_to_fail,
    protection_ends,
    remember_failure,
)
from schedd.policy.order.las import level, placed_levels
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View

SpareFn = Callable[[PlacedJob, View], bool]


def _by_level(view: View) -> dict[str, list[tuple[int, PlacedJob]]]:
    """Per tenant queue, its placed jobs as (level, job), lowest priority first."""
    key = ("las_victims",)
    known = view.memo.get(key)
    if known is None:
        ranked: dict[str, list[tuple[int, float, str, PlacedJob]]] = defaultdict(list)
        for job, _, theirs in placed_levels(view):
            ranked[job.queue].append((-theirs, -view.started(job), job.job_id, job))
        known = {q: [(-lv, j) for lv, _, _, j in sorted(jobs)] for q, jobs in ranked.items()}
        view.memo[key] = known
    return known  # type: ignore[return-value]


def make_room(
    job: PendingJob, view: View, place: PlaceFn, spare: SpareFn | None = None
) -> Eviction | None:
    """`spare` says which running jobs are never victims (the Gittins make-room passes
    its own on while it has no history to learn from)."""
    mine = level(job, view)
    # A job that found no victims leaves none for a job of the same request and a
    # level no better (its candidates are fewer), for the rest of the cycle: capacity
    # only shrinks as the plan goes on. With a reservation standing, whether a job may
    # use what it holds depends on the job's own end: then each job asks for itself.
    memo = ("las", job.queue, job.request, job.job_id if view.reservations else None, spare)
    if known_to_fail(view, memo, mine):
        return None
    ranked = [v for theirs, v in _by_level(view).get(job.queue, ()) if theirs > mine]
    if spare is not None:
        ranked = [v for v in ranked if not spare(v, view)]
    victims = fewest_victims(job, view, ranked, place) if ranked else None
    if victims is None:
        remember_failure(view, memo, mine)
        return None
    return Eviction(victims, f"preempted: job {job.job_id} has attained less service")


def recheck_at(view: View) -> float | None:
    """When a running job (or one this plan launches) next comes of age or drops to a
    lower 2D-LAS queue (its service grows by its GPU count each second): either may
    open room for a waiting job."""
    thresholds = view.settings.las_thresholds_gpu_s
    times = []
    for job, attained, above in placed_levels(view):
        if job.started_at is None or not job.stoppable or job.request.gpus <= 0:
            continue
        if above < len(thresholds):
            gap = thresholds[above] - attained
            times.append(view.now + gap / job.request.gpus)
    for launched, _ in view.launching:  # from its earlier attempts' service on, from now
        above = level(launched, view)
        if above < len(thresholds) and launched.request.gpus > 0:
            gap = thresholds[above] - launched.attained_s
            times.append(view.now + gap / launched.request.gpus)
    ends = protection_ends(view)
    if ends is not None:
        times.append(ends)
    return min(times, default=None)
