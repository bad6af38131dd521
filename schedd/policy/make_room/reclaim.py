"""Reclaim: a queue within its guarantee takes back GPUs that other queues borrowed.

Queues nest (`org/team`), so a guarantee may be a team's own or its org's: a job
reclaims for the deepest queue of its lineage that the job leaves within its
guarantee, and takes only from jobs outside that queue (a job of a sibling team frees
nothing for their org). Victims come only from queues holding more than their
guarantee, at every level of the victim's lineage, and never so many that one falls
below its own; a level the claimant's job counts in too gets its GPUs back. Among
them, those that lose the least work (shortest run since start or last checkpoint) go
first, and none younger than `min_run_s`.

Reclaim is in GPUs. A guarantee of CPUs, memory or GPU memory (where set, above 0)
counts too, both ways: a job reclaims only while its queue stays within each of them,
and no victim takes a queue below any of them.
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
from schedd.policy.queues import lineage
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def _borrowed(queue: str, view: View) -> int:
    held = view.allocated.get(queue, NOTHING).gpus
    return held - view.queue(queue).guarantee.gpus


def _claimed(queue: str, view: View) -> Resources:
    """What this plan's claimants of the queue will hold, not counted in it yet."""
    return view.claimed.get(queue, NOTHING) if view.claimed else NOTHING


def _reclaiming(job: PendingJob, view: View) -> str | None:
    """The deepest queue of the job's lineage with a guarantee that still holds the job:
    the one it reclaims for. None: no queue of its lineage is within its guarantee."""
    for queue in reversed(lineage(job.queue)):
        claimed = _claimed(queue, view)
        room = -_borrowed(queue, view) - claimed.gpus
        guarantee = view.queue(queue).guarantee
        if guarantee.gpus > 0 and job.request.gpus <= room:
            # Within its guarantees of CPUs, memory and GPU memory too, with the job.
            held = view.allocated.get(queue, NOTHING) + claimed + job.request.resources()
            if held.within_others(guarantee):
                return queue
    return None


def _inside(queue: str, parent: str) -> bool:
    return queue == parent or queue.startswith(parent + "/")


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


def _candidates(job: PendingJob, reclaiming: str, view: View) -> list[PlacedJob]:
    """Jobs outside `reclaiming` that could go, least work lost first, as long as no
    queue falls below its guarantee (the same for every job of that queue and size until
    the view changes). Each queue's room is its own, at each level: its jobs are chosen
    in order until it has none, and a queue that borrowed less than its smallest job
    gives none (the usual case). A level the job counts in too (an org above both teams)
    gets the job's GPUs back, so its room grows by them."""
    gpus = job.request.gpus
    key = ("reclaim_candidates", job.queue, reclaiming, job.request, view.generation)
    known = view.memo.get(key)
    if known is not None:
        return known  # type: ignore[return-value]
    own_lineage = lineage(job.queue)
    left: dict[str, int] = {}

    def room(level: str) -> int:
        found = left.get(level)
        if found is None:
            found = left[level] = _borrowed(level, view) + (gpus if level in own_lineage else 0)
        return found

    # What each level that guarantees CPUs, memory or GPU memory holds (with the job
    # where it counts in too), less the victims chosen so far: it must keep them.
    holds: dict[str, Resources] = {}
    credit = job.request.resources()

    def held(level: str) -> Resources:
        found = holds.get(level)
        if found is None:
            more = credit if level in own_lineage else NOTHING
            found = holds[level] = view.allocated.get(level, NOTHING) + more
        return found

    chosen: list[tuple[int, PlacedJob]] = []
    for victim_queue, (fewest, jobs) in _old_enough(view).items():
        if _inside(victim_queue, reclaiming):
            continue
        levels = lineage(victim_queue)
        # Every level of the lineage loses what its jobs give, so the least room
        # among them stays the least.
        limit = min(room(level) for level in levels)
        if fewest > limit:
            continue
        guarded = [lv for lv in levels if view.queue(lv).guarantee.sets_others()]
        given, given_others = 0, NOTHING
        for i, victim in jobs:
            taken = victim.request.gpus
            if given + taken > limit:
                continue  # taking it would push a queue below its guarantee
            if view.decided(victim.job_id):
                continue  # already stopping, or moved, in this plan
            if guarded:
                after = given_others + victim.request.resources()
                if not all(
                    (held(lv) - after).keeps(view.queue(lv).guarantee, gpus=False) for lv in guarded
                ):
                    continue  # below a guarantee of CPUs, memory or GPU memory
                given_others = after
            given += taken
            chosen.append((i, victim))
        for level in levels:
            left[level] -= given
        for level in guarded:
            holds[level] = held(level) - given_others
    chosen.sort(key=itemgetter(0))
    ranked = [victim for _, victim in chosen]
    view.memo[key] = ranked
    return ranked


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    reclaiming = _reclaiming(job, view)
    if reclaiming is None:
        return None  # only a queue within its guarantee reclaims
    # With GPUs reserved, whether a job may use them depends on its own estimate.
    memo = ("reclaim", job.queue, job.request, job.job_id if view.reservations else None)
    if memo in view.memo:
        return None  # found no victims earlier in this cycle; there are fewer now
    victims = fewest_victims(job, view, _candidates(job, reclaiming, view), place)
    if victims is None:
        view.memo[memo] = None
        return None
    return Eviction(
        victims, f"preempted: queue {reclaiming} reclaims its guarantee for job {job.job_id}"
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
    if below and any(not below.isdisjoint(lineage(j.queue)) for j in view.snapshot.pending):
        return protection_ends(view)
    return None
