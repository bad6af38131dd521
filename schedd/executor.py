"""Carries out actions: makes each state change durable, then tells the agent.

Used by the scheduler for the plan's actions and by the API for cancels, so that both
follow the same rule: commit first, then send. A send that fails is not retried here;
the agent's next hello reconciles it.
"""

from __future__ import annotations

import asyncpg

from schedd import gangs, job_controls
from schedd.hub import Hub
from schedd.policy.actions import (
    Action,
    AdmitDeadline,
    Launch,
    Migrate,
    Preempt,
    Prefetch,
    Resize,
    Resume,
    SetKind,
    SetLimits,
    Stop,
    Suspend,
)
from schedd.store import gangs as gang_parts
from schedd.store import jobs
from shared import logging
from shared.config import SchedConfig
from shared.model import JobState
from shared.protocol import Kill

log = logging.get("executor")

# The plan's actions that control a job already known to the store.
Control = Prefetch | SetLimits | SetKind | Suspend | Resume | Migrate | Resize


class Executor:
    def __init__(self, pool: asyncpg.Pool, hub: Hub, config: SchedConfig) -> None:
        self.pool = pool
        self.hub = hub
        self.config = config

    async def execute(self, action: Action) -> bool:
        match action:
            case Launch():
                return await self.launch(action)
            case Stop():
                moved = await self.cancel(action.job_id, action.reason)
                return moved.ok
            case Preempt() if action.requeue:
                return await self.preempt(action)
            case Preempt():
                moved = await self.cancel(action.job_id, action.reason)  # stop, no requeue
                return moved.ok
            case Prefetch() | SetLimits() | SetKind() | Suspend() | Resume() | Migrate() | Resize():
                return await self.control(action)
            case AdmitDeadline():
                recorded = await jobs.decide_deadline(
                    self.pool, action.job_id, action.admitted, action.reason
                )
                if recorded:
                    log.info(
                        "deadline guaranteed" if action.admitted else "deadline not guaranteed",
                        job_id=action.job_id,
                        reason=action.reason,
                    )
                return recorded
        log.warning("action not supported yet", action=type(action).__name__, job_id=action.job_id)
        return False

    async def control(self, action: Control) -> bool:
        """A plan's job control, carried out as the same `POST /v1/jobs/{id}/...` by a
        user would be (docs/operations.md), in the scheduler's name and with its reason."""
        row = await jobs.get(self.pool, action.job_id)
        if row is None:
            return False
        by = f"the scheduler: {action.reason}"
        pool, hub = self.pool, self.hub
        try:
            match action:
                case Prefetch():
                    if row["state"] != JobState.PENDING:
                        return False  # started, cancelled or gone since the snapshot
                    await job_controls.prefetch(pool, hub, row, by, action.node_id)
                case SetLimits():
                    now = job_controls.controls_of(row)
                    share = now["share"] if action.compute_share is None else action.compute_share
                    cap = (
                        now["memory_cap_mib"]
                        if action.memory_cap_mib is None
                        else action.memory_cap_mib
                    )
                    await job_controls.set_limits(pool, hub, row, by, share, cap)
                case SetKind():
                    await job_controls.set_kind(pool, hub, row, by, action.kind)
                case Suspend():
                    # Time-slicing: another job runs on its GPUs next, so it gives back
                    # the GPU memory it can (its cache; a job without a shim is stopped
                    # with SIGSTOP and keeps it), and only the scheduler resumes it.
                    await job_controls.suspend(pool, hub, row, by, free=True, time_slice=True)
                case Resume():
                    await job_controls.resume(
                        pool, hub, row, by, time_slice=True, beside=action.beside
                    )
                case Migrate():
                    # Its target GPUs are recorded with it: snapshots hold them for the
                    # job while it saves its checkpoint (it may resume on others there).
                    target = list(action.gpu_uuids)
                    await job_controls.checkpoint(
                        pool, hub, row, by, migrate_to=action.node_id, gpu_uuids=target
                    )
                case Resize():
                    # Like a migration: the GPUs it restarts on (its own and free ones for
                    # a grow, some of its own for a shrink) are recorded with it, and its
                    # checkpointed exit requeues it pinned to the node with the new count.
                    uuids = list(action.gpu_uuids) if action.gpu_uuids else None
                    await job_controls.resize(
                        pool, hub, row, by, action.gpus, action.node_id, uuids
                    )
        except job_controls.ControlRefused as exc:
            log.info("control not carried out", action=type(action).__name__, job_id=row["id"],
                     reason=str(exc))  # fmt: skip
            return False
        log.info(
            "job control", action=type(action).__name__, job_id=row["id"], reason=action.reason
        )
        return True

    async def launch(self, action: Launch) -> bool:
        shards = action.shards
        parts = [(s.node_id, s.gpu_uuids) for s in shards]
        moved = await gang_parts.place(self.pool, action.job_id, action.reason, parts)
        if not moved.ok:
            return False
        row = await jobs.get(self.pool, action.job_id)
        assert row is not None and moved.attempt is not None
        links = [self.hub.links.get(s.node_id) for s in shards]
        addresses = [link.address if link is not None else None for link in links]
        address = gangs.head_address(action.job_id, shards[0].node_id, addresses)
        for node_id, msg in gangs.launches(row, jobs.spec_of(row), moved.attempt, shards, address):
            if not await self.hub.send(node_id, msg):
                # The node went away between the snapshot and now; its return or loss
                # requeues the job (a gang's other parts are stopped then).
                log.warning("launch not delivered", job_id=action.job_id, node_id=node_id)
        return True

    async def preempt(self, action: Preempt) -> bool:
        """Take a placed job's resources back: commit `preempting`, then kill it.

        Its exit (or its loss) requeues it as pending (hub._on_exited); until then it
        holds its GPUs, so that nothing starts on them while it is still stopping.
        """
        moved = await jobs.transition(
            self.pool,
            action.job_id,
            JobState.PREEMPTING,
            action.reason,
            only_from=(JobState.RUNNING, JobState.ASSIGNED),
            reason=action.reason,
        )
        if not moved.ok:
            return False  # it ended, or was cancelled, since the snapshot
        row = await self.kill(action.job_id, save_first=True)
        log.info(
            "job preempted",
            job_id=action.job_id,
            attempt=moved.attempt,
            queue=row["queue"] if row else None,
            user=row["user_name"] if row else None,
            node_id=row["node_id"] if row else None,
            grace_s=self.config.kill_grace_s,
            reason=action.reason,
        )
        return True

    async def cancel(self, job_id: str, reason: str) -> jobs.Moved:
        """Cancel a pending or checkpointed job at once, a placed one by killing it."""
        moved = await jobs.transition(
            self.pool,
            job_id,
            JobState.CANCELLED,
            reason,
            only_from=(JobState.PENDING, JobState.CHECKPOINTED),
        )
        placed = (JobState.ASSIGNED, JobState.RUNNING, JobState.PREEMPTING)
        if moved.ok or moved.current not in placed:
            return moved
        moved = await jobs.transition(self.pool, job_id, JobState.CANCELLING, reason)
        # A job being preempted has its kill on its way already: it now ends cancelled.
        if moved.ok and moved.previous is not JobState.PREEMPTING:
            await self.kill(job_id)
        return moved

    async def kill(self, job_id: str, save_first: bool = False) -> asyncpg.Record | None:
        """Send the job's node, or each node where a gang's part still runs, a Kill
        (SIGTERM, SIGKILL after the grace); the job's row. With `save_first` (a
        preemption), a job that can save a checkpoint is asked to first (`_save_s`)."""
        row = await jobs.get(self.pool, job_id)
        if row is None:
            return row
        checkpoint_s = await self._save_s(row) if save_first else 0.0
        for node_id in await gangs.live_nodes(self.pool, row):
            await self.hub.send(
                node_id,
                Kill(
                    job_id=job_id,
                    attempt=row["attempt"],
                    grace_s=self.config.kill_grace_s,
                    reason=row["reason"] or "cancelled",
                    checkpoint_s=checkpoint_s,
                ),
            )
        return row

    async def _save_s(self, row: asyncpg.Record) -> float:
        """How long a stopping job gets to save a checkpoint and exit before SIGTERM:
        `preempt_checkpoint_s` where its shim can save one (it has reported mini-batches
        this attempt, and no checkpoint asked of it failed), else none. Not a gang's:
        its parts would each save on their own, at different steps."""
        if row["checkpointable"] is not True:
            return 0.0
        if await gang_parts.has_parts(self.pool, row["id"], row["attempt"]):
            return 0.0
        return self.config.preempt_checkpoint_s
