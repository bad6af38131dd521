"""Priority preemption within a queue: a waiting job displaces running jobs of its own
tenant queue whose priority is lower (Kueue's `withinClusterQueue: LowerPriority`,
Slurm's preemption by priority within a partition).

The lowest priority goes first, then among equals those that lose the least work
(shortest run since start or last checkpoint); none younger than `min_run_s`. The job
takes what its victims free for its own queue, so no queue gains against its
guarantee. A job its queue's max (or its user's limit) holds back stops lower jobs of
its queue (of its own, for the user's limit) until it is within the limit and has room
(`make_room_over_limit`): a full queue is where priorities matter most. No built-in
profile names it: priorities are the users' to set, and a cluster opts in to their
preempting by naming it in a profile (`make_room = ["reclaim", "priority"]`).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import takewhile

from schedd.policy.admit import quota, user_limit
from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    by_work_at_risk,
    fewest_victims,
    known_to_fail,
    protection_ends,
    remember_failure,
    unprotected,
)
from schedd.policy.resources import NOTHING
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def _by_priority(view: View) -> dict[str, list[tuple[int, PlacedJob]]]:
    """Per tenant queue, its placed jobs as (priority, job): lowest priority first, then
    least work lost (once per cycle: the plan's own victims are `view.decided`)."""
    key = ("priority_victims",)
    known = view.memo.get(key)
    if known is None:
        rows: dict[str, list[tuple[int, int, PlacedJob]]] = defaultdict(list)
        for i, job in enumerate(by_work_at_risk(view)):
            rows[job.queue].append((job.priority, i, job))
        known = view.memo[key] = {q: [(p, j) for p, _, j in sorted(r)] for q, r in rows.items()}
    return known  # type: ignore[return-value]


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    rows = _by_priority(view).get(job.queue)
    if not rows or rows[0][0] >= job.priority:
        return None  # nothing in its queue ranks below it
    # A job that found no victims leaves none for one of the same request and a
    # priority no higher (its candidates are fewer), for the rest of the cycle; with
    # GPUs reserved, whether a job may use them depends on its own estimate.
    memo = ("priority", job.queue, job.request, job.job_id if view.reservations else None)
    if known_to_fail(view, memo, -job.priority):
        return None
    ranked = [v for _, v in takewhile(lambda row: row[0] < job.priority, rows)]
    victims = fewest_victims(job, view, ranked, place)
    if victims is None:
        remember_failure(view, memo, -job.priority)
        return None
    return Eviction(
        victims, f"preempted: job {job.job_id} of priority {job.priority} needs the GPUs"
    )


def make_room_over_limit(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    """For a job its queue's max or its user's limit holds back: the lowest jobs of its
    queue below its priority (only its user's own count for the user's limit) whose
    stopping brings it within every limit, and as many more as it needs for room. (Jobs
    on their way out no longer count against a limit: `placed_totals`.)"""
    rows = _by_priority(view).get(job.queue)
    if not rows or rows[0][0] >= job.priority:
        return None
    wants, freed, mine = job.request.resources(), NOTHING, job.request.gpus

    def over_user_limit() -> bool:
        return user_limit.refusal(job.queue, job.user, mine, view) is not None

    def within() -> bool:
        # Each max of its lineage counts what the queue holds less its victims, plus
        # the job: a queue over its max already (a max lowered since) needs more gone.
        return quota.refusal(job.queue, wants, view, less=freed) is None and not over_user_limit()

    ranked = unprotected([v for _, v in takewhile(lambda r: r[0] < job.priority, rows)], view)
    needed: list[PlacedJob] = []
    # The user's own jobs while over the user's limit (they count against both limits),
    # then anyone's while over the queue's max.
    for own in (True, False):
        for victim in ranked:
            if within() or (own and not over_user_limit()):
                break
            if (own and victim.user != job.user) or victim in needed:
                continue
            needed.append(victim)
            freed = freed + victim.request.resources()
            mine -= victim.request.gpus if victim.user == job.user else 0
    if not needed or not within():
        return None  # not even all of them bring it within its limits
    # Those first: room with them gone, and more where that is not enough.
    victims = fewest_victims(job, view, [*needed, *(v for v in ranked if v not in needed)], place)
    if victims is None:
        return None
    chosen = {v.job_id for v in needed}
    return Eviction(
        (*needed, *(v for v in victims if v.job_id not in chosen)),
        f"preempted: job {job.job_id} of priority {job.priority} needs its queue's share",
    )


def recheck_at(view: View) -> float | None:
    """When a running job comes of age, while a job of a higher priority than it waits
    in its queue: only then can such a preemption come with time alone."""
    lowest = {q: rows[0][0] for q, rows in _by_priority(view).items() if rows}
    if any(j.priority > lowest.get(j.queue, j.priority) for j in view.snapshot.pending):
        return protection_ends(view)
    return None
