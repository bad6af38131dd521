"""Shortest job first by estimated run time; jobs with no estimate take the default."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return iter(sorted(pending, key=lambda j: (view.remaining(j), j.submitted_at, j.job_id)))
