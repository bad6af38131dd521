"""Preemption by Gittins index that never takes a job whose deadline is guaranteed and
close: a running job admitted by Chronus's program (`decide.deadlines`) with
`deadline_urgent_s` of slack or less is no victim, whatever its index.

The default's preemption serves short jobs first by taking GPUs from long runners;
a long runner with a deadline it can still just make would then miss it. Sparing it
only while it is urgent leaves the index to rule the rest of the time.
"""

from __future__ import annotations

from schedd.policy.make_room import gittins
from schedd.policy.make_room.deadline import urgent_slack
from schedd.policy.make_room.victims import Eviction, PlaceFn
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View

recheck_at = gittins.recheck_at


def _urgent(job: PlacedJob, view: View) -> bool:
    return urgent_slack(job, view) is not None


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    return gittins.make_room(job, view, place, spare=_urgent)
