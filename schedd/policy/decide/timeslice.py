"""Time-slicing's turns (Gandiva): suspended jobs come back by weighted round-robin.

Once per cycle, before any pending job is considered, each suspended job (the one
paused longest first) resumes on its GPUs where they are free, or where every job
running on them has had its turn (`timeslice_s` times its queue's weight since it
started or resumed): those are suspended in its place. A GPU still held by a job that
may not be paused (being stopped, opportunistic, across nodes) keeps it waiting.
"""

from __future__ import annotations

from schedd.policy.actions import Action, Resume, Suspend
from schedd.policy.snapshot import PlacedJob, holds_gpus
from schedd.policy.timeslice import (
    may_take_turns,
    packed_sets,
    suspended_jobs,
    turn_ends,
    turn_over,
)
from schedd.policy.view import View


def decide(view: View) -> list[Action]:
    waiting = suspended_jobs(view)
    if not waiting:
        return []
    holder = {u: j for j in view.snapshot.placed if holds_gpus(j) for u in j.gpu_uuids}
    actions: list[Action] = []
    for job in waiting:
        free = {g.uuid for s in job.shards for g in view.capacity[s.node_id].free_gpus}
        busy = [u for u in job.gpu_uuids if u not in free]
        if any(u not in holder for u in busy):
            continue  # not free, and no job the snapshot shows holds it: leave it be
        blockers = {holder[u].job_id: holder[u] for u in busy}
        if any(b.gpu_uuids in packed_sets(view) for b in blockers.values()):
            continue  # a pack runs there: its turn comes when the pack ends
        if not all(_turn_over(b, view) for b in blockers.values()):
            continue
        for blocker in blockers.values():
            view.suspend(blocker)
            actions.append(Suspend(blocker.job_id, f"its turn is over: job {job.job_id} resumes"))
        view.resume(job)
        for u in job.gpu_uuids:
            holder[u] = job
        by = f" (in place of {', '.join(sorted(blockers))})" if blockers else ""
        actions.append(Resume(job.job_id, f"its turn on its GPUs{by}"))
    return actions


def _turn_over(job: PlacedJob, view: View) -> bool:
    return may_take_turns(job) and job.job_id not in view.stopping and turn_over(job, view)


def recheck_at(view: View) -> float | None:
    """When the next running job's turn ends while a suspended job waits for its GPUs."""
    waiting = suspended_jobs(view)
    if not waiting:
        return None
    wanted = {u for j in waiting for u in j.gpu_uuids}
    ends = [
        t
        for j in view.snapshot.placed
        if j.state == "running"
        and not wanted.isdisjoint(j.gpu_uuids)
        and (t := turn_ends(j, view)) > view.now
    ]
    return min(ends, default=None)
