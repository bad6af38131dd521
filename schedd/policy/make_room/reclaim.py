"""Reclaim: a queue within its guarantee takes back GPUs that other queues borrowed.

Victims come only from queues holding more than their guarantee, and never so many
that one falls below its own; among them, those that lose the least work (shortest
run since start or last checkpoint) go first, and none younger than `min_run_s`.
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

from schedd.policy.make_room.victims import (
    Eviction,
    PlaceFn,
    by_work_at_risk,
    fewest_victims,
    protected,
    protection_ends,
)
from schedd.policy.resources import NOTHING
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def _borrowed(queue: str, view: View) -> int:
    held = view.allocated.get(queue, NOTHING).gpus
    return held - view.queue(queue).guarantee.gpus


class _OldEnough(NamedTuple):
    """A queue's placed jobs that may be preempted this cycle."""

    fewest_gpus: int  # the fewest GPUs one of them holds
    jobs: list[tuple[int, PlacedJob]]  # each with its place in the order of least work lost


def _old_enough(view: View) -> dict[str, _OldEnough]:
    """Placed jobs not protected at the start of the cycle, by queue (age protection
    holds for the whole cycle; only the plan's own victims join `stopping`)."""
    key = ("reclaim_old_enough",)
    known = view.memo.get(key)
    if known is None:
        by_queue: dict[str, list[tuple[int, PlacedJob]]] = {}
        for i, v in enumerate(by_work_at_risk(view)):
            if not protected(v, view):
                by_queue.setdefault(v.queue, []).append((i, v))
        known = view.memo[key] = {
            q: _OldEnough(min(v.request.gpus for _, v in jobs), jobs)
            for q, jobs in by_queue.items()
        }
    return known  # type: ignore[return-value]


def _candidates(queue: str, view: View) -> list[PlacedJob]:
    """Jobs of other queues that could go, least work lost first, as long as no queue
    falls below its guarantee (the same for every job of `queue` until the view changes).
    Each queue's room is its own: its jobs are chosen in order until it has none, and a
    queue that borrowed less than its smallest job gives none (the usual case)."""
    key = ("reclaim_candidates", queue, view.generation)
    known = view.memo.get(key)
    if known is not None:
        return known  # type: ignore[return-value]
    chosen: list[tuple[int, PlacedJob]] = []
    for victim_queue, (fewest, jobs) in _old_enough(view).items():
        left = _borrowed(victim_queue, view)
        if victim_queue == queue or fewest > left:
            continue
        for i, victim in jobs:
            if victim.request.gpus > left:
                continue  # taking it would push its queue below its guarantee
            if view.decided(victim.job_id):
                continue  # already stopping, or moved, in this plan
            left -= victim.request.gpus
            chosen.append((i, victim))
    chosen.sort(key=itemgetter(0))
    ranked = [victim for _, victim in chosen]
    view.memo[key] = ranked
    return ranked


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    own = view.queue(job.queue).guarantee.gpus
    held = view.allocated.get(job.queue, NOTHING).gpus
    if own <= 0 or held + job.request.gpus > own:
        return None  # only a queue within its guarantee reclaims
    memo = ("reclaim", job.queue, job.request)
    if memo in view.memo:
        return None  # found no victims earlier in this cycle; there are fewer now
    victims = fewest_victims(job, view, _candidates(job.queue, view), place)
    if victims is None:
        view.memo[memo] = None
        return None
    return Eviction(
        victims, f"preempted: queue {job.queue} reclaims its guarantee for job {job.job_id}"
    )


def recheck_at(view: View) -> float | None:
    """When a running job comes of age, while a queue with jobs waiting holds less
    than its guarantee: only then can a reclaim come with time alone (what a queue
    holds changes only at events: a launch, an end)."""
    below = {
        name
        for name, spec in view.queues.items()
        if view.allocated.get(name, NOTHING).gpus < spec.guarantee.gpus
    }
    if below and any(j.queue in below for j in view.snapshot.pending):
        return protection_ends(view)
    return None
