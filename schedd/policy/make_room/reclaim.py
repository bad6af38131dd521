"""Reclaim: a queue within its guarantee takes back GPUs that other queues borrowed.

Victims come only from queues holding more than their guarantee, and never so many
that one falls below its own; among them, those that lose the least work (shortest
run since start or last checkpoint) go first, and none younger than `min_run_s`.
"""

from __future__ import annotations

from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    fewest_victims,
    protected,
    work_at_risk,
)
from schedd.policy.resources import NOTHING
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def _borrowed(queue: str, view: View) -> int:
    held = view.allocated.get(queue, NOTHING).gpus
    return held - view.queue(queue).guarantee.gpus


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    own = view.queue(job.queue).guarantee.gpus
    held = view.allocated.get(job.queue, NOTHING).gpus
    if own <= 0 or held + job.request.gpus > own:
        return None  # only a queue within its guarantee reclaims
    memo = ("reclaim", job.queue, job.request)
    if memo in view.memo:
        return None  # found no victims earlier in this cycle; there are fewer now
    room: dict[str, int] = {}
    ranked: list[PlacedJob] = []
    for victim in sorted(view.snapshot.placed, key=lambda j: (work_at_risk(j, view), j.job_id)):
        if victim.queue == job.queue or protected(victim, view):
            continue
        left = room.setdefault(victim.queue, _borrowed(victim.queue, view))
        if victim.request.gpus > left:
            continue  # taking it would push its queue below its guarantee
        room[victim.queue] = left - victim.request.gpus
        ranked.append(victim)
    victims = fewest_victims(job, view, ranked, place)
    if victims is None:
        view.memo[memo] = None
        return None
    return Eviction(
        victims, f"preempted: queue {job.queue} reclaims its guarantee for job {job.job_id}"
    )
