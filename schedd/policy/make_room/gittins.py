"""Preemption by Gittins index: a waiting job displaces running jobs of a lower index.

Victims come from the job's own tenant queue, lowest index first (latest started first
among equals), none younger than `min_run_s`. Where run times are alike a job that has
started always has the higher index, and nothing is ever preempted for a newcomer; where
they are heavy-tailed, long runners give way to new jobs, as under 2D-LAS. With no
history to learn from yet, this is 2D-LAS preemption (`make_room.las`).
"""

from __future__ import annotations

import bisect
import math

from schedd.policy.gittins import GittinsTable
from schedd.policy.kept import Kept
from schedd.policy.make_room import las
from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    fewest_victims,
    placed_by_queue,
    protection_ends,
)
from schedd.policy.order.gittins import placed_rank, rank, table
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View

Ranked = tuple[list[float], list[PlacedJob]]
# Per tenant queue: its placed jobs' list (the same object while its jobs are), the
# table, and [from, until) of `now` in which every one of their ranks holds, with the
# order found. Kept from plan to plan: a queue's jobs change far less often than the
# snapshot does, and each running job's rank only at a step of the index.
_ranked: dict[str, tuple[list[PlacedJob], GittinsTable, float, float, Ranked]] = {}


def _by_rank(view: View, queue: str, learned: GittinsTable) -> Ranked:
    """The queue's placed jobs, lowest priority first (latest started first among
    equals), and beside each its rank negated (ascending, for a binary search)."""
    key = ("gittins_victims", queue)
    known = view.memo.get(key)
    if known is not None:
        return known  # type: ignore[return-value]
    jobs = placed_by_queue(view).get(queue, [])
    now = view.now
    hit = _ranked.get(queue)
    if hit is not None and hit[0] is jobs and hit[1] is learned and hit[2] <= now < hit[3]:
        view.memo[key] = hit[4]
        return hit[4]
    until = math.inf
    rows = []
    for job in jobs:
        value, holds = placed_rank(job, view, learned)
        if job.started_at is None:
            holds = now  # ordered by a start of `now`: holds for this plan only
        until = min(until, holds)
        rows.append((-value, -view.started(job), job.job_id, job))
    rows.sort()
    ranked = ([r for r, _, _, _ in rows], [j for _, _, _, j in rows])
    _ranked[queue] = (jobs, learned, now, until, ranked)
    view.memo[key] = ranked
    return ranked


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    learned = table(view)
    if learned is None:
        return las.make_room(job, view, place)
    mine = rank(job, view)
    # A job that found no victims leaves none for a job of the same request and a rank
    # no better (its candidates are fewer), for the rest of the cycle: capacity only
    # shrinks as the plan goes on.
    # With GPUs reserved, whether a job may use them depends on its own estimate: then
    # only the same rank is known to fail.
    memo = ("gittins", job.queue, job.request, mine if view.reserved else None)
    failed = view.memo.get(memo)
    if isinstance(failed, float) and mine >= failed:
        return None
    negated, jobs = _by_rank(view, job.queue, learned)
    ranked = jobs[: bisect.bisect_left(negated, -mine)]  # those ranked below it
    victims = fewest_victims(job, view, ranked, place) if ranked else None
    if victims is None:
        view.memo[memo] = min(mine, failed) if isinstance(failed, float) else mine
        return None
    return Eviction(victims, f"preempted: job {job.job_id} has the higher Gittins index")


_best = Kept[dict[str, float]]()


def _best_waiting(view: View, learned: GittinsTable) -> dict[str, float]:
    """Per tenant queue, the highest index waiting."""
    pending = view.snapshot.pending
    known = _best.get(pending, learned)
    if known is None:
        best: dict[str, float] = {}
        for waiter in pending:
            value = learned.index(waiter.attained_s)
            if value > best.get(waiter.queue, 0.0):
                best[waiter.queue] = value
        known = _best.put(best, pending, learned)
    return known


# Per tenant queue: its placed jobs' list (the same object while its jobs are), the best
# waiting index and the table compared, when that was found, and the crossing found.
_queue_crossings: dict[str, tuple[list[PlacedJob], float, GittinsTable, float, float | None]] = {}


def _next_crossing(view: View, learned: GittinsTable) -> float | None:
    """When a running job's index next falls below the best waiting in its queue. A
    running job whose service is counted from a fixed time (`attained_as_of`) gains
    its GPU count per second, so that time is fixed while the queue's jobs, the table
    and the best waiting index stay the same: a queue's answer is computed again only
    when one changes or the time has passed."""
    best = _best_waiting(view, learned)
    now = view.now
    by_queue = placed_by_queue(view)
    earliest: float | None = None
    for queue, waiting in best.items():
        jobs = by_queue.get(queue)
        if not jobs:
            continue
        hit = _queue_crossings.get(queue)
        if (
            hit is not None
            and hit[0] is jobs
            and hit[1] == waiting
            and hit[2] is learned
            and hit[3] <= now  # found from that time on, not before it
            and (hit[4] is None or hit[4] > now)
        ):
            when = hit[4]
        else:
            when, queue_fixed = _queue_crossing(jobs, waiting, view, learned)
            if queue_fixed:
                _queue_crossings[queue] = (jobs, waiting, learned, now, when)
            else:
                _queue_crossings.pop(queue, None)
        if when is not None and (earliest is None or when < earliest):
            earliest = when
    return earliest


def _queue_crossing(
    jobs: list[PlacedJob], waiting: float, view: View, learned: GittinsTable
) -> tuple[float | None, bool]:
    """The earliest time one of the queue's running jobs falls below `waiting`, and
    whether that time is fixed (every job's service counted from a fixed time)."""
    steps = learned.steps_below(waiting)
    earliest: float | None = None
    fixed = True
    for job in jobs:
        if job.started_at is None or not job.stoppable or job.request.gpus <= 0:
            continue
        if job.attained_as_of is None:
            fixed = False  # its service is as of now: the time moves with the clock
        attained = view.attained(job)
        at = learned.drops_below(attained, waiting, steps)
        if at is not None:
            when = view.now + (at - attained) / job.request.gpus
            if earliest is None or when < earliest:
                earliest = when
    return earliest, fixed


def recheck_at(view: View) -> float | None:
    """When a running job next comes of age, or its index (which changes as its service
    grows by its GPU count each second) falls below that of a job waiting in its queue."""
    learned = table(view)
    if learned is None:
        return las.recheck_at(view)
    times = [t for t in (_next_crossing(view, learned), protection_ends(view)) if t is not None]
    return min(times, default=None)
