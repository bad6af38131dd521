"""Controls of running jobs through their shims: share and memory cap, suspend and
resume, checkpoint, migration; and what the agents report back about them.

Each control asked for is recorded in the job's history with who asked; what the job
did about it (suspended at step N, checkpoint saved) follows as the agent reports it.
A job that saved a checkpoint on request and exited ends `checkpointed`; resuming it
requeues it with the checkpoint, which its next launch hands to the shim. A migration
is a checkpoint whose job is requeued at once, pinned to the node it moves to; a resize
(of an elastic job) one whose job is requeued at once with another GPU count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from schedd.store import gangs as gang_parts
from schedd.store import jobs
from shared import logging
from shared.model import TERMINAL, JobKind, JobState
from shared.protocol import (
    Checkpoint,
    InputsStaged,
    JobControlled,
    JobExited,
    JobProgress,
    JobReport,
    Prefetch,
    Resume,
    SetKind,
    SetLimits,
    Suspend,
)

if TYPE_CHECKING:
    from schedd.hub import Hub

log = logging.get("job_controls")


class ControlRefused(Exception):
    """The control cannot apply to the job as it is; the message says why."""


async def _running(pool: asyncpg.Pool, row: asyncpg.Record, what: str) -> None:
    if row["state"] != JobState.RUNNING:
        raise ControlRefused(f"cannot {what} job {row['id']}: it is {row['state']}, not running")
    await _on_one_node(pool, row, what)


async def _on_one_node(pool: asyncpg.Pool, row: asyncpg.Record, what: str) -> None:
    parts = await gang_parts.parts(pool, row["id"], row["attempt"])
    if parts:
        # A control acts through one node's shim; a gang's parts would have to act as one.
        raise ControlRefused(
            f"cannot {what} job {row['id']}: it runs on {len(parts)} nodes, and job controls"
            " act on jobs on one node only"
        )


def _not_connected(row: asyncpg.Record) -> ControlRefused:
    """The refusal of a control whose job's node is away."""
    return ControlRefused(f"node {row['node_id']} running job {row['id']} is not connected")


async def _send(hub: Hub, row: asyncpg.Record, msg: SetLimits | Checkpoint) -> None:
    if not await hub.send(row["node_id"], msg):
        raise _not_connected(row)


def controls_of(row: asyncpg.Record) -> dict[str, Any]:
    """The job's limits as they stand: share, memory cap, whether suspended (and then
    whether its cached GPU memory was to be freed, and whether for time-slicing)."""
    return {**jobs.DEFAULT_CONTROLS, **(row["controls"] or {})}


def time_sliced(row: asyncpg.Record) -> bool:
    """Suspended by the scheduler so that another job takes its turn on the job's GPUs
    (Gandiva): it holds none of them until the scheduler resumes it. A job a user
    suspended keeps its GPUs: its memory is still on them, and it may resume any time."""
    controls = controls_of(row)
    return bool(controls["suspended"] and controls.get("time_sliced"))


def moving(row: asyncpg.Record) -> bool:
    """Saving a checkpoint to migrate or to restart on another GPU count (a resize)."""
    return row["migrate_to"] is not None or row["resize_to"] is not None


def packed_beside(row: asyncpg.Record) -> str | None:
    """The job a time-sliced job runs beside, packed (Gandiva): it resumed without its
    partner being suspended, and the two run at once on the partner's GPUs; None: not
    packed."""
    controls = controls_of(row)
    if controls["suspended"] or not controls.get("packed"):
        return None
    return str(controls.get("packed_beside") or "?")


def _packed_words(row: asyncpg.Record, partner: str) -> str:
    return (
        f"job {row['id']} is packed beside job {partner}: the scheduler runs the two at once,"
        " and suspends it when they are better off taking turns"
    )


def _connected(hub: Hub, row: asyncpg.Record) -> None:
    if row["node_id"] not in hub.links:
        raise _not_connected(row)


async def set_limits(
    pool: asyncpg.Pool, hub: Hub, row: asyncpg.Record, by: str, share: int, cap: int | None
) -> None:
    await _running(pool, row, "set limits of")
    await _send(
        hub,
        row,
        SetLimits(job_id=row["id"], attempt=row["attempt"], share=share, memory_cap_mib=cap),
    )
    controls = {**controls_of(row), "share": share, "memory_cap_mib": cap}
    words = "no memory cap" if cap is None else f"memory cap {cap} MiB"
    await jobs.note(
        pool, row["id"], row["attempt"], f"share {share}, {words}, asked by {by}", controls=controls
    )


async def set_kind(pool: asyncpg.Pool, hub: Hub, row: asyncpg.Record, by: str, kind: str) -> None:
    """A waiting job starts as `kind`; a running opportunistic one is upgraded where it
    runs (its agent's coordinators take it as guaranteed and set it free: full share, no
    memory cap). A running job is never made opportunistic: its GPUs are its own.

    Committed first, then sent: an upgrade the agent did not get (the node away, or an
    agent that restarted and recovered the job as launched) is sent again whenever the
    node reconnects (`upgrades_for`); the agent answers with a `kind` event."""
    if row["kind"] == kind:
        raise ControlRefused(f"job {row['id']} is {kind} already")
    state = JobState(row["state"])
    if state == JobState.RUNNING and kind != JobKind.GUARANTEED:
        raise ControlRefused(f"cannot make running job {row['id']} {kind}")
    if state not in (JobState.PENDING, JobState.RUNNING):
        raise ControlRefused(f"cannot make job {row['id']} {kind}: it is {state}")
    controls = controls_of(row)
    if state == JobState.RUNNING:
        await _on_one_node(pool, row, f"make {kind}")
        controls = {**controls, "share": 100, "memory_cap_mib": None}
    if not await jobs.note(
        pool, row["id"], row["attempt"], f"now {kind}, by {by}", (state,), kind=kind,
        controls=controls,
    ):  # fmt: skip
        raise ControlRefused(f"cannot make job {row['id']} {kind}: it moved on")
    if state == JobState.RUNNING:
        upgrade = SetKind(job_id=row["id"], attempt=row["attempt"], kind="guaranteed")
        if not await hub.send(row["node_id"], upgrade):
            log.info("upgrade not sent: node away, sent when it reconnects", job_id=row["id"])


def upgrades_for(rows: list[asyncpg.Record], reports: list[JobReport]) -> list[SetKind]:
    """What a reconnecting agent is told again: the upgrades of the running jobs it
    reports as opportunistic (one that restarted recovered them as they were launched,
    or it never got the message)."""
    kinds = {(r["id"], r["attempt"]): r["kind"] for r in rows if r["state"] == JobState.RUNNING}
    return [
        SetKind(job_id=r.job_id, attempt=r.attempt, kind="guaranteed")
        for r in reports
        if r.status == "running"
        and r.kind == "opportunistic"
        and kinds.get((r.job_id, r.attempt)) == JobKind.GUARANTEED
    ]


async def suspend(
    pool: asyncpg.Pool,
    hub: Hub,
    row: asyncpg.Record,
    by: str,
    free: bool,
    time_slice: bool = False,
) -> None:
    """Pause the job at its next step boundary; `free`: its cached GPU memory given back.
    `time_slice`: the scheduler's turn-taking, which gives up the job's GPUs.

    Committed, then sent: a suspend the agent did not get (the link dropped in between,
    or an agent that restarted, whose shims resume guaranteed jobs) is sent again when
    the node reconnects (`resends_for`). The store keeps when it began, so that the
    job's service stops growing and the policy's turns outlive a schedd restart."""
    await _running(pool, row, "suspend")
    if controls_of(row)["suspended"] and (time_slice or time_sliced(row)):
        raise ControlRefused(f"job {row['id']} is suspended already{_sliced_words(row)}")
    if time_slice and moving(row):
        # It is saving a checkpoint to leave its GPUs (a plan sees it migrating).
        raise ControlRefused(f"job {row['id']} is {_moving_words(row)}")
    partner = packed_beside(row)
    if partner is not None and not time_slice:
        raise ControlRefused(_packed_words(row, partner))
    _connected(hub, row)
    patch: dict[str, Any] = {"suspended": True, "free_memory": free, "time_sliced": time_slice}
    words = f"suspend asked by {by}"
    if partner is not None:
        # Its pack is undone: it takes turns with its partner again, and is not packed
        # again in this attempt (a new placement clears the controls).
        patch |= {"packed": False, "packed_beside": None, "packable": False}
        words += f" (pack beside job {partner} undone; not packed again this attempt)"
    if not await jobs.set_suspended(
        pool, row["id"], row["attempt"], True, patch, words, not_suspended=time_slice
    ):
        raise ControlRefused(f"cannot suspend job {row['id']}: it changed meanwhile")
    msg = Suspend(job_id=row["id"], attempt=row["attempt"], free_memory=free)
    if not await hub.send(row["node_id"], msg):
        log.warning("suspend not sent: node away, sent when it reconnects", job_id=row["id"])


def _sliced_words(row: asyncpg.Record) -> str:
    return " (time-sliced: it takes turns on its GPUs)" if time_sliced(row) else ""


def _moving_words(row: asyncpg.Record) -> str:
    if row["resize_to"] is not None:
        return f"resizing to {row['resize_to']} GPUs"
    return f"migrating to node {row['migrate_to']}"


async def resume(
    pool: asyncpg.Pool,
    hub: Hub,
    row: asyncpg.Record,
    by: str,
    time_slice: bool = False,
    beside: str | None = None,
) -> bool:
    """A suspended job goes on; a checkpointed one is requeued. True if it was requeued.

    A time-sliced job is resumed by the scheduler alone (`time_slice`), at its turn: a
    user's resume would run it beside the job that has its GPUs meanwhile. `beside`
    (packing): it resumes while that job runs on the same GPUs, and is `packed`
    until it is suspended again or takes the GPUs as their holder (a resume of a packed
    job: its partner left, and it runs already, so nothing is sent)."""
    if row["state"] == JobState.CHECKPOINTED:
        why = f"requeued by {by} to resume from {row['checkpoint_path']}"
        moved = await jobs.transition(
            pool, row["id"], JobState.PENDING, why, only_from=(JobState.CHECKPOINTED,)
        )
        if not moved.ok:
            raise ControlRefused(f"cannot resume job {row['id']}: {moved.detail}")
        return True
    await _running(pool, row, "resume")
    partner = packed_beside(row)
    if partner is not None:
        if not time_slice or beside is not None:
            raise ControlRefused(_packed_words(row, partner))
        words = f"takes its GPUs as their holder, asked by {by}"
        if not await jobs.hold_gpus(pool, row["id"], row["attempt"], words):
            raise ControlRefused(f"cannot resume job {row['id']}: it changed meanwhile")
        return False
    if time_slice != time_sliced(row):
        if time_slice:
            raise ControlRefused(f"job {row['id']} is not suspended for time-slicing")
        raise ControlRefused(
            f"job {row['id']} is time-sliced: it takes turns on its GPUs with another job,"
            " and the scheduler resumes it at its turn"
        )
    if beside is not None:
        await _may_pack_beside(pool, row, beside)
    _connected(hub, row)
    patch: dict[str, Any] = {"suspended": False, "free_memory": False, "time_sliced": False}
    words = f"resume asked by {by}"
    if beside is not None:
        patch |= {"packed": True, "packed_beside": beside}
        words = f"resume beside job {beside} (packed: the two run at once) asked by {by}"
    if not await jobs.set_suspended(
        pool, row["id"], row["attempt"], False, patch, words, sliced=time_slice
    ):
        raise ControlRefused(f"cannot resume job {row['id']}: it changed meanwhile")
    if not await hub.send(row["node_id"], Resume(job_id=row["id"], attempt=row["attempt"])):
        log.warning("resume not sent: node away, sent when it reconnects", job_id=row["id"])
    if beside is not None:
        log.info("job packed", job_id=row["id"], attempt=row["attempt"], beside=beside, by=by)
    return False


async def _may_pack_beside(pool: asyncpg.Pool, row: asyncpg.Record, beside: str) -> None:
    """A job is packed only beside one that runs, not suspended, on its very GPUs."""
    partner = await jobs.get(pool, beside)
    if (
        partner is None
        or partner["state"] != JobState.RUNNING
        or controls_of(partner)["suspended"]
        or partner["node_id"] != row["node_id"]
        or sorted(partner["gpu_uuids"]) != sorted(row["gpu_uuids"])
    ):
        raise ControlRefused(
            f"cannot pack job {row['id']} beside job {beside}: that job does not run on its GPUs"
        )


def resends_for(
    rows: list[asyncpg.Record], reports: list[JobReport]
) -> list[SetLimits | Suspend | Resume]:
    """What a reconnecting agent is told again of its running jobs' controls: limits
    other than none (an agent that restarted lost them, and its coordinators take an
    opportunistic job's as a bound), a suspend for each job suspended (the shim of a
    guaranteed job resumes when its agent goes), a resume for each resumed since it
    started (one lost on its way). The shims take a repeated one as a no-op."""
    running = {(r.job_id, r.attempt) for r in reports if r.status == "running"}
    out: list[SetLimits | Suspend | Resume] = []
    no_limits = (jobs.DEFAULT_CONTROLS["share"], jobs.DEFAULT_CONTROLS["memory_cap_mib"])
    for row in rows:
        if row["state"] != JobState.RUNNING or (row["id"], row["attempt"]) not in running:
            continue
        controls = controls_of(row)
        share, cap = controls["share"], controls["memory_cap_mib"]
        if (share, cap) != no_limits:
            out.append(
                SetLimits(job_id=row["id"], attempt=row["attempt"], share=share, memory_cap_mib=cap)
            )
        if controls["suspended"]:
            free = bool(controls.get("free_memory"))
            out.append(Suspend(job_id=row["id"], attempt=row["attempt"], free_memory=free))
        elif row["resumed_s"] is not None:
            out.append(Resume(job_id=row["id"], attempt=row["attempt"]))
    return out


async def checkpoint(
    pool: asyncpg.Pool,
    hub: Hub,
    row: asyncpg.Record,
    by: str,
    migrate_to: str | None = None,
    gpu_uuids: list[str] | None = None,
) -> None:
    """Ask the job to save and exit; with `migrate_to`, it then resumes on that node
    (`gpu_uuids`: the GPUs a plan chose there, which snapshots hold for it meanwhile).

    A migration is committed, then sent, so that its checkpointed exit, however soon it
    comes, finds where the job goes; a send that fails calls it off again. It ends
    with the run: the exit requeues the job pinned to the node, any other end (or a
    failed checkpoint, `on_controlled`) drops it. It is not sent again to an agent that
    reconnects: a shim keeps a checkpoint it was asked for through its agent's restart."""
    await _running(pool, row, "checkpoint")
    if migrate_to is None:
        await _send(hub, row, Checkpoint(job_id=row["id"], attempt=row["attempt"]))
        await jobs.note(pool, row["id"], row["attempt"], f"checkpoint asked by {by}")
        return
    source = row["node_id"]
    if migrate_to == source:
        raise ControlRefused(f"job {row['id']} already runs on node {migrate_to}")
    if moving(row):
        raise ControlRefused(f"job {row['id']} is {_moving_words(row)} already")
    words = f"migration from node {source} to node {migrate_to} asked by {by}"
    await _ask_move(pool, hub, row, words, migrate_to, gpu_uuids)
    log.info(
        "job migrating",
        job_id=row["id"],
        attempt=row["attempt"],
        node_id=source,
        to_node=migrate_to,
        gpu_uuids=gpu_uuids,
        by=by,
    )


async def prefetch(pool: asyncpg.Pool, hub: Hub, row: asyncpg.Record, by: str, node: str) -> None:
    """Copy the job's inputs into `node`'s cache ahead of a launch there."""
    if JobState(row["state"]) in TERMINAL:
        raise ControlRefused(f"job {row['id']} is {row['state']}: nothing to prefetch for")
    inputs = jobs.spec_of(row).inputs
    if not inputs:
        raise ControlRefused(f"job {row['id']} has no inputs to prefetch")
    if not await hub.send(node, Prefetch(job_id=row["id"], inputs=inputs, user=row["user_name"])):
        raise ControlRefused(f"node {node} is not connected")
    await jobs.note(
        pool,
        row["id"],
        row["attempt"],
        f"prefetch of its inputs to node {node} asked by {by}",
        prefetched_to=node,
    )


async def resize(
    pool: asyncpg.Pool,
    hub: Hub,
    row: asyncpg.Record,
    by: str,
    gpus: int,
    node_id: str | None = None,
    gpu_uuids: list[str] | None = None,
) -> None:
    """Restart the job with `gpus` GPUs from its checkpoint: a running job saves one first;
    a checkpointed job is requeued with the new count at once. An elastic job's count
    stays within its range (`min_gpus` to the spec's `gpus`).

    With `node_id` (a plan's grow or shrink), the job restarts on that node, pinned to it,
    and `gpu_uuids` (the GPUs the plan chose there: its own and free ones for a grow, a
    subset of its own for a shrink) are held for it meanwhile, as a migration's target
    is: snapshots show it migrating. A user's resize names only the count; the job
    restarts wherever it fits. Committed, then sent, so that the checkpointed exit,
    however soon it comes, finds the new count; a send that fails calls it off again,
    and so does a failed checkpoint (`on_controlled`)."""
    least, most = row["min_gpus"], row["max_gpus"]
    if least is not None and not least <= gpus <= most:
        raise ControlRefused(
            f"job {row['id']} is elastic from {least} to {most} GPUs: cannot resize it to {gpus}"
        )
    if row["state"] == JobState.CHECKPOINTED:
        if row["gpus"] == gpus:
            raise ControlRefused(f"job {row['id']} already has {gpus} GPUs")
        why = f"resized to {gpus} GPUs by {by}: resumes from {row['checkpoint_path']}"
        moved = await jobs.transition(
            pool, row["id"], JobState.PENDING, why, only_from=(JobState.CHECKPOINTED,), gpus=gpus
        )
        if not moved.ok:
            raise ControlRefused(f"cannot resize job {row['id']}: {moved.detail}")
        return
    await _running(pool, row, "resize")
    source = row["node_id"]
    if row["gpus"] == gpus and node_id in (None, source):
        raise ControlRefused(f"job {row['id']} already has {gpus} GPUs")
    if gpu_uuids is not None and len(gpu_uuids) != gpus:
        raise ControlRefused(f"cannot resize job {row['id']} to {gpus} GPUs on {len(gpu_uuids)}")
    if moving(row):
        raise ControlRefused(f"job {row['id']} is {_moving_words(row)} already")
    if controls_of(row)["suspended"] or packed_beside(row) is not None:
        # It saves its checkpoint at a step boundary, which a paused job never reaches;
        # a time-sliced or packed one does not hold the GPUs it runs on.
        raise ControlRefused(f"cannot resize job {row['id']}: it is suspended or packed")
    where = "" if node_id is None else f" on node {node_id}"
    words = f"resize from {row['gpus']} to {gpus} GPUs{where} asked by {by}"
    await _ask_move(pool, hub, row, words, node_id, gpu_uuids, resize_to=gpus)
    log.info(
        "job resizing",
        job_id=row["id"],
        attempt=row["attempt"],
        node_id=source,
        gpus=row["gpus"],
        to_gpus=gpus,
        to_node=node_id,
        gpu_uuids=gpu_uuids,
        by=by,
    )


async def _ask_move(
    pool: asyncpg.Pool,
    hub: Hub,
    row: asyncpg.Record,
    words: str,
    node_id: str | None,
    gpu_uuids: list[str] | None,
    resize_to: int | None = None,
) -> None:
    """Record the move (`jobs.ask_move`, its event saying `words`), then ask the job's
    checkpoint: committed first, so that the checkpointed exit, however soon it comes,
    finds where and on how many GPUs the job restarts; a send that fails calls the
    move off again."""
    _connected(hub, row)
    resizing = resize_to is not None
    verb = "resize" if resizing else "migrate"
    move = f"resize to {resize_to} GPUs" if resizing else f"migration to node {node_id}"
    job_id, attempt, source = row["id"], row["attempt"], row["node_id"]
    if not await jobs.ask_move(pool, job_id, attempt, words, node_id, gpu_uuids, resize_to):
        raise ControlRefused(f"cannot {verb} job {job_id}: it changed meanwhile")
    if not await hub.send(source, Checkpoint(job_id=job_id, attempt=attempt)):
        why = f"{move} called off: node {source} is not connected"
        await jobs.call_off_move(pool, job_id, attempt, why)
        raise _not_connected(row)


# ---- from the agents --------------------------------------------------------------


async def on_inputs_staged(pool: asyncpg.Pool, node_id: str, event: InputsStaged) -> None:
    """An input copied (or not) on a node goes into the job's history; progress is logged."""
    if not event.done:
        log.debug(
            "input staging",
            job_id=event.job_id,
            node_id=node_id,
            input=event.input,
            bytes_done=event.bytes_done,
        )
        return
    row = await jobs.get(pool, event.job_id)
    if row is None:
        return
    if event.error is None:
        reason = f"input {event.input} staged on node {node_id} ({event.bytes_done} bytes)"
        await jobs.note(pool, event.job_id, row["attempt"], reason)
        return
    reason = f"input {event.input} not staged on node {node_id}: {event.error}"
    if row["prefetched_to"] == node_id:
        # The copy ahead failed: forget it, so that a later cycle may ask again.
        await jobs.note(pool, event.job_id, row["attempt"], reason, prefetched_to=None)
    else:
        await jobs.note(pool, event.job_id, row["attempt"], reason)


async def on_progress(pool: asyncpg.Pool, event: JobProgress) -> bool:
    """Record the job's progress. True when it made the job known to save checkpoints:
    a move or resize it was passed over for may be possible now, worth a new plan."""
    progress = {
        "step": event.step,
        "steps_per_s": event.steps_per_s,
        "step_wall_s": event.step_wall_s,
        "gpu_s": event.gpu_s,
        "mem_reserved_mib": event.mem_reserved_mib,
        "mem_peak_mib": event.mem_peak_mib,
    }
    # Mini-batches timed through the shim (`step_wall_s`): it is there, and can save a
    # checkpoint.
    return await jobs.record_progress(
        pool, event.job_id, event.attempt, progress, event.step_wall_s
    )


async def on_controlled(pool: asyncpg.Pool, node_id: str, event: JobControlled) -> bool:
    """Record what the job did about a control. True when a move was called off (its
    checkpoint failed): the GPUs a migration held are free again, worth a new plan."""
    reason = f"{event.event}: {event.detail}" if event.detail else event.event
    if event.event == "checkpoint_failed":
        return await _checkpoint_failed(pool, node_id, event, reason)
    sets: dict[str, Any] = {}
    if event.event == "checkpointed" and event.path is not None:
        sets["checkpoint_path"] = event.path
    if not await jobs.note(pool, event.job_id, event.attempt, reason, **sets):
        log.info("control event for another attempt", job_id=event.job_id, node_id=node_id)
    return False


async def _checkpoint_failed(
    pool: asyncpg.Pool, node_id: str, event: JobControlled, reason: str
) -> bool:
    """The job runs on where it is: the move its checkpoint was for (a migration, a
    resize) is called off, and it is known not to be checkpointable this attempt when
    its shim failed to save one (a save error, no save function). When the agent found
    no shim connected (`step` None: none, or not yet again after an agent restart),
    that is not known until its shim reports mini-batches again."""
    row = await jobs.get(pool, event.job_id)
    if row is None or row["attempt"] != event.attempt:
        log.info("control event for another attempt", job_id=event.job_id, node_id=node_id)
        return False
    dropped = []
    if row["migrate_to"] not in (None, row["node_id"]):
        dropped.append(f"migration to node {row['migrate_to']} called off")
    if row["resize_to"] is not None:
        dropped.append(f"resize to {row['resize_to']} GPUs called off")
    words = "; ".join([reason, *dropped])
    able = False if event.step is not None else None
    await jobs.call_off_move(
        pool, row["id"], row["attempt"], words, checkpointable=able, set_checkpointable=True
    )
    if moving(row):
        log.info(
            "migration called off" if row["resize_to"] is None else "resize called off",
            job_id=row["id"],
            attempt=row["attempt"],
            node_id=node_id,
            to_node=row["migrate_to"],
            to_gpus=row["resize_to"],
            reason=reason,
        )
    # GPUs held for the move (a plan's migration or resize) are free again.
    return row["migrate_to"] is not None


async def on_checkpointed_exit(pool: asyncpg.Pool, row: asyncpg.Record, event: JobExited) -> None:
    """The job saved `event.checkpoint` and exited: checkpointed, or requeued to migrate."""
    assert event.checkpoint is not None
    target, gpus = row["migrate_to"], row["resize_to"]
    if moving(row):
        source = row["node_id"]
        if target is not None and target != source:
            moves = [f"moving from node {source} to node {target}"]
            moves += [f"to {gpus} GPUs"] if gpus is not None else []
        else:  # a resize: where it ran (pinned there, a plan's), or anywhere (a user's)
            there = f" on node {target}" if target is not None else ""
            moves = [f"resizing from {row['gpus']} to {gpus} GPUs{there}"]
        why = f"{' and '.join(moves)}: resumes from {event.checkpoint}"
        await jobs.transition(
            pool,
            row["id"],
            JobState.PENDING,
            why,
            attempt=event.attempt,
            only_from=(JobState.RUNNING,),
            checkpoint_path=event.checkpoint,
            pin_node_id=target,
            # The GPUs a plan chose there stay its own until it is placed again on them
            # (a user's move names none).
            migrate_gpu_uuids=row["migrate_gpu_uuids"] if target is not None else None,
            gpus=gpus if gpus is not None else row["gpus"],
            exit_code=event.exit_code,
        )
        return
    await jobs.transition(
        pool,
        row["id"],
        JobState.CHECKPOINTED,
        f"checkpoint saved at {event.checkpoint}",
        attempt=event.attempt,
        checkpoint_path=event.checkpoint,
        exit_code=event.exit_code,
    )
