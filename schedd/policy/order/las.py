"""2D-LAS (Tiresias): least attained service first, with no knowledge of run times.

Attained service is GPUs x time, so wide jobs age faster. Jobs fall into a few
priority queues by thresholds on it (discretised, so that jobs of similar service share
a queue and run in submission order instead of thrashing); a lower queue index runs first.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def level(job: PendingJob | PlacedJob, view: View) -> int:
    return bisect.bisect_right(view.settings.las_thresholds_gpu_s, view.attained(job))


def pending_level(view: View) -> Callable[[PendingJob], float]:
    """`level` for pending jobs, with the thresholds looked up once (a pending job's
    service is what its earlier attempts attained)."""
    thresholds = view.settings.las_thresholds_gpu_s
    return lambda j: float(bisect.bisect_right(thresholds, j.attained_s))


def placed_levels(view: View) -> list[tuple[PlacedJob, float, int]]:
    """Each placed job with its attained service and 2D-LAS queue, once per cycle."""
    key = ("las_levels",)
    known = view.memo.get(key)
    if known is None:
        thresholds = view.settings.las_thresholds_gpu_s
        known = view.memo[key] = [
            (job, attained, bisect.bisect_right(thresholds, attained))
            for job in view.snapshot.placed
            for attained in (view.attained(job),)
        ]
    return known  # type: ignore[return-value]


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return iter(sorted(pending, key=lambda j: (level(j, view), j.submitted_at, j.job_id)))
