"""The agent's end of the shim: one Unix socket per job, controls out, reports in.

Each job gets `<socket_dir>/<key>.sock`, mode 0600 and owned by the job's user, so only
the job (and root) can connect. A connection becomes the job's once it sends a valid
`hello`; each process of the job (a rank per GPU, say) has its own, and a process that
connects again replaces its older one. Controls are kept per job, sent to all of its
processes, and sent again on every connect, then `ready`: so a control set before the
job is up holds from its first step, and only the latest of each kind arrives. One
process speaks for the job (its reporter, the first connected; the next when it goes):
only its steps and its acks of controls (`cap_applied`, `suspended`, `resumed`) are
the job's, so that a job of N ranks in step counts each step once, not N times.
Hellos and checkpoint outcomes count from every process. Anything
malformed (not JSON, a wrong type, an unknown message, a line over MAX_LINE_BYTES)
closes that one connection with a warning; every other connection and job carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msgspec import UNSET, UnsetType

from shared import logging
from shared.shim_protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Checkpoint,
    Checkpointed,
    CheckpointFailed,
    FromShim,
    Hello,
    Limits,
    Ready,
    Resume,
    ShimMsg,
    ShimProtocolError,
    Step,
    Suspend,
    decode_from_shim,
    encode,
)

log = logging.get("shim_server")

HELLO_TIMEOUT_S = 10.0  # a connection that says nothing is closed after this
MAX_CONNECTIONS_PER_JOB = 16  # one per process of the job (a rank per GPU), and spares
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Called with (job key, message) for the hello of each of a job's processes, for its
# reporter's messages, and for a checkpoint's outcome from any of them. It runs in the
# event loop and must not block.
ShimEventSink = Callable[[str, FromShim], None]


class BadMessage(Exception):
    pass


@dataclass
class _Job:
    key: str
    path: Path
    server: asyncio.Server | None = None
    limits: Limits | None = None  # the latest of each control, resent on every connect
    pause: Suspend | Resume | None = None
    checkpoint: bool = False  # until the shim says it saved or failed
    shims: dict[int, asyncio.StreamWriter] = field(default_factory=dict)  # by pid, after hello
    reporter: int | None = None  # the pid that speaks for the job
    hello: Hello | None = None  # the latest
    report: Step | None = None
    connections: dict[asyncio.StreamWriter, asyncio.Task[None]] = field(default_factory=dict)


class ShimServer:
    def __init__(self, socket_dir: Path, on_event: ShimEventSink | None = None) -> None:
        self.socket_dir = socket_dir
        self.on_event = on_event
        self._jobs: dict[str, _Job] = {}

    # ---- sockets -----------------------------------------------------------------

    async def open_job(self, key: str, uid: int | None = None, gid: int | None = None) -> Path:
        """Create the job's socket (again, after an agent restart) and return its path.

        `key` names the job on this node (the runner's `job_id.attempt`, say). The socket
        is chowned to `uid`/`gid` when given and the agent runs as root.
        """
        if not _KEY.fullmatch(key):
            raise ValueError(f"bad shim key {key!r}")
        if key in self._jobs:
            return self._jobs[key].path
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        job = _Job(key, self.socket_dir / f"{key}.sock")
        with contextlib.suppress(FileNotFoundError):
            job.path.unlink()  # left by an agent that stopped before it could clean up
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Linux takes a socket file's mode from the socket at bind(): set before it,
            # the file is never open to others, not even for an instant.
            os.fchmod(sock.fileno(), 0o600)
            sock.bind(str(job.path))
            os.chmod(job.path, 0o600)
            if os.geteuid() == 0 and (uid is not None or gid is not None):
                os.chown(job.path, -1 if uid is None else uid, -1 if gid is None else gid)
            job.server = await asyncio.start_unix_server(
                lambda r, w: self._serve(job, r, w), sock=sock, limit=MAX_LINE_BYTES
            )
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                job.path.unlink()
            raise
        self._jobs[key] = job
        log.info("shim socket open", job_id=key, path=str(job.path))
        return job.path

    async def close_job(self, key: str) -> None:
        """Close the job's connections and remove its socket; unknown keys are ignored."""
        job = self._jobs.pop(key, None)
        if job is None:
            return
        if job.server is not None:
            job.server.close()
        for writer in job.connections:
            writer.close()
        with contextlib.suppress(FileNotFoundError):
            job.path.unlink()
        if job.server is not None:
            await job.server.wait_closed()
        # Each connection's task ends at the EOF that closing it caused.
        tasks = list(job.connections.values())
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=1.0)
            for task in stuck:
                task.cancel()

    async def close(self) -> None:
        for key in list(self._jobs):
            await self.close_job(key)

    # ---- controls ------------------------------------------------------------------

    def set_limits(
        self,
        key: str,
        *,
        memory_cap_mib: int | UnsetType | None = UNSET,
        share: int | UnsetType = UNSET,
    ) -> None:
        """Change the cap (None lifts it) and/or the share (0-100); what is left out stays."""
        job = self._jobs[key]
        current = job.limits or Limits()
        limits = Limits(
            memory_cap_mib=current.memory_cap_mib if memory_cap_mib is UNSET else memory_cap_mib,
            share=current.share if share is UNSET else share,
        )
        if not 0 <= limits.share <= 100 or (limits.memory_cap_mib or 0) < 0:
            raise ValueError(f"bad limits {limits}")
        job.limits = limits
        self._send(job, limits)

    def suspend(self, key: str, *, free_memory: bool = False) -> None:
        job = self._jobs[key]
        job.pause = Suspend(free_memory=free_memory)
        self._send(job, job.pause)

    def resume(self, key: str) -> None:
        job = self._jobs[key]
        job.pause = Resume()
        self._send(job, job.pause)

    def checkpoint(self, key: str) -> None:
        """Ask the job to save and exit with EXIT_CHECKPOINTED at its next boundary."""
        job = self._jobs[key]
        job.checkpoint = True
        self._send(job, Checkpoint())

    # ---- what the shims said ---------------------------------------------------------

    def report(self, key: str) -> Step | None:
        """The job's latest step report."""
        job = self._jobs.get(key)
        return None if job is None else job.report

    def hello(self, key: str) -> Hello | None:
        """What the job's shim said when it (last) connected."""
        job = self._jobs.get(key)
        return None if job is None else job.hello

    def reporter(self, key: str) -> int | None:
        """The pid of the process that speaks for the job; None while none is connected."""
        job = self._jobs.get(key)
        return None if job is None else job.reporter

    def is_open(self, key: str) -> bool:
        """Whether the job has a socket here (its shim may not have connected yet)."""
        return key in self._jobs

    def connected(self, key: str) -> bool:
        job = self._jobs.get(key)
        return job is not None and bool(job.shims)

    # ---- connections -----------------------------------------------------------------

    def _send(self, job: _Job, msg: ShimMsg) -> None:
        """To every process of the job: a control holds for the job as a whole."""
        line = encode(msg)
        for writer in job.shims.values():
            if not writer.is_closing():
                writer.write(line)

    async def _serve(
        self, job: _Job, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(job.connections) >= MAX_CONNECTIONS_PER_JOB:
            log.warning("too many shim connections, closing", job_id=job.key)
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's handler as a task
        job.connections[writer] = task
        pid: int | None = None
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                hello = await _read(reader)
            if hello is None:
                return
            if not isinstance(hello, Hello) or hello.protocol != PROTOCOL_VERSION:
                raise BadMessage(f"expected hello with protocol {PROTOCOL_VERSION}")
            self._attach(job, writer, hello)
            pid = hello.pid
            while (msg := await _read(reader)) is not None:
                if isinstance(msg, Hello):
                    raise BadMessage("a second hello")
                self._received(job, msg, pid)
        except BadMessage as exc:
            log.warning("bad shim message, closing", job_id=job.key, reason=str(exc)[:300])
        except TimeoutError:
            log.warning("no hello from shim, closing", job_id=job.key)
        except (ConnectionError, OSError):
            pass
        finally:
            job.connections.pop(writer, None)
            if pid is not None and job.shims.get(pid) is writer:
                del job.shims[pid]
                if job.reporter == pid:  # the next connected process speaks for the job
                    job.reporter = next(iter(job.shims), None)
                log.info("shim disconnected", job_id=job.key, pid=pid)
            writer.close()

    def _attach(self, job: _Job, writer: asyncio.StreamWriter, hello: Hello) -> None:
        older = job.shims.get(hello.pid)
        if older is not None:
            older.close()  # the process reconnected; its older connection is dead to it
        job.shims[hello.pid], job.hello = writer, hello
        if job.reporter not in job.shims:
            job.reporter = hello.pid
        log.info(
            "shim connected",
            job_id=job.key,
            pid=hello.pid,
            job_kind=hello.job_kind,
            step=hello.step,
            share=hello.share,
            suspended=hello.suspended,
        )
        self._emit(job, hello)
        for msg in (job.limits, job.pause, Checkpoint() if job.checkpoint else None, Ready()):
            if msg is not None:
                writer.write(encode(msg))

    def _received(self, job: _Job, msg: FromShim, pid: int) -> None:
        if isinstance(msg, Checkpointed | CheckpointFailed):
            job.checkpoint = False
            log.info("shim checkpoint", job_id=job.key, step=msg.step, outcome=type(msg).__name__)
        elif pid != job.reporter:
            return  # another rank's step or ack: the reporter's stand for the job
        elif isinstance(msg, Step):
            job.report = msg
        self._emit(job, msg)

    def _emit(self, job: _Job, msg: FromShim) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(job.key, msg)
        except Exception:  # the agent's bug: logged, and the shim's connection lives on
            log.exception("shim event handler failed", job_id=job.key)


async def _read(reader: asyncio.StreamReader) -> FromShim | None:
    """The next message, None at the end of the stream; BadMessage for anything else."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None  # closed, perhaps halfway through a line: the shim's process ended
    except asyncio.LimitOverrunError as exc:
        raise BadMessage(f"line longer than {MAX_LINE_BYTES} bytes") from exc
    try:
        return decode_from_shim(line)
    except ShimProtocolError as exc:
        raise BadMessage(f"{exc}: {line[:200]!r}") from exc
