"""The agent hub: one websocket per node, typed messages, reconciliation at (re)connect.

Agents push events (job started, exited, failed; GPU state); the hub commits each one
through the store, acknowledges exits only after they are durable, and wakes the
scheduler. A node that stays away longer than `node_lost_after_s` has its jobs requeued.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import WSMsgType, web

from schedd import gangs, job_controls
from schedd.exits import describe_exit
from schedd.gpu_window import GpuWindow
from schedd.store import gangs as gang_parts
from schedd.store import jobs, nodes
from shared import logging, protocol
from shared.config import SchedConfig
from shared.model import TERMINAL, JobState
from shared.protocol import (
    ExitAck,
    GpuFault,
    GpuState,
    Hello,
    InputsStaged,
    JobControlled,
    JobExited,
    JobFailed,
    JobProgress,
    JobReport,
    JobStarted,
    Kill,
    LogChunk,
)
from shared.tasks import Supervisor

log = logging.get("hub")

HELLO_TIMEOUT_S = 10.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass
class AgentLink:
    node_id: str
    ws: web.WebSocketResponse
    hello: Hello
    # Where the node's peers reach it: what it advertises, else where it connected from.
    address: str = ""
    # False until welcomed and reconciled: the scheduler places only on ready links, so a
    # launch never precedes the welcome and reconciliation never requeues a fresh launch.
    ready: bool = False

    async def send(self, msg: protocol.Msg) -> bool:
        if self.ws.closed:
            return False
        try:
            await self.ws.send_bytes(protocol.encode(msg))
        except (ConnectionError, RuntimeError):
            return False
        return True


class Hub:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: SchedConfig,
        supervisor: Supervisor,
    ) -> None:
        self.pool = pool
        self.config = config
        self.supervisor = supervisor
        # Set by the scheduler's owner: called on every event that may free or need capacity.
        self.wake: Callable[[], None] = lambda: None
        # Likewise, on GPU samples: a GPU's use going down may let an opportunistic job in.
        self.gpus_sampled: Callable[[], None] = lambda: None
        # And when a job starts: a time-sliced job's turn begins then.
        self.job_started: Callable[[], None] = lambda: None
        self.links: dict[str, AgentLink] = {}
        # The GPUs' busiest figures over the last `gpu_window_s`, for the snapshot.
        self.gpu_window = GpuWindow(config.gpu_window_s)
        self.log_streams: dict[str, asyncio.Queue[LogChunk]] = {}
        self._lost_timers: dict[str, asyncio.Task[None]] = {}
        # Nodes away, not lost yet: (GPUs, away since). A job one of them could hold
        # waits for it rather than run across smaller nodes (`largest_node_gpus`).
        self._away: dict[str, tuple[int, float]] = {}
        # GPUs out of placement: faulty (an XID that points at the GPU, until an admin
        # clears it) or unreadable (its last sample carried an error).
        self.faulty: set[str] = set()
        self.unreadable: set[str] = set()
        # Nodes an admin drained: nothing new is placed there until put back.
        self.drained: set[str] = set()
        self._join_token = config.resolved_join_token().encode()

    async def recall(self) -> None:
        """At start-up: the nodes of the last run may yet come back, and the jobs placed
        on nodes that never do must not hang (each such node gets its lost timer)."""
        for node in await nodes.disconnect_all(self.pool, self.config.node_lost_after_s):
            self._away[node["node_id"]] = (node["gpus"], node["away_since"])
        self.faulty = await nodes.faulty_gpus(self.pool)
        self.drained = await nodes.drained_nodes(self.pool)
        for row in await jobs.placed(self.pool):
            for node_id in {row["node_id"], *(n for n, _ in row["parts"] or ())}:
                self.start_lost_timer(node_id)

    def largest_node_gpus(self) -> int:
        """The GPUs of the largest node connected, or away for less than
        `node_lost_after_s` (it is then expected back)."""
        since = time.time() - self.config.node_lost_after_s
        out = self._gpus_out()  # a drained node is expected back
        sizes = [self._usable(link, out) for link in self.links.values()]
        sizes += [gpus for gpus, away in self._away.values() if away > since]
        return max(sizes, default=0)

    def _gpus_out(self) -> set[str]:
        """The GPUs out of placement on their own: faulty, or unreadable."""
        return self.faulty | self.unreadable

    def out_of_placement(self) -> set[str]:
        """The GPUs nothing new may be placed on: faulty, unreadable, or on a drained node."""
        out = self._gpus_out()
        for node_id in self.drained:
            link = self.links.get(node_id)
            if link is not None:
                out.update(g.uuid for g in link.hello.inventory.gpus)
        return out

    @staticmethod
    def _usable(link: AgentLink, out: set[str]) -> int:
        """The node's GPUs that may take jobs: not among `out`."""
        return sum(g.uuid not in out for g in link.hello.inventory.gpus)

    # ---- connection --------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(presented, self._join_token):
            log.warning("agent refused: bad join token", peer=request.remote)
            raise web.HTTPUnauthorized(text="bad join token")
        ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        try:
            first = await ws.receive(timeout=HELLO_TIMEOUT_S)
            hello = protocol.decode_from_agent(first.data) if first.type in _DATA else None
        except (TimeoutError, protocol.ProtocolError) as exc:
            log.warning("agent refused: no valid hello", peer=request.remote, error=str(exc))
            await ws.close(code=protocol.CLOSE_PROTOCOL_MISMATCH, message=b"expected hello")
            return ws
        if not isinstance(hello, Hello) or hello.protocol != protocol.PROTOCOL_VERSION:
            await ws.close(code=protocol.CLOSE_PROTOCOL_MISMATCH, message=b"protocol mismatch")
            return ws
        address = hello.inventory.address or request.remote or ""
        link = AgentLink(hello.node_id, ws, hello, address=address)
        try:
            await self._attach(link)
            async for msg in ws:
                if msg.type not in _DATA:
                    break
                try:
                    event = protocol.decode_from_agent(msg.data)
                except protocol.ProtocolError as exc:
                    log.warning("bad agent message", node_id=link.node_id, error=str(exc))
                    continue
                await self._dispatch(link, event)
        finally:
            await self._detach(link)
        return ws

    async def _attach(self, link: AgentLink) -> None:
        node_id = link.node_id
        await nodes.register(self.pool, node_id, link.hello.inventory)
        old = self.links.get(node_id)
        # Published before the first await below, so that the old link's detach sees it
        # replaced, and kills sent for this node from now on reach the new link.
        self.links[node_id] = link
        self._away.pop(node_id, None)
        timer = self._lost_timers.pop(node_id, None)
        if timer is not None:
            timer.cancel()
        await link.send(protocol.Welcome(protocol=protocol.PROTOCOL_VERSION))
        if old is not None:
            await old.ws.close(code=protocol.CLOSE_REPLACED, message=b"replaced")
        log.info(
            "agent connected",
            node_id=node_id,
            gpus=len(link.hello.inventory.gpus),
            backend=link.hello.inventory.gpu_backend,
            coordinator=link.hello.inventory.coordinator,
            jobs=len(link.hello.jobs),
        )
        await self._reconcile(link)
        link.ready = True
        self.wake()

    async def _detach(self, link: AgentLink) -> None:
        if self.links.get(link.node_id) is not link:
            return  # replaced by a newer connection of the same node
        del self.links[link.node_id]
        # Its size as expected back: a drained node's GPUs count.
        self._away[link.node_id] = (self._usable(link, self._gpus_out()), time.time())
        # The timer first: a server that cancels the handler of a dropped connection
        # (aiohttp's handler_cancellation) must not leave the node's jobs unaccounted.
        self.start_lost_timer(link.node_id)
        self.wake()
        log.info("agent disconnected", node_id=link.node_id)
        await asyncio.shield(nodes.set_connected(self.pool, link.node_id, False))

    def start_lost_timer(self, node_id: str) -> None:
        if node_id in self.links or node_id in self._lost_timers or self.supervisor.closing:
            return  # at shutdown no timer is needed: the next start sets them up again
        self._lost_timers[node_id] = self.supervisor.spawn(
            self._node_lost_after(node_id), name=f"node-lost:{node_id}"
        )

    async def _node_lost_after(self, node_id: str) -> None:
        await asyncio.sleep(self.config.node_lost_after_s)
        self._lost_timers.pop(node_id, None)
        reason = f"node {node_id} lost for {self.config.node_lost_after_s:g}s"
        for job in await jobs.placed(self.pool, node_id):
            await self._forget(job, node_id, reason)
        self.wake()

    async def _forget(self, job: asyncpg.Record, node_id: str, why: str) -> None:
        """A placed job that its node no longer runs: requeue it, or finish a cancel;
        for a gang, its part there is lost (`gangs.part_ended`)."""
        job_id, attempt, state = job["id"], job["attempt"], JobState(job["state"])
        if await self._part_ended(job, node_id, reason=why, lost=True):
            return
        if state is JobState.CANCELLING:
            await jobs.transition(self.pool, job_id, JobState.CANCELLED, why, attempt=attempt)
        else:
            await jobs.transition(
                self.pool, job_id, JobState.PENDING, f"requeued: {why}", attempt=attempt
            )

    async def _reconcile(self, link: AgentLink) -> None:
        """Make schedd's view of this node and the agent's agree, the agent's being the fact."""
        reports = {(r.job_id, r.attempt): r for r in link.hello.jobs}
        for job in await jobs.placed(self.pool, link.node_id):
            if (job["id"], job["attempt"]) not in reports:
                why = f"node {link.node_id} does not know it (lost)"
                await self._forget(job, link.node_id, why)
        for report in link.hello.jobs:
            await self._apply_report(link, report)
        placed = await jobs.placed(self.pool, link.node_id)
        for upgrade in job_controls.upgrades_for(placed, link.hello.jobs):
            await link.send(upgrade)
        for control in job_controls.resends_for(placed, link.hello.jobs):
            await link.send(control)

    async def _apply_report(self, link: AgentLink, report: JobReport) -> None:
        if report.status == "running":
            await self._on_started(link, report.job_id, report.attempt)
        elif report.reason is not None:
            await self._on_failed(
                link, JobFailed(job_id=report.job_id, attempt=report.attempt, reason=report.reason)
            )
        else:
            await self._on_exited(
                link,
                JobExited(
                    job_id=report.job_id,
                    attempt=report.attempt,
                    exit_code=report.exit_code,
                    signal=report.signal,
                    checkpoint=report.checkpoint,
                ),
            )

    # ---- events ------------------------------------------------------------

    async def _dispatch(self, link: AgentLink, event: protocol.AgentMessage) -> None:
        match event:
            case JobStarted():
                await self._on_started(link, event.job_id, event.attempt)
            case JobExited():
                await self._on_exited(link, event)
            case JobFailed():
                await self._on_failed(link, event)
            case JobProgress():
                if await job_controls.on_progress(self.pool, event):
                    self.wake()  # it may be moved or resized now (Gandiva's moves)
            case JobControlled():
                if await job_controls.on_controlled(self.pool, link.node_id, event):
                    self.wake()  # a migration called off: the GPUs it held are free
            case InputsStaged():
                await job_controls.on_inputs_staged(self.pool, link.node_id, event)
            case GpuState():
                now = time.time()
                before = set(self.unreadable)
                for sample in event.samples:
                    self.gpu_window.add(
                        sample.uuid, now, sample.utilization_pct, sample.memory_used_mib
                    )
                    if sample.error is None:
                        self.unreadable.discard(sample.uuid)
                    else:
                        self.unreadable.add(sample.uuid)
                await nodes.record_samples(self.pool, link.node_id, event.samples)
                if self.unreadable != before:
                    self.wake()  # a GPU left placement, or came back
                self.gpus_sampled()
            case GpuFault():
                await self._on_fault(link, event)
            case LogChunk():
                queue = self.log_streams.get(event.request_id)
                if queue is not None:
                    try:
                        queue.put_nowait(event)
                    except asyncio.QueueFull:
                        queue.get_nowait()  # drop the oldest; the reader is told below
                        queue.put_nowait(
                            LogChunk(
                                request_id=event.request_id,
                                eof=True,
                                error="log reader too slow; stream cut",
                            )
                        )
            case Hello():
                log.warning("second hello ignored", node_id=link.node_id)

    async def _part_ended(self, row: asyncpg.Record, node_id: str, **ending: Any) -> bool:
        """`gangs.part_ended` for the job's part on the node; False for a job on one node."""
        return await gangs.part_ended(
            self.pool, self.send, self.config.kill_grace_s, row, node_id, **ending
        )

    async def _on_fault(self, link: AgentLink, event: GpuFault) -> None:
        """An XID error: logged; one that points at the GPU (not a job's own, by
        `gpu_fault_ignore_xids`) takes it out of placement until an admin clears it."""
        fields = {"node_id": link.node_id, "gpu_uuid": event.uuid, "xid": event.xid}
        if event.xid is not None and event.xid in self.config.gpu_fault_ignore_xids:
            log.warning("gpu error from a job", error=event.error, **fields)
            return
        if await nodes.record_fault(self.pool, link.node_id, event.uuid, event.xid, event.error):
            self.faulty.add(event.uuid)
            log.error("gpu fault: out of placement", error=event.error, **fields)
            self.wake()
        else:  # out already (its first fault is kept), or not a GPU of this node
            log.error("gpu fault", error=event.error, **fields)

    async def drain(self, node_id: str, reason: str, by: str) -> asyncpg.Record | None:
        """An admin takes the node out of placement; its drain, None: no such node."""
        drained = await nodes.drain(self.pool, node_id, reason, by)
        if drained is not None and node_id not in self.drained:
            self.drained.add(node_id)
            log.info("node drained", node_id=node_id, reason=drained["drain_reason"], by=by)
            self.wake()
        return drained

    async def undrain(self, node_id: str, by: str) -> asyncpg.Record | None:
        """An admin puts a drained node back into placement; its drain as it was, None if
        it had none."""
        undone = await nodes.undrain(self.pool, node_id)
        if undone is not None or node_id in self.drained:
            self.drained.discard(node_id)
            reason = undone["drain_reason"] if undone is not None else None
            log.info("node back in placement", node_id=node_id, drained_for=reason, by=by)
            self.wake()
        return undone

    async def clear_fault(self, node_id: str, uuid: str, by: str) -> asyncpg.Record | None:
        """An admin's word that the GPU is sound again: back into placement."""
        cleared = await nodes.clear_fault(self.pool, node_id, uuid)
        if cleared is not None or uuid in self.faulty:
            self.faulty.discard(uuid)
            fault = cleared["fault"] if cleared is not None else None
            log.info("gpu fault cleared", node_id=node_id, gpu_uuid=uuid, fault=fault, by=by)
            self.wake()
        return cleared

    async def _on_started(self, link: AgentLink, job_id: str, attempt: int) -> None:
        # A gang's part: recorded as started; the job runs from its first part's start.
        await gang_parts.started(self.pool, job_id, attempt, link.node_id)
        moved = await jobs.transition(
            self.pool, job_id, JobState.RUNNING, "started", attempt=attempt, node_id=link.node_id
        )
        if moved.ok:
            self.job_started()
            return
        same = moved.attempt == attempt
        if same and moved.current is JobState.RUNNING:
            # A repeated report (a reconnect's hello, a gang's later part), unless it is
            # a part of a gang broken meanwhile whose kill did not reach it: again.
            broken = await gangs.broken(self.pool, job_id, attempt)
            if broken is None:
                return
            why = f"gang broken: {broken}"
        elif same and moved.current in (JobState.CANCELLING, JobState.PREEMPTING):
            # Its kill may have raced the start on the agent, or been lost: again.
            why = "cancelled" if moved.current is JobState.CANCELLING else "preempted"
        else:
            why = "not scheduled here"
        # The agent runs something schedd does not want running there: stop it.
        await link.send(
            Kill(job_id=job_id, attempt=attempt, grace_s=self.config.kill_grace_s, reason=why)
        )

    async def _on_exited(self, link: AgentLink, event: JobExited) -> None:
        await self._record_exit(link.node_id, event)
        await self._ack(link, event.job_id, event.attempt)
        self.wake()

    async def _ack(self, link: AgentLink, job_id: str, attempt: int) -> None:
        """The end is committed: the agent may forget the attempt, and, where the job
        ended for good with it, the job's checkpoints."""
        row = await jobs.get(self.pool, job_id)
        final = row is not None and row["attempt"] == attempt and JobState(row["state"]) in TERMINAL
        await link.send(ExitAck(job_id=job_id, attempt=attempt, final=final))

    async def _record_exit(self, node_id: str, event: JobExited) -> None:
        """What the exit makes of the job; nothing for another attempt's, or an unknown job's."""
        row = await jobs.get(self.pool, event.job_id)
        if row is None or row["attempt"] != event.attempt:
            return
        words = describe_exit(event.exit_code, event.signal)
        ending = {"exit_code": event.exit_code, "exit_signal": event.signal}
        if await self._part_ended(row, node_id, **ending):
            return
        if row["state"] == JobState.PREEMPTING:
            # Whatever the exit code: a preempted job is requeued (attempt kept).
            await self._requeue_preempted(row, event.attempt, words, event.checkpoint)
            return
        if event.checkpoint is not None and row["state"] == JobState.RUNNING:
            await job_controls.on_checkpointed_exit(self.pool, row, event)
            return
        cancelling = row["state"] == JobState.CANCELLING
        if event.exit_code == 0 and event.signal is None:
            target = JobState.SUCCEEDED
        else:
            target = JobState.CANCELLED if cancelling else JobState.FAILED
        await jobs.transition(
            self.pool,
            event.job_id,
            target,
            words,
            attempt=event.attempt,
            exit_code=event.exit_code,
            exit_signal=event.signal,
            reason=words if target is not JobState.SUCCEEDED else None,
        )

    async def _requeue_preempted(
        self, row: asyncpg.Record, attempt: int, words: str, checkpoint: str | None = None
    ) -> None:
        """Back to pending; a checkpoint it saved on its way out is where it resumes."""
        if checkpoint is not None:
            words = f"checkpoint saved, resumes from {checkpoint}"
        why = f"requeued after preemption ({row['reason'] or 'preempted'}): {words}"
        sets = {"checkpoint_path": checkpoint} if checkpoint is not None else {}
        await jobs.transition(
            self.pool,
            row["id"],
            JobState.PENDING,
            why,
            attempt=attempt,
            only_from=(JobState.PREEMPTING,),
            reason=why,
            **sets,
        )

    async def _on_failed(self, link: AgentLink, event: JobFailed) -> None:
        await self._record_failure(link.node_id, event)
        await self._ack(link, event.job_id, event.attempt)
        self.wake()

    async def _record_failure(self, node_id: str, event: JobFailed) -> None:
        """The job could not run, or its end was lost: a gang's part ended, a preempted
        job requeued, any other failed (the transition ignores another attempt's)."""
        row = await jobs.get(self.pool, event.job_id)
        if row is not None and row["attempt"] == event.attempt:
            if await self._part_ended(row, node_id, reason=event.reason):
                return
            if row["state"] == JobState.PREEMPTING:
                await self._requeue_preempted(row, event.attempt, event.reason)
                return
        await jobs.transition(
            self.pool,
            event.job_id,
            JobState.FAILED,
            event.reason,
            attempt=event.attempt,
            reason=event.reason,
        )

    # ---- sending -------------------------------------------------------------

    async def send(self, node_id: str, msg: protocol.Msg) -> bool:
        link = self.links.get(node_id)
        return link is not None and await link.send(msg)

    async def close(self) -> None:
        for link in list(self.links.values()):
            await link.ws.close(code=1001, message=b"schedd shutting down")


_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)
