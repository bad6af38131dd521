"""Time-slicing's turns (Gandiva): suspended jobs come back by weighted round-robin.

Once per cycle, before any pending job is considered, each suspended job (the one
paused longest first) resumes on its GPUs where they are free, or where every job
running on them has had its turn (`timeslice_s` times its queue's weight since it
started or resumed): those are suspended in its place. A GPU still held by a guaranteed
job that may not be paused (being stopped, across nodes) keeps it waiting; an
opportunistic job sharing a GPU does not (it shares with whoever holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from schedd.policy.actions import Action, Resume, Suspend
from schedd.policy.admit import quota, user_limit
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.timeslice import (
    free_uuids,
    holders,
    keeps_guarantees,
    may_take_turns,
    packed_gpus,
    suspended_jobs,
    turn_begins,
    turn_ends,
    turn_over,
    turns_begun_end,
)
from schedd.policy.view import View


def decide(view: View) -> list[Action]:
    waiting = suspended_jobs(view)
    if not waiting:
        return []
    holder = holders(view)
    actions: list[Action] = []
    for job in waiting:
        free = free_uuids(job, view)
        busy = [u for u in job.gpu_uuids if u not in free]
        if any(u not in holder for u in busy):
            continue  # not free, and no job the snapshot shows holds it: leave it be
        if not packed_gpus(view).isdisjoint(job.gpu_uuids):
            # A pack runs there: its turn comes when the pack ends. Where the packed
            # job's partner left, the packed job becomes their holder first
            # (`decide.pack`), though the GPUs look free: it holds none while packed.
            continue
        blockers = {holder[u].job_id: holder[u] for u in busy}
        if not all(_turn_over(b, view) for b in blockers.values()):
            continue
        if not _may_come_back(job, list(blockers.values()), view):
            continue
        if any(u in free for u in job.gpu_uuids) and _claimed(job, view):
            continue
        for blocker in blockers.values():
            view.suspend(blocker)
            actions.append(Suspend(blocker.job_id, f"its turn is over: job {job.job_id} resumes"))
        view.resume(job)
        turn_begins(job.queue, view)
        for u in job.gpu_uuids:
            holder[u] = job
        by = f" (in place of {', '.join(sorted(blockers))})" if blockers else ""
        actions.append(Resume(job.job_id, f"its turn on its GPUs{by}"))
    return actions


def _may_come_back(job: PlacedJob, blockers: Sequence[PlacedJob], view: View) -> bool:
    """Whether the job may hold its GPUs again in place of `blockers`: its queues stay
    within their maxes and its user within the limit, what the blockers of its own
    queue (and user) hold given back; and no other queue goes below its guarantee."""
    wants = job.request.resources()
    mine = 0
    for blocker in blockers:
        if blocker.queue == job.queue:
            wants = wants - blocker.request.resources()
            if blocker.user == job.user:
                mine += blocker.request.gpus
    return (
        quota.refusal(job.queue, wants, view) is None
        and user_limit.refusal(job.queue, job.user, job.request.gpus - mine, view) is None
        and keeps_guarantees(job.queue, blockers, view)
    )


def _claimed(job: PlacedJob, view: View) -> bool:
    """Whether a claimant (a job that GPUs on their way out were for, served first in
    the order) could take the job's free GPUs: they may be the very ones it stopped a
    job for, and a resume there would have it stop a second. The claimant goes first;
    the job's turn comes at a later plan."""
    claimants = _claimants(view)
    if not claimants:
        return False
    # Free GPUs only: whose stops the jobs on their way out were is not known, and an
    # unrelated leaver would keep the job paused for nothing. A claimant's room is held
    # at its full count.
    node = view.capacity[job.shards[0].node_id]
    free, size = len(node.free_gpus), len(node.node.gpus)
    return any(
        c.request.gpus <= free or (view.snapshot.multi_node and c.request.gpus > size)
        for c in claimants
    )


def _claimants(view: View) -> list[PendingJob]:
    wanted = view.snapshot.claimants
    if not wanted:
        return []
    key = ("timeslice_claimants",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = [j for j in view.snapshot.pending if j.job_id in wanted]
    return known  # type: ignore[return-value]


def _turn_over(job: PlacedJob, view: View) -> bool:
    return may_take_turns(job) and not view.decided(job.job_id) and turn_over(job, view)


def recheck_at(view: View) -> float | None:
    """When the next running job's turn ends while a suspended job waits for its GPUs,
    or a turn this plan began (it paused a job for a newcomer, or rotated) ends."""
    begun = turns_begun_end(view)
    waiting = suspended_jobs(view)
    if not waiting:
        return begun
    wanted = {u for j in waiting for u in j.gpu_uuids}
    ends = [
        t
        for j in view.snapshot.placed
        if j.state == "running"
        and not wanted.isdisjoint(j.gpu_uuids)
        and (t := turn_ends(j, view)) > view.now
    ]
    if begun is not None:
        ends.append(begun)
    return min(ends, default=None)
