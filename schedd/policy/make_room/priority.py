"""Priority preemption within a queue: a waiting job displaces running jobs of its own
tenant queue whose priority is lower (Kueue's `withinClusterQueue: LowerPriority`,
Slurm's preemption by priority within a partition).

The lowest priority goes first, then among equals those that lose the least work
(shortest run since start or last checkpoint); none younger than `min_run_s`. The GPUs
stay in the queue, so no queue gains or loses against its guarantee. No built-in
profile names it: priorities are the users' to set, and a cluster opts in to their
preempting by naming it in a profile (`make_room = ["reclaim", "priority"]`).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import takewhile

from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    by_work_at_risk,
    fewest_victims,
    known_to_fail,
    protection_ends,
    remember_failure,
)
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
    # priority no higher (its candidates are fewer), for the rest of the cycle.
    memo = ("priority", job.queue, job.request)
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


def recheck_at(view: View) -> float | None:
    """When a running job comes of age, while a job of a higher priority than it waits
    in its queue: only then can such a preemption come with time alone."""
    lowest = {q: rows[0][0] for q, rows in _by_priority(view).items() if rows}
    if any(j.priority > lowest.get(j.queue, j.priority) for j in view.snapshot.pending):
        return protection_ends(view)
    return None
