"""A queue's max (borrowing limit), checked at every level of the queue's lineage."""

from __future__ import annotations

from schedd.policy.actions import Wait
from schedd.policy.queues import lineage
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View

_UNSEEN = object()  # None is an answer: the job is admitted


def admit(job: PendingJob, view: View) -> Wait | None:
    # The answer only changes when the plan changes the view: many pending jobs of one
    # queue ask for the same.
    key = ("quota", job.queue, job.request, view.generation)
    wait = view.memo.get(key, _UNSEEN)
    if wait is _UNSEEN:
        wait = view.memo[key] = _admit(job, view)
    return wait  # type: ignore[return-value]


def _admit(job: PendingJob, view: View) -> Wait | None:
    return refusal(job.queue, job.request.resources(), view)


def refusal(queue: str, wants: Resources, view: View, less: Resources = NOTHING) -> Wait | None:
    """Why `queue` may not hold `wants` more (a max of its lineage), or None; `less`:
    with that much of what it holds given back (jobs a plan stops for it)."""
    for q in lineage(queue):
        limit = view.queue(q).max
        if limit is None:
            continue
        over = (view.allocated.get(q, NOTHING) - less).exceeds_with(wants, limit)
        if over is not None:
            return Wait("queue_max", f"queue {q} would exceed its max: {over}")
    return None
