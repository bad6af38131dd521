"""AntMan's kinds over time: a guaranteed job that waited too long runs opportunistically
meanwhile, and goes back to guaranteed once it may hold GPUs of its own.

After the cycle's decisions:
- a guaranteed job still waiting `opportunistic_after_s` after its submission (not
  after its last requeue: a preempted job that waited long before converts at once),
  for room or for its queue's max or user limit (an opportunistic job counts against
  neither), becomes opportunistic unless its spec says `stay_guaranteed`, it has a
  deadline (slowed beside a guaranteed job, it could miss it), or it needs more GPUs
  than a node has; the next plan places it on little-used GPUs
  (`place.share`), free ones among them;
- a running opportunistic job is upgraded to guaranteed when none of its GPUs has a
  guaranteed holder at the end of the cycle (the plan put every guaranteed job it
  could, and those GPUs count as free for them: no waiting job could use them now),
  none is reserved for a blocked gang, no job waits for a preemption of this cycle
  (its room may count on them), and its queue's max and the user limit admit it. The
  job keeps its process; only the agent's treatment of it changes (no throttling, no
  memory cap).

A waiting job made opportunistic is considered as guaranteed first in every cycle (the
framework does it): where room or a reclaim is there for it, it gets its guarantee back
(`SetKind`) and starts, or waits for its victims, as guaranteed.
"""

from __future__ import annotations

from schedd.policy.actions import Action, Plan, SetKind
from schedd.policy.queues import lineage
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC, PendingJob, PlacedJob
from schedd.policy.view import View

# Waits that sharing does not shorten: a job no node could ever run, none connected, or
# one whose room is being made by preemptions now.
NOT_FOR_SHARING = frozenset({"too_large", "no_nodes", "preempting"})


def anticipate(view: View, plan: Plan) -> list[Action]:
    after = view.settings.opportunistic_after_s
    largest = view.largest_node_gpus()
    actions: list[Action] = []
    reasons: dict[tuple[int, str], str] = {}  # a backlog's jobs mostly share their words
    waiting, now = plan.waiting, view.now
    for job in view.snapshot.pending:
        wait = waiting.get(job.job_id)
        if wait is None or job.kind == OPPORTUNISTIC or not _may_turn(job):
            continue
        if job.request.gpus > largest:
            continue  # an opportunistic job runs on one node
        waited = now - job.submitted_at
        if wait.code not in NOT_FOR_SHARING and waited >= after:
            said = (round(waited / 60), wait.code)
            reason = reasons.get(said)
            if reason is None:
                reason = reasons[said] = (
                    f"waited {said[0]} min (the mark is {after / 60:g} min; {wait.code}):"
                    " runs on little-used GPUs until it may hold GPUs of its own"
                )
            actions.append(SetKind(job.job_id, OPPORTUNISTIC, reason))
    if any(w.code == "preempting" for w in plan.waiting.values()):
        # Room being made counts on free GPUs besides the victims', opportunistic-held
        # ones among them: upgrading one now could take what a preemption is for.
        return actions
    added: dict[str | tuple[str, str], Resources] = {}  # by queue, and by (queue, user)
    for running in view.snapshot.placed:
        if (
            running.kind == OPPORTUNISTIC
            and running.state == "running"
            and _room_for(running, view, added)
        ):
            actions.append(
                SetKind(running.job_id, GUARANTEED, "its GPUs have no guaranteed holder now")
            )
    return actions


def _room_for(job: PlacedJob, view: View, added: dict[str | tuple[str, str], Resources]) -> bool:
    """Its GPUs are free for a guaranteed job and its queue admits one more: then count it."""
    for shard in job.shards:
        cap = view.capacity.get(shard.node_id)
        if cap is None:
            return False
        free = {g.uuid for g in cap.free_gpus}
        if not free.issuperset(shard.gpu_uuids) or any(u in view.reserved for u in shard.gpu_uuids):
            return False  # a guaranteed holder, or held for a blocked gang
    wants = job.request.resources()
    for q in lineage(job.queue):
        limit = view.queue(q).max
        held = view.allocated.get(q, NOTHING) + added.get(q, NOTHING)
        if limit is not None and held.exceeds_with(wants, limit) is not None:
            return False
    user = (job.queue, job.user)
    spec = view.queue(job.queue)
    if spec.user_limit_factor is not None and spec.guarantee.gpus > 0:
        held_gpus = (view.user_allocated.get(user, NOTHING) + added.get(user, NOTHING)).gpus
        if held_gpus + job.request.gpus > spec.user_limit_factor * spec.guarantee.gpus:
            return False
    for q in lineage(job.queue):
        added[q] = added.get(q, NOTHING) + wants
    added[user] = added.get(user, NOTHING) + wants
    return True


def _may_turn(job: PendingJob) -> bool:
    """Whether waiting long may make the job opportunistic: not if its user said it
    stays guaranteed, nor if it has a deadline to meet."""
    return not job.stay_guaranteed and job.deadline is None


def recheck_at(view: View) -> float | None:
    """When the next guaranteed job waiting reaches the mark."""
    after = view.settings.opportunistic_after_s
    times = [
        job.submitted_at + after
        for job in view.snapshot.pending
        if job.kind != OPPORTUNISTIC and _may_turn(job) and job.submitted_at + after > view.now
    ]
    return min(times, default=None)
