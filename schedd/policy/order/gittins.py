"""Highest Gittins index of attained service first (`schedd.policy.gittins`).

With a history of finished jobs this is the order that minimises mean completion time
without knowing any job's run time: least-attained-service where run times are
heavy-tailed, first-come-first-served where they are alike, and whatever lies between
for the distribution at hand. Until enough jobs have finished to learn from, it is
2D-LAS (`order.las`). Equal indices (every job that has not run yet) go by submission.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.gittins import GittinsTable, table_for
from schedd.policy.order.las import level
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def table(view: View) -> GittinsTable | None:
    key = ("gittins_table",)
    if key not in view.memo:  # read for every job: once per cycle, not per lookup
        view.memo[key] = table_for(view.snapshot.service_history)
    return view.memo[key]  # type: ignore[return-value]


def rank(job: PendingJob | PlacedJob, view: View) -> float:
    """Lower runs first: minus the job's index, or its 2D-LAS queue with no history."""
    learned = table(view)
    if learned is None:
        return float(level(job, view))
    return -learned.index(view.attained(job))


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return iter(sorted(pending, key=lambda j: (rank(j, view), j.submitted_at, j.job_id)))
