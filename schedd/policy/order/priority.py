"""Higher priority first, then submission order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def key(job: PendingJob) -> tuple[int, float, str]:
    return (-job.priority, job.submitted_at, job.job_id)


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return iter(sorted(pending, key=key))
