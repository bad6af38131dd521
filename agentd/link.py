"""The agent's websocket to schedd: connect, hello, then events both ways.

Reconnects with exponential backoff and full jitter. Outgoing messages go through one
queue drained by one sender, so schedd sees them in the order they happened. While
offline nothing is queued: the state on disk is reported again in the next hello, and
exits are sent again until schedd acknowledges them.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp

from agentd import logs
from agentd.coordination import Coordination
from agentd.gpu import GpuBackend, changed
from agentd.job_controls import JobControls
from agentd.job_observers import job_key
from agentd.kill import kill
from agentd.runner import Runner, end_message
from agentd.stager import Reader, StageError, StageProgress, Stager
from shared import logging, protocol
from shared.config import AgentConfig
from shared.protocol import (
    Checkpoint,
    ExitAck,
    GpuSample,
    GpuState,
    Hello,
    InputsStaged,
    Inventory,
    JobControlled,
    Kill,
    Launch,
    LogCancel,
    LogRequest,
    Msg,
    Prefetch,
    Resume,
    SetKind,
    SetLimits,
    Suspend,
    Welcome,
)
from shared.tasks import Supervisor

log = logging.get("link")

BACKOFF_FIRST_S = 0.5


class Link:
    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        backend: GpuBackend,
        supervisor: Supervisor,
    ) -> None:
        self.config = config
        self.node_id = config.resolved_node_id()
        self.inventory = inventory
        self.backend = backend
        self.supervisor = supervisor
        # The runner posts through this link, so the owner sets it after building both.
        self.runner: Runner | None = None
        self.controls: JobControls | None = None
        self.coordination: Coordination | None = None  # None: coordinator disabled
        self._send_lock = asyncio.Lock()
        self._outbox: asyncio.Queue[Msg] | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._log_tasks: dict[str, asyncio.Task[None]] = {}
        self._last_samples: dict[str, GpuSample] = {}
        self.connected = asyncio.Event()

    def post(self, msg: Msg) -> None:
        """Queue a message for schedd; dropped while offline (the next hello covers it)."""
        if self._outbox is not None:
            self._outbox.put_nowait(msg)

    async def send_now(self, msg: Msg) -> bool:
        ws = self._ws
        if ws is None or ws.closed:
            return False
        try:
            async with self._send_lock:
                await ws.send_bytes(protocol.encode(msg))
        except (ConnectionError, RuntimeError):
            return False
        return True

    # ---- connection loop -------------------------------------------------------

    async def run(self) -> None:
        delay = BACKOFF_FIRST_S
        url = self.config.websocket_url()
        headers = {"Authorization": f"Bearer {self.config.resolved_join_token()}"}
        async with aiohttp.ClientSession() as http:
            while True:
                welcomed = False
                try:
                    async with http.ws_connect(
                        url, headers=headers, heartbeat=10.0, max_msg_size=4 * 1024 * 1024
                    ) as ws:
                        welcomed = await self._session(ws)
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.warning("cannot reach schedd", url=url, error=str(exc))
                finally:
                    self._ws = None
                    self._outbox = None
                    self.connected.clear()
                    for task in self._log_tasks.values():
                        task.cancel()
                    self._log_tasks.clear()
                if welcomed:
                    delay = BACKOFF_FIRST_S
                # Full jitter: many agents that lost schedd together do not return together.
                await asyncio.sleep(random.uniform(0, delay))
                delay = min(delay * 2, self.config.reconnect_max_s)

    async def _session(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        assert self.runner is not None
        reported = self.runner.reports()
        await ws.send_bytes(
            protocol.encode(
                Hello(
                    protocol=protocol.PROTOCOL_VERSION,
                    node_id=self.node_id,
                    inventory=self.inventory,
                    jobs=reported,
                )
            )
        )
        first = await ws.receive(timeout=30.0)
        if first.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            log.warning(
                "schedd closed the link before welcome", code=ws.close_code, reason=str(first.extra)
            )
            return False
        if not isinstance(protocol.decode_from_sched(first.data), Welcome):
            log.warning("schedd did not welcome us")
            return False
        self._ws = ws
        self._outbox = asyncio.Queue()
        self._last_samples = {}
        self.connected.set()
        log.info("connected to schedd", node_id=self.node_id, jobs=len(reported))
        # Ends that happened while the hello was on its way were not in it.
        in_hello = {(r.job_id, r.attempt) for r in reported}
        for job in list(self.runner.jobs.values()):
            if job.ended is not None and job.key not in in_hello:
                self.post(end_message(job))
        sender = self.supervisor.spawn(self._drain(ws, self._outbox), name="link-sender")
        try:
            async for msg in ws:
                if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    break
                try:
                    command = protocol.decode_from_sched(msg.data)
                except protocol.ProtocolError as exc:
                    log.warning("bad message from schedd", error=str(exc))
                    continue
                self._dispatch(command)
        finally:
            sender.cancel()
        log.warning("link to schedd closed", code=ws.close_code)
        return True

    async def _drain(self, ws: aiohttp.ClientWebSocketResponse, outbox: asyncio.Queue[Msg]) -> None:
        while True:
            msg = await outbox.get()
            async with self._send_lock:
                await ws.send_bytes(protocol.encode(msg))

    # ---- commands from schedd -------------------------------------------------------

    def _dispatch(self, command: protocol.SchedMessage) -> None:
        runner = self.runner
        assert runner is not None
        match command:
            case Launch():
                self.supervisor.spawn(runner.start(command), name=f"launch:{command.job_id}")
            case Kill():
                self.supervisor.spawn(
                    kill(runner, self.controls, command), name=f"kill:{command.job_id}"
                )
            case ExitAck():
                runner.ack(command.job_id, command.attempt, command.final)
            case SetLimits() | Suspend() | Resume() | Checkpoint():
                self._control(command)
            case SetKind():
                self._set_kind(command)
            case Prefetch():
                if runner.stager is not None:
                    self.supervisor.spawn(
                        prefetch_for(runner, command), name=f"prefetch:{command.job_id}"
                    )
            case LogRequest():
                rid = command.request_id
                task = self.supervisor.spawn(
                    logs.serve(runner, command, self.send_now), name="logs"
                )
                self._log_tasks[rid] = task
                task.add_done_callback(lambda _t: self._forget_log_task(rid))
            case LogCancel():
                stream = self._log_tasks.pop(command.request_id, None)
                if stream is not None:
                    stream.cancel()
            case Welcome():
                pass

    def _set_kind(self, command: SetKind) -> None:
        """The next hello reports the new kind only if it was taken: a refused upgrade is
        sent again when the agent reconnects."""
        taken = True
        if self.coordination is None:
            why = f"{command.kind}: no coordinator on this node, nothing is throttled here"
            self.post(
                JobControlled(
                    job_id=command.job_id, attempt=command.attempt, event="kind", detail=why
                )
            )
        else:
            try:
                key = job_key(command.job_id, command.attempt)
                taken = self.coordination.set_kind(key, command.kind)
            except Exception:  # one job's kind gone wrong must not take the link down
                log.exception("kind change failed", job_id=command.job_id, kind=command.kind)
                taken = False
        if taken and self.runner is not None:
            self.runner.set_kind(command.job_id, command.attempt, command.kind)

    def _control(self, command: SetLimits | Suspend | Resume | Checkpoint) -> None:
        controls = self.controls
        if controls is None:
            log.warning("job controls not available", job_id=command.job_id)
            return
        try:
            self._apply_control(controls, command)
            if self.coordination is not None and isinstance(command, Suspend | Resume):
                # A suspended guaranteed job gives its GPUs' coordinators up to the job
                # taking its turn there (time-slicing), until it is resumed.
                key = job_key(command.job_id, command.attempt)
                self.coordination.suspended(key, isinstance(command, Suspend))
        except Exception:  # one control gone wrong must not take the link down
            log.exception(
                "job control failed", job_id=command.job_id, control=type(command).__name__
            )

    @staticmethod
    def _apply_control(
        controls: JobControls, command: SetLimits | Suspend | Resume | Checkpoint
    ) -> None:
        match command:
            case SetLimits():
                controls.set_limits(
                    command.job_id, command.attempt, command.share, command.memory_cap_mib
                )
            case Suspend():
                controls.suspend(command.job_id, command.attempt, command.free_memory)
            case Resume():
                controls.resume(command.job_id, command.attempt)
            case Checkpoint():
                controls.checkpoint(command.job_id, command.attempt)

    def _forget_log_task(self, request_id: str) -> None:
        self._log_tasks.pop(request_id, None)

    # ---- GPU sampling ------------------------------------------------------------------

    async def sample_gpus(self) -> None:
        """Sample in a thread; push only what changed beyond the thresholds."""
        while True:
            await self.connected.wait()
            samples = await asyncio.to_thread(self.backend.sample)
            if changed(
                self._last_samples,
                samples,
                self.config.gpu_util_threshold_pct,
                self.config.gpu_memory_threshold_mib,
            ):
                self.post(GpuState(samples=samples))
                self._last_samples = {s.uuid: s for s in samples}
            await asyncio.sleep(self.config.gpu_sample_interval_s)


PREFETCH = "prefetch:"  # the stager's key for a prefetch, apart from the job's own launch


def inputs_staged(report: StageProgress) -> InputsStaged:
    """The stager's progress as schedd hears it (a prefetch's under the job's id)."""
    return InputsStaged(
        job_id=report.job_key.removeprefix(PREFETCH),
        input=report.input,
        bytes_done=report.bytes_done,
        bytes_total=report.bytes_total,
        done=report.done,
        error=report.error,
    )


async def prefetch_for(runner: Runner, command: Prefetch) -> None:
    """`prefetch` with the rights of the account the job would run as."""
    assert runner.stager is not None
    await prefetch(runner.stager, command, await runner.account_of(command.user))


async def prefetch(stager: Stager, command: Prefetch, reader: Reader = None) -> None:
    """Copy the inputs now and leave them in the cache, unpinned: the launch, if it comes
    here, pins them again (and waits for this copy if it is still going); if the job is
    placed elsewhere, the copies are just the least recently used, free to evict. Under
    `run_jobs_as = "owner"` (`reader`), nothing its owner could not read is copied: the
    cache is open to every user of the node."""
    key = PREFETCH + command.job_id
    try:
        await stager.stage(key, command.inputs, reader)
    except StageError:
        pass  # the progress reports carry the reason to schedd
    finally:
        stager.release(key)
