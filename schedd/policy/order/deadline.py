"""Chronus's order: urgent guaranteed deadlines first, least slack first; then
shortest remaining time first (SRTF) for everyone else: guaranteed jobs with slack to
spare, best-effort jobs and refused deadlines alike.

Slack is the deadline less now less the remaining run time: the job with the least can
wait the least. A guaranteed job is urgent at `deadline_urgent_s` of slack or less; until
then it waits its turn, and as its slack shrinks it moves to the front. Remaining times
come from the estimates (`View.remaining`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.make_room.deadline import urgent_slack
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    def key(job: PendingJob) -> tuple[int, float, float, str]:
        if (left := urgent_slack(job, view)) is not None:
            return (0, left, job.submitted_at, job.job_id)
        return (1, view.remaining(job), job.submitted_at, job.job_id)

    return iter(sorted(pending, key=key))
