"""Time-slicing under oversubscription (Gandiva): a job that finds no free GPUs starts
at once on the GPUs of a running job of the same GPU count (Gandiva's affinity), which
is suspended at its next mini-batch boundary; from then on the two take turns
(`decide.timeslice`). A new job gets early feedback instead of queueing.

The partner is a running guaranteed job on one node, with the job's GPU count, whose
turn is not protected (a job that resumed in this attempt runs its turn to the end, and
a newcomer waits till then; one that has run since its start may be paused at once,
for the newcomer's early feedback) and whose GPUs fewer than
`timeslice_max` jobs take turns on; the least shared first, then the one whose turn
began longest ago. Nobody loses work: a suspended job keeps its process. A job of a
queue within its guarantee is no partner for a job of another queue
(`keeps_guarantees`): a borrower takes no turns from it.
"""

from __future__ import annotations

from schedd.policy.make_room.victims import Eviction, PlaceFn
from schedd.policy.placement import has_room
from schedd.policy.snapshot import PendingJob, PlacedJob, holds_gpus
from schedd.policy.timeslice import (
    group_sizes,
    keeps_guarantees,
    may_take_turns,
    packed_sets,
    since,
    turn_begins,
    turn_over,
    turn_over_at,
)
from schedd.policy.view import View


def _partners(view: View, gpus: int) -> list[PlacedJob]:
    """Running jobs of `gpus` GPUs another job could take turns with, best first (once
    per cycle: the plan's own choices are `view.decided`)."""
    key = ("timeslice_partners", gpus)
    known = view.memo.get(key)
    if known is None:
        sizes = group_sizes(view)
        known = view.memo[key] = sorted(
            (
                j
                for j in view.snapshot.placed
                if j.request.gpus == gpus
                and _joinable(j, view)
                and j.shards[0].node_id in view.capacity
                and not _turn_protected(j, view)
            ),
            key=lambda j: (sizes[j.gpu_uuids], since(j), j.job_id),
        )
    return known  # type: ignore[return-value]


def _joinable(job: PlacedJob, view: View) -> bool:
    """A job that may take turns, on GPUs with room for one more and no pack."""
    sizes, packed = group_sizes(view), packed_sets(view)
    return (
        may_take_turns(job)
        and 1 + sizes[job.gpu_uuids] < view.settings.timeslice_max
        and job.gpu_uuids not in packed
        and not view.on_gpus_out(job)
    )


def _turn_protected(job: PlacedJob, view: View) -> bool:
    """A job that resumed in this attempt keeps its turn to the end: a stream of
    newcomers would otherwise pause it again and again. One that has run since its
    start may be paused at once (the newcomer's early feedback, as in Gandiva)."""
    resumed = job.state_since is not None and job.state_since > view.started(job)
    return resumed and not turn_over(job, view)


def _fits_beside(job: PendingJob, partner: PlacedJob, view: View) -> bool:
    """Whether the node has the job's CPUs and memory with the partner still there
    (a suspended job keeps its own; what a reservation there counts on is not the
    job's: `View.room`), and none of the GPUs is held for another job."""
    shard = partner.shards[0]
    if job.request.node_id is not None and job.request.node_id != shard.node_id:
        return False
    if not has_room(*view.room(shard.node_id, job), job.request):
        return False
    want = job.request.gpu_memory_mib
    if want is not None and any(view.gpu(u).memory_mib < want for u in shard.gpu_uuids):
        return False
    for uuid in shard.gpu_uuids:
        held = view.reserved.get(uuid)
        if held is not None and held.job_id != job.job_id:
            return False
    # A reservation on the node counts on the partner's GPUs once it ends: a newcomer
    # outlasting the reservation's start would keep them.
    return all(
        shard.node_id not in r.node_ids or view.may_use(r, job) for r in view.reservations.values()
    )


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    if view.settings.timeslice_max < 2 or not holds_gpus(job) or job.request.gpus <= 0:
        return None
    # Partners only go (to the plan's choices) and capacity only shrinks in a cycle: a
    # request that found none finds none for the rest of it (but for a job with GPUs
    # reserved for it, which others of its request may not use).
    none_for = ("timeslice_none", job.request, job.job_id if view.reservations else None)
    if none_for in view.memo:
        return None
    guarded = False  # a partner was turned down for its queue's guarantee alone
    for partner in _partners(view, job.request.gpus):
        if view.decided(partner.job_id) or not _fits_beside(job, partner, view):
            continue
        if not keeps_guarantees(job.queue, (partner,), view):
            guarded = True  # its queue may hold more later in the plan: no "none"
            continue
        turn_begins(job.queue, view)
        return Eviction(
            (partner,),
            f"time-sliced: job {job.job_id} takes turns with it on its GPUs",
            launch_on=partner.shards,
        )
    if not guarded:
        view.memo[none_for] = True
    return None


def recheck_at(view: View) -> float | None:
    """When the next resumed job's turn ends: a job waiting for GPUs may take turns
    with it then."""
    if view.settings.timeslice_max < 2:
        return None
    ends = [
        turn_over_at(j, view)
        for j in view.snapshot.placed
        if _joinable(j, view) and _turn_protected(j, view)  # protected: its end is ahead
    ]
    return min(ends, default=None)
