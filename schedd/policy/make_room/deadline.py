"""A job with a guaranteed deadline and little slack left preempts others to start now.

Only an urgent job (no more slack than `deadline_urgent_s`) preempts. Victims are, first,
running jobs whose deadline is not guaranteed (best-effort jobs and refused deadlines),
those that lose the least work first; then guaranteed jobs with slack to spare: ones
that would still meet their own deadline after waiting for this job to finish and then
a lease (`min_run_s`), the most slack first. None is younger than a lease. A
guaranteed gang of 8 GPUs is thus not kept from a whole node by 1-GPU guaranteed jobs
that could as well run after it.
"""

from __future__ import annotations

from schedd.policy.decide.deadlines import admitted
from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    by_work_at_risk,
    fewest_victims,
    protection_ends,
)
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def slack(job: PendingJob | PlacedJob, view: View) -> float:
    """How long the job could wait and still meet its deadline (by its estimate)."""
    assert job.deadline is not None
    return job.deadline - view.now - view.remaining(job)


def urgent_slack(job: PendingJob | PlacedJob, view: View) -> float | None:
    """The slack of a guaranteed job that is urgent (`deadline_urgent_s` or less); None
    for any other job."""
    if admitted(job, view) and (left := slack(job, view)) <= view.settings.deadline_urgent_s:
        return left
    return None


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    if urgent_slack(job, view) is None:
        return None  # no guarantee, or it can still wait its turn
    can_wait = view.remaining(job) + view.settings.min_run_s
    memo = ("deadline", job.request, can_wait)
    if memo in view.memo:
        return None  # found no victims earlier in this cycle; there are fewer now
    ranked = [v for v in by_work_at_risk(view) if not admitted(v, view)]
    spare = [v for v in view.snapshot.placed if admitted(v, view) and slack(v, view) > can_wait]
    ranked += sorted(spare, key=lambda v: (-slack(v, view), v.job_id))
    victims = fewest_victims(job, view, ranked, place) if ranked else None
    if victims is None:
        view.memo[memo] = None
        return None
    return Eviction(victims, f"preempted: job {job.job_id} has a guaranteed deadline to meet")


def recheck_at(view: View) -> float | None:
    """When a waiting guaranteed job becomes urgent (its slack, which shrinks with time
    alone, falls to `deadline_urgent_s`: it then goes first and may preempt), or a
    running job comes of age."""
    urgent_s = view.settings.deadline_urgent_s
    times = [
        t
        for job in view.snapshot.pending
        if admitted(job, view) and (t := view.now + slack(job, view) - urgent_s) > view.now
    ]
    ends = protection_ends(view)
    if ends is not None:
        times.append(ends)
    return min(times, default=None)
