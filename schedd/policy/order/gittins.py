"""Highest Gittins index of attained service first (`schedd.policy.gittins`).

With a history of finished jobs this is the order that minimises mean completion time
without knowing any job's run time: least-attained-service where run times are
heavy-tailed, first-come-first-served where they are alike, and whatever lies between
for the distribution at hand. Until `gittins_min_finished` jobs have finished to learn
from, it is 2D-LAS (`order.las`). Equal indices (every job that has not run yet) go by submission.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence

from schedd.policy.gittins import GittinsTable, table_for
from schedd.policy.order.las import level, pending_level
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def table(view: View) -> GittinsTable | None:
    key = ("gittins_table",)
    if key not in view.memo:  # read for every job: once per cycle, not per lookup
        history = view.snapshot.service_history
        view.memo[key] = table_for(history, view.settings.gittins_min_finished)
    return view.memo[key]  # type: ignore[return-value]


def rank(job: PendingJob | PlacedJob, view: View) -> float:
    """Lower runs first: minus the job's index, or its 2D-LAS queue with no history."""
    learned = table(view)
    if learned is None:
        return float(level(job, view))
    return -learned.index(view.attained(job))


def placed_rank(job: PlacedJob, view: View, learned: GittinsTable) -> tuple[float, float]:
    """A placed job's rank under a table, and until when (from now) it holds for this
    job object: the index is a step function of service, and a running job's service
    grows at its GPU count per second from `attained_as_of`; any other's stays."""
    attained = view.attained(job)
    step = bisect.bisect_right(learned.points, attained)
    value = -learned.indices[step - 1]
    growing = job.attained_as_of is not None and job.state == "running" and job.request.gpus > 0
    if not growing or step >= len(learned.points):
        return value, math.inf
    return value, view.now + (learned.points[step] - attained) / job.request.gpus


def pending_rank(view: View) -> Callable[[PendingJob], float]:
    """`rank` for pending jobs, with the table looked up once: it sorts every pending
    job in every cycle (a pending job's service is what earlier attempts attained)."""
    learned = table(view)
    if learned is None:
        return pending_level(view)
    points, indices = learned.points, learned.indices
    return lambda j: -indices[bisect.bisect_right(points, j.attained_s) - 1]


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    ranked = pending_rank(view)
    return iter(sorted(pending, key=lambda j: (ranked(j), j.submitted_at, j.job_id)))
