"""Carries out actions: makes each state change durable, then tells the agent.

Used by the scheduler for the plan's actions and by the API for cancels, so that both
follow the same rule: commit first, then send. A send that fails is not retried here;
the agent's next hello reconciles it.
"""

from __future__ import annotations

import asyncpg

from schedd.hub import Hub
from schedd.policy.actions import Action, Launch, Stop
from schedd.store import jobs
from shared import logging
from shared.config import SchedConfig
from shared.model import JobState
from shared.protocol import Kill
from shared.protocol import Launch as LaunchMsg

log = logging.get("executor")


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
        log.warning("action not supported yet", action=type(action).__name__, job_id=action.job_id)
        return False

    async def launch(self, action: Launch) -> bool:
        moved = await jobs.transition(
            self.pool,
            action.job_id,
            JobState.ASSIGNED,
            action.reason,
            node_id=action.node_id,
            gpu_uuids=list(action.gpu_uuids),
        )
        if not moved.ok:
            return False
        row = await jobs.get(self.pool, action.job_id)
        assert row is not None and moved.attempt is not None
        spec = jobs.spec_of(row)
        msg = LaunchMsg(
            job_id=action.job_id,
            attempt=moved.attempt,
            user=row["user_name"],
            argv=spec.argv(),
            env=spec.env,
            cwd=spec.cwd,
            gpu_uuids=list(action.gpu_uuids),
            cpus=spec.cpus,
            memory_mib=spec.memory_mib,
            inputs=spec.inputs,
            image=spec.image,
        )
        if not await self.hub.send(action.node_id, msg):
            # The node went away between the snapshot and now; its return or loss requeues it.
            log.warning("launch not delivered", job_id=action.job_id, node_id=action.node_id)
        return True

    async def cancel(self, job_id: str, reason: str) -> jobs.Moved:
        """Cancel a pending job at once, or a placed one by killing it on its node."""
        moved = await jobs.transition(
            self.pool, job_id, JobState.CANCELLED, reason, only_from=(JobState.PENDING,)
        )
        if moved.ok or moved.current not in (JobState.ASSIGNED, JobState.RUNNING):
            return moved
        moved = await jobs.transition(self.pool, job_id, JobState.CANCELLING, reason)
        if moved.ok:
            await self.kill(job_id)
        return moved

    async def kill(self, job_id: str) -> None:
        row = await jobs.get(self.pool, job_id)
        if row is None or row["node_id"] is None:
            return
        await self.hub.send(
            row["node_id"],
            Kill(
                job_id=job_id,
                attempt=row["attempt"],
                grace_s=self.config.kill_grace_s,
                reason=row["reason"] or "cancelled",
            ),
        )
