"""Shortest job first by estimated run time; jobs with no estimate take the default."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    def remaining(job: PendingJob) -> tuple[float, float, str]:
        done = job.attained_s / job.request.gpus if job.request.gpus else 0.0
        return (max(view.estimate(job) - done, 0.0), job.submitted_at, job.job_id)

    return iter(sorted(pending, key=remaining))
