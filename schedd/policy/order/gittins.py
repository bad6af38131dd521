"""Highest Gittins index of attained service first (`schedd.policy.gittins`).

With a history of finished jobs this is the order that minimises mean completion time
without knowing any job's run time: least-attained-service where run times are
heavy-tailed, first-come-first-served where they are alike, and whatever lies between
for the distribution at hand. Until enough jobs have finished to learn from, it is
2D-LAS (`order.las`). Equal indices (every job that has not run yet) go by submission.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence

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
    if isinstance(job, PlacedJob) and job.attained_as_of is not None:
        return _running_rank(job, view, learned)[0]
    return -learned.index(view.attained(job))


def placed_rank(job: PlacedJob, view: View, learned: GittinsTable) -> tuple[float, float]:
    """A placed job's rank under a table, and until when (from now) it holds for this
    job object: a running job's rank changes as its service grows, any other's not."""
    if job.attained_as_of is not None:
        return _running_rank(job, view, learned)
    return -learned.index(view.attained(job)), math.inf


def pending_rank(view: View) -> Callable[[PendingJob], float]:
    """`rank` for pending jobs, with the table looked up once: it sorts every pending
    job in every cycle (a pending job's service is what earlier attempts attained)."""
    learned = table(view)
    if learned is None:
        thresholds = view.settings.las_thresholds_gpu_s
        return lambda j: float(bisect.bisect_right(thresholds, j.attained_s))
    points, indices = learned.points, learned.indices
    return lambda j: -indices[bisect.bisect_right(points, j.attained_s) - 1]


# Per running job (by id; the job held so that the id stays its own): its rank under a
# table and until when it holds. The index is a step function of service and a running
# job's service grows at its GPU count per second from `attained_as_of`, so the rank
# holds until the next step; this is asked of every running job at every plan.
_running: dict[int, tuple[PlacedJob, GittinsTable, float, float, float]] = {}
_RUNNING_KEPT = 50_000  # entries kept before those of jobs gone are dropped


def _running_rank(job: PlacedJob, view: View, learned: GittinsTable) -> tuple[float, float]:
    """Its rank and until when it holds, kept as (job, table, rank, from, until): it
    holds for `now` in [from, until), while the job's service stays on one step."""
    now = view.now
    hit = _running.get(id(job))
    if hit is not None and hit[0] is job and hit[1] is learned and hit[3] <= now < hit[4]:
        return hit[2], hit[4]
    attained = view.attained(job)
    step = bisect.bisect_right(learned.points, attained)
    value = -learned.indices[step - 1]
    until = math.inf
    if step < len(learned.points) and job.request.gpus > 0 and job.state == "running":
        until = now + (learned.points[step] - attained) / job.request.gpus
    if len(_running) >= _RUNNING_KEPT:
        placed = {id(j) for j in view.snapshot.placed}
        for key in [k for k in _running if k not in placed]:
            del _running[key]
    _running[id(job)] = (job, learned, value, now, until)
    return value, until


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    ranked = pending_rank(view)
    return iter(sorted(pending, key=lambda j: (ranked(j), j.submitted_at, j.job_id)))
