"""The job-side shim: reports each mini-batch to the node agent and applies its controls.

Standard library only (PyTorch is used when the job itself has imported it and CUDA is
initialised), so this one file can be copied into any job image. Usage::

    from shared import shim          # or `import shim`, where the file was copied

    resumed = shim.resume_state()    # None on a fresh start, else .path and .step
    shim.on_checkpoint(save)         # save(directory) writes the job's state there
    for batch in data:
        with shim.step():
            train(batch)

Environment, set by the agent:
    GPUSCHED_SHIM_SOCKET     the job's Unix socket; unset: the shim only counts steps
    GPUSCHED_JOB_KIND        guaranteed (default) | opportunistic
    GPUSCHED_CHECKPOINT_DIR  where checkpoint-and-exit writes (`step-NNNNNNNNN/`)
    GPUSCHED_RESUME_FROM     a checkpoint directory (or GPUSCHED_CHECKPOINT_DIR) to resume
    GPUSCHED_CHECKPOINT_KEEP checkpoints left in GPUSCHED_CHECKPOINT_DIR after a save,
                             the newest (default 2; 0 keeps every one)

Controls are applied at the end of a step, never inside one. Socket trouble never raises
into the job: a background thread owns the socket and reconnects with capped backoff.
Without an agent a guaranteed job runs unthrottled; an opportunistic one keeps the last
setting it was given. The wire schema is shared/shim_protocol.py; docs/shim.md has it all.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import json
import os
import select
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024  # longest line either side accepts
# The exit status of a job that saved a checkpoint and stopped on request ("checkpointed,
# not failed"). 85 is outside sysexits (64-78, where 75 EX_TEMPFAIL is used by many tools),
# outside the shell's 126/127 and the 128+N of signals, and is not Python's 1 or 2 nor
# automake's 77/99; the agent also checks the manifest the shim wrote.
EXIT_CHECKPOINTED = 85

ENV_SOCKET = "GPUSCHED_SHIM_SOCKET"
ENV_JOB_KIND = "GPUSCHED_JOB_KIND"
ENV_CHECKPOINT_DIR = "GPUSCHED_CHECKPOINT_DIR"
ENV_RESUME_FROM = "GPUSCHED_RESUME_FROM"
ENV_CHECKPOINT_KEEP = "GPUSCHED_CHECKPOINT_KEEP"
CHECKPOINT_KEEP = 2  # the one just saved, and the one before in case it cannot be read
GUARANTEED = "guaranteed"
OPPORTUNISTIC = "opportunistic"

MANIFEST = "shim.json"  # in each checkpoint directory: {"step": N, "saved_at": unix time}
LATEST = "latest.json"  # in GPUSCHED_CHECKPOINT_DIR: {"path": "step-...", "step": N}

START_TIMEOUT_S = 2.0  # the first step waits at most this for the agent's initial controls
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 5.0  # so a lost agent costs at most one connect() every 5 s
FLUSH_TIMEOUT_S = 2.0  # how long the last words before a checkpoint exit may take
EXIT_FLUSH_TIMEOUT_S = 0.5  # the last step reports of a job that ends
OUTBOX_MAX = 256  # step reports the agent has not read yet; older ones are dropped
_MIB = 1024 * 1024
_NO_SIGPIPE = getattr(socket, "MSG_NOSIGNAL", 0)


class CheckpointError(Exception):
    """A checkpoint could not be written, or the one to resume from cannot be read."""


# ---- controls: what the agent asked for (pure) --------------------------------------


@dataclasses.dataclass(frozen=True)
class Controls:
    memory_cap_mib: int | None = None
    share: int = 100  # percent of solo speed; 0 stops the job like `suspended`
    suspended: bool = False
    free_memory: bool = False  # release cached GPU memory while suspended
    checkpoint: bool = False  # save and exit at the next boundary

    @property
    def paused(self) -> bool:
        return self.suspended or self.share == 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_control(line: bytes) -> dict[str, Any] | None:
    """One line from the agent as a message, with defaults filled in; None if it is not one.

    Lenient where the agent is strict: an unknown or malformed message is ignored, so a
    newer agent never breaks an older shim.
    """
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    kind = msg.get("type")
    if kind == "limits":
        cap, share = msg.get("memory_cap_mib"), msg.get("share", 100)
        if cap is not None and not (_is_int(cap) and cap >= 0):
            return None
        if not (_is_int(share) and 0 <= share <= 100):
            return None
        return {"type": kind, "memory_cap_mib": cap, "share": share}
    if kind == "suspend":
        free = msg.get("free_memory", False)
        return {"type": kind, "free_memory": free} if isinstance(free, bool) else None
    if kind in ("resume", "checkpoint", "ready"):
        return {"type": kind}
    return None


def apply_control(controls: Controls, msg: dict[str, Any]) -> Controls:
    """`controls` with one message from parse_control applied."""
    kind = msg["type"]
    if kind == "limits":
        return dataclasses.replace(
            controls, memory_cap_mib=msg["memory_cap_mib"], share=msg["share"]
        )
    if kind == "suspend":
        return dataclasses.replace(controls, suspended=True, free_memory=msg["free_memory"])
    if kind == "resume":
        return dataclasses.replace(controls, suspended=False, free_memory=False)
    if kind == "checkpoint":
        return dataclasses.replace(controls, checkpoint=True)
    return controls  # "ready" changes nothing


def after_agent_loss(controls: Controls, job_kind: str) -> Controls:
    """The rule when the agent is gone: guaranteed runs free, opportunistic keeps its setting.

    A checkpoint already asked for is still carried out.
    """
    if job_kind == OPPORTUNISTIC:
        return controls
    return Controls(checkpoint=controls.checkpoint)


# ---- messages to the agent (pure; tests decode them with shared/shim_protocol.py) -----


def hello_msg(pid: int, job_kind: str, step: int, controls: Controls) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "pid": pid,
        "job_kind": job_kind,
        "step": step,
        "memory_cap_mib": controls.memory_cap_mib,
        "share": controls.share,
        "suspended": controls.paused,
    }


@dataclasses.dataclass(frozen=True)
class Memory:
    allocated_mib: int
    reserved_mib: int
    peak_mib: int  # the most reserved so far (PyTorch's max_memory_reserved)


def step_msg(
    step: int,
    wall_s: float,
    gpu_s: float | None,
    memory: Memory | None,
    cap_met: bool | None,
    spilling: bool,
) -> dict[str, Any]:
    return {
        "type": "step",
        "step": step,
        "wall_s": wall_s,
        "gpu_s": gpu_s,
        "mem_allocated_mib": None if memory is None else memory.allocated_mib,
        "mem_reserved_mib": None if memory is None else memory.reserved_mib,
        "mem_peak_mib": None if memory is None else memory.peak_mib,
        "cap_met": cap_met,
        "spilling": spilling,
    }


def cap_applied_msg(
    cap_mib: int | None, met: bool | None, reserved_mib: int | None, spilling: bool
) -> dict[str, Any]:
    return {
        "type": "cap_applied",
        "memory_cap_mib": cap_mib,
        "met": met,
        "mem_reserved_mib": reserved_mib,
        "spilling": spilling,
    }


def suspended_msg(step: int, freed_mib: int | None) -> dict[str, Any]:
    return {"type": "suspended", "step": step, "freed_mib": freed_mib}


def resumed_msg(step: int) -> dict[str, Any]:
    return {"type": "resumed", "step": step}


def checkpointed_msg(step: int, path: str) -> dict[str, Any]:
    return {"type": "checkpointed", "step": step, "path": path}


def checkpoint_failed_msg(step: int, reason: str) -> dict[str, Any]:
    return {"type": "checkpoint_failed", "step": step, "reason": reason[:1000]}


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def _warn(text: str) -> None:
    with contextlib.suppress(Exception):  # stderr may be closed: never the job's problem
        print(f"gpusched-shim: {text}", file=sys.stderr, flush=True)


# ---- the link: one background thread owns the socket ----------------------------------


class _Link(threading.Thread):
    """Connects (again and again, with capped backoff), sends the outbox, reads controls.

    The job's thread only appends to the outbox and pokes a pipe; it never touches the
    socket, so a slow or dead agent can never block or break a step.
    """

    def __init__(
        self,
        path: str,
        hello: Callable[[], dict[str, Any]],
        on_line: Callable[[bytes], None],
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__(name="gpusched-shim", daemon=True)
        self.path = path
        self._hello, self._on_line, self._on_lost = hello, on_line, on_lost
        self._lock = threading.Lock()
        self._outbox: collections.deque[bytes] = collections.deque(maxlen=OUTBOX_MAX)
        self._connected = False
        self._closing = False
        self._idle = threading.Event()  # set while nothing waits to be sent
        self._idle.set()
        # Set once the agent has sent what it had for the job (its `ready`), or once
        # there is no agent to wait for: the first step waits for this.
        self.settled = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def post(self, msg: dict[str, Any]) -> None:
        """Queue a message; dropped while disconnected (stale reports help nobody)."""
        with self._lock:
            if not self._connected:
                return
            asleep = not self._outbox  # else the thread has a send to do and comes round
            self._outbox.append(encode(msg))
            self._idle.clear()
        if asleep:
            self._wake()

    def flush(self, timeout_s: float) -> bool:
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        self._closing = True
        self._wake()
        self.join(timeout=1.0)
        if not self.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the thread
            os.write(self._wake_w, b"x")

    def _drain_wake(self) -> None:
        # One read, not a loop: while this thread waits for the GIL after each read, the
        # job writes again, and a loop until empty could spin for ever.
        with contextlib.suppress(OSError):
            os.read(self._wake_r, 4096)

    def run(self) -> None:
        try:
            self._connect_again_and_again()
        except BaseException as exc:  # a bug here must not end the job, nor hold it up
            _warn(f"no more contact with the agent: {exc!r}")
        finally:
            self._disconnected()

    def _connect_again_and_again(self) -> None:
        delay = RECONNECT_MIN_S
        while not self._closing:
            sock = None
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(1.0)  # connect() to a full backlog would wait for ever
                sock.connect(self.path)
                sock.setblocking(False)
            except OSError:
                if sock is not None:
                    sock.close()
                self.settled.set()
                select.select([self._wake_r], [], [], delay)
                self._drain_wake()
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            delay = RECONNECT_MIN_S
            try:
                self._serve(sock)
            except OSError:
                pass
            except Exception as exc:  # a bug here must not end the job
                _warn(f"link error: {exc!r}")
            finally:
                sock.close()
                self._disconnected()

    def _serve(self, sock: socket.socket) -> None:
        hello = encode(self._hello())
        with self._lock:
            self._outbox.clear()
            self._outbox.append(hello)
            self._connected = True
            self._idle.clear()
        pending, inbox, fd = b"", b"", sock.fileno()
        while not self._closing:
            writing = [fd] if pending or self._outbox else []
            readable, _, _ = select.select([fd, self._wake_r], writing, [])
            if self._wake_r in readable:
                self._drain_wake()
            if fd in readable:
                data = sock.recv(65536)
                if not data:
                    return  # the agent closed the connection
                *lines, inbox = (inbox + data).split(b"\n")
                if len(inbox) > MAX_LINE_BYTES:
                    return
                for line in lines:
                    self._on_line(line)
            if not pending:
                with self._lock:
                    pending = b"".join(self._outbox)
                    self._outbox.clear()
            if pending:
                with contextlib.suppress(BlockingIOError):
                    # MSG_NOSIGNAL: a job that restored SIGPIPE must not die of a lost agent.
                    pending = pending[sock.send(pending, _NO_SIGPIPE) :]
            if not pending:
                with self._lock:
                    if not self._outbox:
                        self._idle.set()

    def _disconnected(self) -> None:
        with self._lock:
            was_connected, self._connected = self._connected, False
            self._outbox.clear()
            self._idle.set()
        self.settled.set()
        if was_connected and not self._closing:
            self._on_lost()


# ---- PyTorch, when the job uses it -------------------------------------------------


class _Torch:
    """CUDA-event step timing, memory figures, the memory cap and host-memory spill."""

    @staticmethod
    def detect() -> _Torch | None:
        torch = sys.modules.get("torch")  # never imported here: only if the job did
        try:
            if torch is None or not torch.cuda.is_initialized():
                return None
            return _Torch(torch)
        except Exception:
            return None

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.device = torch.cuda.current_device()
        self.total_mib = torch.cuda.get_device_properties(self.device).total_memory // _MIB
        self.need_mib = 0  # the peak reserved, as last seen while not spilling
        self._start: Any = None
        self._spill: Any = None

    def begin(self, spill: bool) -> None:
        # The peak is not reset here: the job may read PyTorch's peak figures itself.
        self._start = self.torch.cuda.Event(enable_timing=True)
        self._start.record()
        if spill:  # saved activations go to pinned host memory until the backward pass
            self._spill = self.torch.autograd.graph.save_on_cpu(pin_memory=True)
            self._spill.__enter__()

    def end(self, failed: bool = False) -> tuple[float | None, Memory]:
        cuda, spilled = self.torch.cuda, self._spill is not None
        if self._spill is not None:
            spill, self._spill = self._spill, None
            spill.__exit__(None, None, None)
        end = cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()  # the step's kernels are done: timing and throttling are honest
        gpu_s = None if self._start is None or failed else self._start.elapsed_time(end) / 1000
        # One read of the allocator's figures: PyTorch's memory_allocated() and the like
        # each flatten all of them (over a hundred) into a new dict, at every step.
        stats = cuda.memory_stats_as_nested_dict(self.device)
        memory = Memory(
            allocated_mib=_all_pools(stats, "allocated_bytes", "current") // _MIB,
            reserved_mib=_all_pools(stats, "reserved_bytes", "current") // _MIB,
            peak_mib=_all_pools(stats, "reserved_bytes", "peak") // _MIB,
        )
        if not spilled:
            self.need_mib = memory.peak_mib
        return gpu_s, memory

    def apply_cap(self, cap_mib: int | None) -> tuple[bool | None, int]:
        """Set the allocator's limit, give back cached blocks; (cap met, reserved MiB)."""
        cuda = self.torch.cuda
        fraction = 1.0 if cap_mib is None else min(1.0, cap_mib / self.total_mib)
        cuda.set_per_process_memory_fraction(fraction, self.device)
        cuda.empty_cache()
        reserved = cuda.memory_reserved(self.device) // _MIB
        return (None if cap_mib is None else reserved <= cap_mib), reserved

    def free_cache(self) -> int:
        before = self.torch.cuda.memory_reserved(self.device)
        self.torch.cuda.empty_cache()
        return int(before - self.torch.cuda.memory_reserved(self.device)) // _MIB


def _all_pools(stats: dict[str, Any], name: str, which: str) -> int:
    """A figure of `torch.cuda.memory_stats_as_nested_dict` over all pools; 0 where the
    allocator keeps none (as PyTorch's own getters answer then)."""
    return int(stats.get(name, {}).get("all", {}).get(which, 0))


# ---- the shim ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResumeState:
    path: str  # the checkpoint directory the save function wrote
    step: int  # steps completed when it was written


def read_checkpoint(path: str) -> ResumeState:
    """The checkpoint at `path`: a `step-*` directory, or a checkpoint dir with latest.json."""
    where = Path(path)
    try:
        if not (where / MANIFEST).exists() and (where / LATEST).exists():
            where = where / json.loads((where / LATEST).read_text())["path"]
        step = json.loads((where / MANIFEST).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot resume from {path}: {exc}") from exc
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"cannot resume from {path}: bad step {step!r}")
    return ResumeState(str(where), step)


def prune_checkpoints(root: Path, newest: Path, keep: int) -> None:
    """Leave `keep` checkpoints in `root` (0: all): `newest` and those saved last before
    it, by their manifests' time (a run that could not resume counts its steps from 0
    again, so names alone do not say which is newer); and no `.partial` directory of a
    save that died (one job saves at a time)."""
    if keep <= 0:
        return
    older = []
    for entry in root.iterdir():
        if not entry.name.startswith("step-") or entry == newest or not entry.is_dir():
            continue
        if entry.name.endswith(".partial"):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        try:
            saved_at = float(json.loads((entry / MANIFEST).read_text())["saved_at"])
        except (OSError, ValueError, KeyError, TypeError):
            saved_at = entry.stat().st_mtime
        older.append((saved_at, entry.name))
    older.sort(reverse=True)
    for _, name in older[keep - 1 :]:
        shutil.rmtree(root / name, ignore_errors=True)


def _keep_from(text: str | None) -> int:
    if not text:
        return CHECKPOINT_KEEP
    try:
        keep = int(text)
    except ValueError:
        keep = -1
    if keep < 0:
        _warn(
            f"{ENV_CHECKPOINT_KEEP}={text!r} is not a count of 0 or more: keeping {CHECKPOINT_KEEP}"
        )
        return CHECKPOINT_KEEP
    return keep


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Shim:
    """One job's shim. Most jobs use the module functions, which share one from the env."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        job_kind: str = GUARANTEED,
        checkpoint_dir: str | None = None,
        resume_from: str | None = None,
        checkpoint_keep: int = CHECKPOINT_KEEP,
    ) -> None:
        if job_kind not in (GUARANTEED, OPPORTUNISTIC):
            _warn(f"unknown job kind {job_kind!r}, taken as {GUARANTEED}")
            job_kind = GUARANTEED
        self.job_kind = job_kind
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_keep = checkpoint_keep
        self._cond = threading.Condition()
        self._controls = Controls()
        self._version = 0  # bumped on every change of _controls, under _cond
        self._save_fn: Callable[[str], object] | None = None
        self._resume: ResumeState | CheckpointError | None = None
        if resume_from:
            try:
                self._resume = read_checkpoint(resume_from)
            except CheckpointError as exc:
                self._resume = exc  # raised to the job by resume_state()
        self._step = self._resume.step if isinstance(self._resume, ResumeState) else 0
        self._torch: _Torch | None = None
        self._started = False
        self._started_at = 0.0
        self._cap_in_force: int | None = None
        self._spilling = False
        self._link: _Link | None = None
        if socket_path:
            self._link = _Link(socket_path, self._hello, self._on_line, self._on_agent_lost)
            self._link.start()
            atexit.register(self._flush_at_exit)
            # A forked child (a data-loader worker, say) must not speak on the job's behalf.
            os.register_at_fork(after_in_child=self._forget_link)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Shim:
        env = os.environ if environ is None else environ
        return cls(
            env.get(ENV_SOCKET) or None,
            job_kind=env.get(ENV_JOB_KIND) or GUARANTEED,
            checkpoint_dir=env.get(ENV_CHECKPOINT_DIR) or None,
            resume_from=env.get(ENV_RESUME_FROM) or None,
            checkpoint_keep=_keep_from(env.get(ENV_CHECKPOINT_KEEP)),
        )

    # ---- the job's API ----

    @property
    def steps(self) -> int:
        """Steps completed, counting those before the checkpoint this run resumed from."""
        return self._step

    def on_checkpoint(self, save: Callable[[str], object]) -> None:
        """`save(directory)` writes the job's state into the (existing, empty) directory."""
        self._save_fn = save

    def resume_state(self) -> ResumeState | None:
        """The checkpoint to resume from, or None; raises CheckpointError if it is unreadable."""
        if isinstance(self._resume, CheckpointError):
            raise self._resume
        return self._resume

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One mini-batch. At its end the shim reports it and applies the agent's controls."""
        self._begin()
        try:
            yield
        except BaseException:
            if self._torch is not None:
                with contextlib.suppress(Exception):
                    self._torch.end(failed=True)
            raise
        self._end()

    def close(self) -> None:
        """Stop talking to the agent; the job runs on unthrottled."""
        if self._link is not None:
            atexit.unregister(self._flush_at_exit)
            self._link.close()
            self._link = None
        self._set_controls(Controls())

    def _forget_link(self) -> None:
        self._link = None

    def _flush_at_exit(self) -> None:
        if self._link is not None:
            self._link.flush(EXIT_FLUSH_TIMEOUT_S)

    # ---- the link's side (background thread) ----

    def _hello(self) -> dict[str, Any]:
        with self._cond:
            controls = self._controls
        return hello_msg(os.getpid(), self.job_kind, self._step, controls)

    def _on_line(self, line: bytes) -> None:
        msg = parse_control(line)
        if msg is None:
            return
        if msg["type"] == "ready" and self._link is not None:
            self._link.settled.set()
        with self._cond:
            self._set_controls_locked(apply_control(self._controls, msg))

    def _on_agent_lost(self) -> None:
        with self._cond:
            self._set_controls_locked(after_agent_loss(self._controls, self.job_kind))
        how = "at its last setting" if self.job_kind == OPPORTUNISTIC else "unthrottled"
        _warn(f"lost the agent; running {how} and trying to reconnect")

    def _set_controls(self, controls: Controls) -> None:
        with self._cond:
            self._set_controls_locked(controls)

    def _set_controls_locked(self, controls: Controls) -> None:
        self._controls = controls
        self._version += 1
        self._cond.notify_all()

    # ---- the step boundary (the job's thread) ----

    def _post(self, msg: dict[str, Any]) -> None:
        if self._link is not None:
            self._link.post(msg)

    def _begin(self) -> None:
        if self._torch is None:
            self._torch = _Torch.detect()
            if self._torch is not None and self._cap_in_force is not None:
                self._apply_cap(self._cap_in_force)  # set before the job's CUDA was up
        if not self._started:
            # The boundary before the first step: controls the agent set before the job
            # was up (an opportunistic job's cap, say) hold from the very first step.
            self._started = True
            if self._link is not None:
                self._link.settled.wait(START_TIMEOUT_S)
            self._boundary(0.0)
        if self._torch is not None:
            try:
                self._torch.begin(self._spilling)
            except Exception as exc:
                _warn(f"PyTorch integration off: {exc!r}")
                self._torch = None
        self._started_at = time.perf_counter()

    def _end(self) -> None:
        gpu_s, memory = None, None
        if self._torch is not None:
            try:
                gpu_s, memory = self._torch.end()
            except Exception as exc:
                _warn(f"PyTorch integration off: {exc!r}")
                self._torch = None
        # After the CUDA sync in end(): a step that never synchronises itself has only
        # launched its kernels when its body returns, and would look as fast as that.
        wall_s = time.perf_counter() - self._started_at
        self._step += 1
        cap = self._cap_in_force
        cap_met = None if memory is None or cap is None else memory.reserved_mib <= cap
        self._post(step_msg(self._step, wall_s, gpu_s, memory, cap_met, self._spilling))
        self._boundary(gpu_s if gpu_s is not None else wall_s)

    def _boundary(self, step_s: float) -> None:
        """Apply the latest controls: cap, checkpoint, suspend (blocks), then throttle."""
        paused, freed = False, False
        while True:
            with self._cond:
                version, controls = self._version, self._controls
            if controls.memory_cap_mib != self._cap_in_force:
                self._apply_cap(controls.memory_cap_mib)
            if controls.checkpoint:
                self._checkpoint_and_exit()  # returns only when the checkpoint failed
                continue
            if not controls.paused:
                break
            if not paused or (controls.free_memory and not freed):
                freed_mib = None
                if controls.free_memory and self._torch is not None:
                    with contextlib.suppress(Exception):
                        freed_mib = self._torch.free_cache()
                    freed = True
                if not paused:
                    self._post(suspended_msg(self._step, freed_mib))
                paused = True
            self._wait_for_change(version, 1.0)  # a timeout only guards a missed wake-up
        if paused:
            self._post(resumed_msg(self._step))
        if 0 < controls.share < 100:
            # At share s the job runs s% of the time: the step, then the rest asleep. A
            # change of controls ends the sleep early; the next boundary applies it.
            self._wait_for_change(version, step_s * (100 / controls.share - 1))

    def _wait_for_change(self, version: int, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout=timeout_s)

    def _apply_cap(self, cap_mib: int | None) -> None:
        met, reserved = None, None
        if self._torch is not None:
            try:
                met, reserved = self._torch.apply_cap(cap_mib)
                # Spill activations to host memory when the job needs more than the cap.
                self._spilling = cap_mib is not None and self._torch.need_mib > cap_mib
            except Exception as exc:
                _warn(f"cannot apply the memory cap: {exc!r}")
                met = False
        self._cap_in_force = cap_mib
        self._post(cap_applied_msg(cap_mib, met, reserved, self._spilling))

    def _checkpoint_and_exit(self) -> None:
        try:
            path = self._save_checkpoint()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            _warn(f"checkpoint failed, running on: {reason}")
            self._post(checkpoint_failed_msg(self._step, reason))
            with self._cond:
                self._set_controls_locked(dataclasses.replace(self._controls, checkpoint=False))
            return
        self._post(checkpointed_msg(self._step, path))
        if self._link is not None:
            self._link.flush(FLUSH_TIMEOUT_S)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if threading.current_thread() is threading.main_thread():
            raise SystemExit(EXIT_CHECKPOINTED)  # the job's `finally` blocks still run
        os._exit(EXIT_CHECKPOINTED)  # SystemExit would end only this thread

    def _save_checkpoint(self) -> str:
        if self._save_fn is None:
            raise CheckpointError("no save function: call shim.on_checkpoint(save) first")
        if not self.checkpoint_dir:
            raise CheckpointError(f"{ENV_CHECKPOINT_DIR} is not set")
        root = Path(self.checkpoint_dir)
        name = f"step-{self._step:09d}"
        final, partial = root / name, root / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            self._save_fn(str(partial))
            _write_json_atomic(partial / MANIFEST, {"step": self._step, "saved_at": time.time()})
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        os.rename(partial, final)  # a checkpoint is complete or absent, never half there
        _write_json_atomic(root / LATEST, {"path": name, "step": self._step})
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            prune_checkpoints(root, final, self.checkpoint_keep)
        except OSError as exc:  # the save is done: a full disk later is the operator's
            _warn(f"older checkpoints in {root} not removed: {exc}")
        return str(final)


# ---- the module API: one shim per process, made from the environment on first use -----

_default: Shim | None = None
_default_lock = threading.Lock()


def get() -> Shim:
    global _default
    with _default_lock:
        if _default is None:
            _default = Shim.from_env()
        return _default


def step() -> contextlib.AbstractContextManager[None]:
    """`with shim.step():` around each mini-batch."""
    return get().step()


def on_checkpoint(save: Callable[[str], object]) -> None:
    get().on_checkpoint(save)


def resume_state() -> ResumeState | None:
    return get().resume_state()
