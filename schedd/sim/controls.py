"""Gandiva's job controls in the replay: Suspend and Resume (time-slicing), Migrate, and
Resize (grow/shrink of elastic jobs).

Functions of the engine's own state, kept apart so that engine.py stays about the loop,
the views and the common GPU bookkeeping (`Simulation.gpus_change`, `_hold`, `_release`)
that these use.

A migration: at the decision the job's work up to now is saved (a checkpoint on request
loses nothing, whatever the checkpoint interval), its service so far counted and its
completion voided; it holds its own GPUs and, from now, the target's as their holder,
makes no progress and keeps no GPU busy (its GPUs' sharers run as beside no one), and is
still charged usage as one job of its GPUs. After `SimOptions.migrate_overhead_s` it
gives its own GPUs up and runs on the target from the saved work, at the locality speed
of its new placement: a new run segment, as after a resume. A Stop while it moves
cancels it when the move is over (as a Stop of a preempting job does), both GPU sets
held until then.

A resize is a move to another GPU count, on one node: its target is the GPUs it keeps
(its own) and, for a grow, free ones. At the decision it is a migration's (nothing lost,
service counted, completion void, `migrating`, charged as before), holding its own GPUs
and, through `gpus_change`, the new ones. After `SimOptions.resize_overhead_s` it gives
up those of its own it does not keep and runs on the target: its remaining work scaled
linearly to the new count (elastic.py), its ledger and usage charged for that count from
then, its locality speed found again, a new run segment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedd.policy.actions import Migrate, Resize, Resume, Suspend
from schedd.policy.snapshot import Shard
from schedd.sim.elastic import rescaled
from schedd.sim.jobs import CANCELLED, MIGRATING, RUNNING, SUSPENDED, SimJob

if TYPE_CHECKING:
    from schedd.sim.engine import Simulation

# The engine's event kind for the end of a move (after its completions, 0, and the ends
# of preemptions, 1, at one instant); its token is the job's `attempt`.
MIGRATE_END = 2


def suspend(sim: Simulation, action: Suspend, now: float) -> bool:
    """Pause a running job (time-slicing): its progress up to now is kept, whatever
    the checkpoint model (the shim suspends at a mini-batch boundary, its state kept
    in memory); its GPUs are free for others and it is charged no usage until it
    resumes; it keeps its shards, the GPUs it resumes on."""
    job = sim._job(action.job_id, "Suspend")
    if job.state != RUNNING:
        sim.ledger.refused[f"suspend of a {job.state} job"] += 1
        return False
    _suspend_from(sim, job, sim._holders(job.kind), now)
    job.suspensions += 1
    sim._show(job, state=SUSPENDED, state_since=now)
    sim.ledger.actions["Suspend"] += 1
    return True


def resume(sim: Simulation, action: Resume, now: float) -> bool:
    """A suspended job takes its own GPUs back and goes on at its speed there, after
    `suspend_overhead_s` without progress. The resume starts a new run segment: its
    service, run time and checkpoints count from now, as from a launch (but it is
    neither a new start nor a preemption)."""
    job = sim._job(action.job_id, "Resume")
    if job.state != SUSPENDED:
        sim.ledger.refused[f"resume of a {job.state} job"] += 1
        return False
    if not sim._gpus_free(job, sim._uuids(job), "resume"):
        return False
    _resume_as(sim, job, RUNNING, now)
    sim.ledger.actions["Resume"] += 1
    return True


def _suspend_from(sim: Simulation, job: SimJob, holders: dict[str, SimJob], now: float) -> None:
    """A running (or packed) job is suspended: its work up to now kept, its GPUs left
    (it is removed from `holders`, the slot it held them in), its ledger and usage
    closed. The caller shows the change."""
    _save_progress(job, now)
    job.state = SUSPENDED  # before its GPUs change: not timed again as one that stays
    uuids = sim._uuids(job)
    with sim.gpus_change(uuids, now):
        for uuid in uuids:
            del holders[uuid]
    sim.ledger.release(job, now)
    job.held_since = None
    sim.usage.change(job.spec.queue, job.spec.user, -job.gpus, now)


def _resume_as(sim: Simulation, job: SimJob, state: str, now: float) -> None:
    """A suspended job takes its GPUs back in `state` (running as their holder, or
    packed beside it): a new run segment, progress after `suspend_overhead_s`."""
    job.state = state  # first: `Simulation._hold` puts a packed job in the packed slot
    job.held_since = now
    _new_segment(job, now, progress_at=now + sim.options.suspend_overhead_s)
    sim._show(job, state=state, state_since=now)
    sim._hold(job, now)


def migrate(sim: Simulation, action: Migrate, now: float) -> bool:
    """Begin moving a running job to `action.gpu_uuids` (module docstring). A policy
    bug stops the replay: an unknown job or node, the wrong number of GPUs, GPUs that
    are not all the node's, or one another job (or the job itself) holds. A job that
    is not running, or target GPUs a preemption still frees, are refused and counted."""
    job = sim._job(action.job_id, "Migrate")
    if job.state != RUNNING:
        sim.ledger.refused[f"migrate of a {job.state} job"] += 1
        return False
    target = _target(sim, job, action)
    if not sim._gpus_free(job, target.gpu_uuids, "migrate"):
        return False
    job.migrations += 1
    sim.ledger.actions["Migrate"] += 1
    _begin_move(sim, job, target, target.gpu_uuids, sim.options.migrate_overhead_s, now)
    return True


def resize(sim: Simulation, action: Resize, now: float) -> bool:
    """Begin restarting an elastic job on `action.gpu_uuids` (module docstring). Refused
    and counted: a job that is not running or not elastic, a count outside its range or
    other than the GPUs named, new GPUs a preemption or a move still frees. A policy bug
    stops the replay: an unknown job or node, GPUs named twice or not all the node's,
    or one another job of its kind holds."""
    job = sim._job(action.job_id, "Resize")
    refusal = _resize_refusal(job, action)
    if refusal is not None:
        sim.ledger.refused[refusal] += 1
        return False
    target = _checked_shard(
        sim, f"Resize of job {job.spec.job_id}", action.node_id, action.gpu_uuids
    )
    own = set(sim._uuids(job))
    new = [u for u in target.gpu_uuids if u not in own]
    if not sim._gpus_free(job, new, "resize"):
        return False
    job.resizes += 1
    sim.ledger.actions["Resize"] += 1
    _begin_move(sim, job, target, new, sim.options.resize_overhead_s, now)
    return True


def _begin_move(
    sim: Simulation,
    job: SimJob,
    target: Shard,
    new: tuple[str, ...] | list[str],
    overhead_s: float,
    now: float,
) -> None:
    """A migration's or a resize's start (module docstring): the job's work saved, it
    holds `new` (the target's GPUs it does not hold already) beside its own, and its
    move ends after `overhead_s`."""
    _save_progress(job, now)
    job.attempt += 1  # the end of this move is keyed by it
    with sim.gpus_change([*sim._uuids(job), *new], now):
        job.state = MIGRATING  # keeps no GPU busy, and is not timed again meanwhile
        job.moving_to = (target,)
        holders = sim._holders(job.kind)
        for uuid in new:
            holders[uuid] = job
    sim._show(job, state=MIGRATING, state_since=now, moving_to=job.moving_to)
    if overhead_s > 0:
        sim._at(now + overhead_s, MIGRATE_END, job)
    else:
        end_migration(sim, job, now)


def _resize_refusal(job: SimJob, action: Resize) -> str | None:
    """Why the resize cannot apply (counted as refused), or None."""
    if job.state != RUNNING:
        return f"resize of a {job.state} job"
    if job.gpu_range is None:
        return "resize of a job that is not elastic"
    least, most = job.gpu_range
    if not least <= action.gpus <= most:
        return "resize outside the job's GPU range"
    if action.gpus != len(action.gpu_uuids):
        return "resize naming more or fewer GPUs than its count"
    return None


def end_migration(sim: Simulation, job: SimJob, now: float) -> None:
    """The move (or resize) is over: the job gives up its own GPUs but those it keeps and
    runs on the target from the work saved when it began, rescaled to the target's count
    (or, stopped meanwhile, gives both sets up, cancelled)."""
    if job.cancel_when_freed:
        sim._release(job, now)
        sim._end(job, CANCELLED, now)
        return
    source = sim._uuids(job)  # both sets: its own and the target
    with sim.gpus_change(source, now):
        holders = sim._holders(job.kind)
        kept = {u for s in job.moving_to for u in s.gpu_uuids}
        for uuid in source:
            if uuid not in kept:
                del holders[uuid]
        job.shards, job.moving_to = job.moving_to, ()
        job.state = RUNNING
        gpus = sum(len(s.gpu_uuids) for s in job.shards)
        if gpus != job.gpus:
            _recount(sim, job, gpus, now)
        job.locality_speed = sim._locality_speed(job, job.shards, gpus)
        _new_segment(job, now, progress_at=now)  # timed at its new speed as the GPUs change
    request = sim.request(job.gpus)
    sim._show(job, state=RUNNING, state_since=now, moving_to=(), shards=job.shards, request=request)


def _recount(sim: Simulation, job: SimJob, gpus: int, now: float) -> None:
    """A resized job runs on `gpus` from now: its work left rescaled (the work is
    GPU-seconds), its queue's GPU-seconds and usage charged for the new count."""
    assert job.held_since is not None
    sim.ledger.release(job, now)  # closes its GPU-seconds at the old count
    sim.usage.change(job.spec.queue, job.spec.user, gpus - job.gpus, now)
    job.remaining_s = rescaled(job.remaining_s, job.gpus, gpus)
    job.gpus = gpus
    job.held_since = now
    sim.ledger.hold(job)


def _target(sim: Simulation, job: SimJob, action: Migrate) -> Shard:
    """The GPUs the job moves to, checked: as many as it has, distinct, all of one
    existing node, none its own."""
    uuids = action.gpu_uuids
    what = f"Migrate of job {job.spec.job_id}"
    if len(uuids) != job.gpus or len(set(uuids)) != len(uuids):
        raise sim.policy_error(
            f"{what} names {len(uuids)} GPUs ({len(set(uuids))} distinct); it has {job.gpus}"
        )
    target = _checked_shard(sim, what, action.node_id, uuids)
    own = set(sim._uuids(job))
    for uuid in uuids:
        if uuid in own:
            raise sim.policy_error(f"{what} names GPU {uuid}, which it runs on already")
    return target


def _checked_shard(
    sim: Simulation, what: str, node_id: str | None, uuids: tuple[str, ...]
) -> Shard:
    """`uuids` on `node_id`, checked: distinct, all of that node, which exists."""
    if len(set(uuids)) != len(uuids):
        raise sim.policy_error(f"{what} names {len(uuids)} GPUs ({len(set(uuids))} distinct)")
    node = sim.node(node_id)
    if node is None:
        raise sim.policy_error(f"{what} to unknown node {node_id!r}")
    on_node = {g.uuid for g in node.gpus}
    for uuid in uuids:
        if uuid not in on_node:
            raise sim.policy_error(f"{what} names GPU {uuid}, which is not on node {node.node_id}")
    return Shard(node.node_id, tuple(uuids))


def _save_progress(job: SimJob, now: float) -> None:
    """End the run segment with nothing lost (suspension and migration save the state
    now): the work done is kept, the service and run time counted, the completion void.
    Before a resume's overhead is over, `progress_at` is still ahead: nothing done."""
    assert job.started_at is not None and job.progress_at is not None
    job.progress_to(now)
    job.progress_at = None
    job.count_run(now)
    job.timing += 1  # its completion event is void now


def _new_segment(job: SimJob, now: float, progress_at: float) -> None:
    """A run segment from saved work (a resume, the end of a move): service, run time
    and checkpoints count from now; progress from `progress_at`."""
    job.started_at = now
    job.progress_at = progress_at
    job.remaining_at_start = job.remaining_s
    job.checkpoint_remaining = None
