"""The event loop around the pure policy: wake on an event, snapshot, plan, act.

Events (a submission, an exit, a cancel, a node joining or leaving) call `wake()`;
wakes that arrive while a cycle runs fold into one more cycle. Nothing is polled.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from schedd import policy
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.policy.actions import Plan, Wait
from schedd.policy.snapshot import Gpu, Node, PendingJob, PlacedJob, Request, Snapshot
from schedd.store import jobs
from shared import logging
from shared.protocol import GpuSample

log = logging.get("scheduler")

# Above this many pending jobs the plan runs in a worker thread, so that a long plan
# does not hold the event loop (websocket pings, API requests) for its whole length.
PLAN_IN_THREAD_ABOVE = 2000
NO_NODES = Wait("no_nodes", "no nodes are connected")


class Scheduler:
    def __init__(self, pool: asyncpg.Pool, hub: Hub, executor: Executor, profile: str) -> None:
        self.pool = pool
        self.hub = hub
        self.executor = executor
        self.profile = policy.profile(profile)
        self._wakeup = asyncio.Event()
        self.waiting: dict[str, Wait] = {}
        self._beyond: Wait | None = NO_NODES  # why a job the last cycle did not read waits
        self.cycles = 0

    def wake(self) -> None:
        self._wakeup.set()

    def why_pending(self, job_id: str) -> Wait:
        wait = self.waiting.get(job_id) or self._beyond
        return wait or Wait("not_considered", "not yet considered by the scheduler")

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.cycle()
            except (asyncpg.PostgresError, OSError) as exc:
                # The database is away (restart, failover): try again on the next event
                # or after a short pause, never crash the daemon.
                log.error("scheduling cycle failed", error=str(exc))
                await asyncio.sleep(1.0)
                self._wakeup.set()

    async def cycle(self) -> Plan:
        started = time.perf_counter()
        window = self.profile.pending_window
        snapshot = await self.snapshot(window)
        if not snapshot.nodes:
            # Nothing can start anywhere: say so without reading the queue.
            self.waiting, self._beyond = {}, NO_NODES
            return Plan()
        now = time.time()
        if len(snapshot.pending) > PLAN_IN_THREAD_ABOVE:
            plan = await asyncio.to_thread(self.profile.plan, snapshot, now)
        else:
            plan = self.profile.plan(snapshot, now)
        planned = time.perf_counter()
        launched = 0
        for action in plan.actions:
            if await self.executor.execute(action):
                launched += 1
        full = len(snapshot.pending) == window
        self.waiting = plan.waiting
        self._beyond = (
            Wait("queued", f"queued behind the {window} oldest pending jobs") if full else None
        )
        if full and launched:
            self.wake()  # the window moved on: the jobs behind it may start too
        self.cycles += 1
        log.info(
            "scheduling cycle",
            policy=self.profile.name,
            nodes=len(snapshot.nodes),
            pending=len(snapshot.pending),
            actions=len(plan.actions),
            done=launched,
            waiting=plan.wait_counts(),
            plan_ms=round((planned - started) * 1000, 2),
            cycle_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return plan

    async def snapshot(self, pending_window: int) -> Snapshot:
        nodes = tuple(
            Node(
                node_id=link.node_id,
                gpus=tuple(
                    Gpu(
                        uuid=g.uuid,
                        index=g.index,
                        model=g.model,
                        memory_mib=g.memory_mib,
                        utilization_pct=_util(link.samples.get(g.uuid)),
                        memory_used_mib=_mem(link.samples.get(g.uuid)),
                    )
                    for g in link.hello.inventory.gpus
                ),
                cpus=link.hello.inventory.cpus,
                memory_mib=link.hello.inventory.memory_mib,
                labels=dict(link.hello.inventory.labels),
            )
            for link in self.hub.links.values()
        )
        if not nodes:
            return Snapshot(nodes=(), placed=(), pending=())
        placed_rows = await jobs.placed(self.pool)
        pending_rows = await jobs.pending(self.pool, pending_window)
        placed = tuple(
            PlacedJob(
                job_id=r["id"],
                user=r["user_name"],
                queue=r["queue"],
                node_id=r["node_id"],
                gpu_uuids=tuple(r["gpu_uuids"]),
                request=_request(r),
                state=r["state"],
                started_at=r["started_at"].timestamp() if r["started_at"] else None,
            )
            for r in placed_rows
        )
        pending = tuple(
            PendingJob(
                job_id=r["id"],
                user=r["user_name"],
                queue=r["queue"],
                priority=r["priority"],
                kind=r["kind"],
                request=_request(r),
                submitted_at=r["submitted_at"].timestamp(),
            )
            for r in pending_rows
        )
        return Snapshot(nodes=nodes, placed=placed, pending=pending)


def _request(row: asyncpg.Record) -> Request:
    return Request(row["gpus"], row["cpus"], row["memory_mib"], row["gpu_memory_mib"])


def _util(sample: GpuSample | None) -> int:
    return sample.utilization_pct if sample else 0


def _mem(sample: GpuSample | None) -> int:
    return sample.memory_used_mib if sample else 0
