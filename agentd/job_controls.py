"""Between schedd and the jobs' shims: controls in, progress and control events out.

schedd's `set_limits`, `suspend`, `resume` and `checkpoint` reach the job's shim through
the shim server, which holds them for a shim that has not connected yet. A job with no
shim connected is suspended with SIGSTOP (and resumed with SIGCONT) on its process
group, and is reported as not checkpointable. What the shims report becomes, for
schedd, one `JobProgress` a job per `progress_interval_s` at most (and only when it
changed), and a `JobControlled` event each time a job acts on a control.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentd.coordinator import limits_words
from agentd.job_observers import job_key
from agentd.shim_server import ShimServer
from shared import logging
from shared.protocol import ControlEvent, JobControlled, JobProgress, Msg
from shared.shim_protocol import (
    CapApplied,
    Checkpointed,
    CheckpointFailed,
    FromShim,
    Hello,
    Resumed,
    Step,
    Suspended,
)

log = logging.get("job_controls")

PgidOf = Callable[[str, int], int | None]  # (job_id, attempt) -> the job's process group


def _job_of(key: str) -> tuple[str, int]:
    job_id, _, attempt = key.rpartition(".")
    return job_id, int(attempt)


@dataclass
class _Progress:
    """Steps seen since the last report sent to schedd."""

    step: int = 0
    steps: int = 0
    wall_s: float = 0.0
    gpu_s: float = 0.0
    gpu_steps: int = 0
    mem_reserved_mib: int | None = None
    mem_peak_mib: int | None = None
    since: float = 0.0  # monotonic time of the last report
    last_rate: float = 0.0
    sent_step: int = -1


class JobControls:
    def __init__(
        self, shims: ShimServer, post: Callable[[Msg], None], pgid_of: PgidOf, interval_s: float
    ) -> None:
        self.shims = shims
        self.post = post
        self.pgid_of = pgid_of
        self.interval_s = interval_s
        self._progress: dict[str, _Progress] = {}
        self._stopped: set[str] = set()  # suspended with SIGSTOP, not through a shim
        # Jobs asked to save before a kill: set when the save fails (`save_before_kill`).
        self._save_failed: dict[str, asyncio.Event] = {}
        # Takes schedd's limits of a job as a bound where the GPUs' coordinators steer it
        # (`Coordination.bound`); False: they are its setting. None: no coordinator here.
        self.bound: Callable[[str, int, int | None], bool] | None = None

    # ---- from the shims ------------------------------------------------------------

    def on_shim_event(self, key: str, msg: FromShim) -> None:
        """The shim server's sink: runs in the event loop."""
        job_id, attempt = _job_of(key)
        match msg:
            case Hello():
                self._progress.setdefault(key, _Progress(step=msg.step, since=time.monotonic()))
            case Step():
                p = self._progress.setdefault(key, _Progress(since=time.monotonic()))
                p.step = msg.step
                p.steps += 1
                p.wall_s += msg.wall_s
                if msg.gpu_s is not None:
                    p.gpu_s += msg.gpu_s
                    p.gpu_steps += 1
                p.mem_reserved_mib = msg.mem_reserved_mib
                p.mem_peak_mib = msg.mem_peak_mib
            case CapApplied():
                met = {True: "met", False: "not met", None: "no GPU to cap"}[msg.met]
                spill = ", spilling activations to host memory" if msg.spilling else ""
                self._event(
                    job_id,
                    attempt,
                    "cap_applied",
                    None,
                    f"memory cap {msg.memory_cap_mib} MiB: {met}{spill}",
                )
            case Suspended():
                freed = f", {msg.freed_mib} MiB of cached GPU memory freed" if msg.freed_mib else ""
                self._event(
                    job_id, attempt, "suspended", msg.step, f"suspended at step {msg.step}{freed}"
                )
            case Resumed():
                self._event(job_id, attempt, "resumed", msg.step, f"resumed at step {msg.step}")
            case Checkpointed():
                self.post(
                    JobControlled(
                        job_id=job_id,
                        attempt=attempt,
                        event="checkpointed",
                        step=msg.step,
                        detail=f"checkpoint of step {msg.step} saved",
                        path=msg.path,
                    )
                )
            case CheckpointFailed():
                self._event(job_id, attempt, "checkpoint_failed", msg.step, msg.reason)
                failed = self._save_failed.pop(key, None)
                if failed is not None:
                    failed.set()

    def _event(
        self, job_id: str, attempt: int, event: ControlEvent, step: int | None, detail: str
    ) -> None:
        log.info("job control", job_id=job_id, attempt=attempt, control=event, detail=detail)
        self.post(
            JobControlled(job_id=job_id, attempt=attempt, event=event, step=step, detail=detail)
        )

    def report_progress(self, now: float | None = None) -> None:
        """Send what changed since the last report, for every job with a shim."""
        now = time.monotonic() if now is None else now
        for key, p in list(self._progress.items()):
            elapsed = now - p.since
            if elapsed < self.interval_s * 0.999:
                continue
            rate = p.steps / elapsed if elapsed > 0 else 0.0
            if p.steps == 0 and p.last_rate == 0.0 and p.sent_step == p.step:
                p.since = now
                continue  # nothing moved and schedd already knows it stands still
            job_id, attempt = _job_of(key)
            self.post(
                JobProgress(
                    job_id=job_id,
                    attempt=attempt,
                    step=p.step,
                    steps_per_s=round(rate, 4),
                    step_wall_s=round(p.wall_s / p.steps, 6) if p.steps else None,
                    gpu_s=round(p.gpu_s / p.gpu_steps, 6) if p.gpu_steps else None,
                    mem_reserved_mib=p.mem_reserved_mib,
                    mem_peak_mib=p.mem_peak_mib,
                )
            )
            p.since, p.last_rate, p.sent_step = now, rate, p.step
            p.steps, p.wall_s, p.gpu_s, p.gpu_steps = 0, 0.0, 0.0, 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.report_progress()

    def job_started(self, key: str, kind: str, gpu_uuids: list[str]) -> None:
        pass  # progress starts with the shim's hello

    def job_ended(self, key: str) -> None:
        self._progress.pop(key, None)
        self._stopped.discard(key)
        self._save_failed.pop(key, None)

    # ---- from schedd -------------------------------------------------------------------

    def set_limits(self, job_id: str, attempt: int, share: int, memory_cap_mib: int | None) -> None:
        key = job_key(job_id, attempt)
        if not self._has_socket(key):
            self._refuse(job_id, attempt, "limits", "the job is not running on this node")
            return
        words = limits_words(share, memory_cap_mib)
        if self.bound is not None and self.bound(key, share, memory_cap_mib):
            detail = f"at most {words}: the coordinators of its GPUs give no more"
            self._event(job_id, attempt, "limits", None, detail)
            return
        self.shims.set_limits(key, share=share, memory_cap_mib=memory_cap_mib)
        held = "" if self.shims.connected(key) else " (held until the job's shim connects)"
        self._event(job_id, attempt, "limits", None, f"{words}{held}")

    def suspend(self, job_id: str, attempt: int, free_memory: bool) -> None:
        key = job_key(job_id, attempt)
        if self._has_socket(key) and self.shims.connected(key):
            self.shims.suspend(key, free_memory=free_memory)
        elif self._signal(job_id, attempt, signal.SIGSTOP):
            self._stopped.add(key)
            self._event(job_id, attempt, "suspended", None, "suspended with SIGSTOP: no shim")
        else:
            self._refuse(job_id, attempt, "suspended", "the job is not running on this node")

    def resume(self, job_id: str, attempt: int) -> None:
        key = job_key(job_id, attempt)
        if key in self._stopped:
            self._stopped.discard(key)
            if self._signal(job_id, attempt, signal.SIGCONT):
                self._event(job_id, attempt, "resumed", None, "resumed with SIGCONT")
        elif self._has_socket(key):
            self.shims.resume(key)

    def checkpoint(self, job_id: str, attempt: int) -> None:
        key = job_key(job_id, attempt)
        if self._has_socket(key) and self.shims.connected(key):
            self.shims.checkpoint(key)
        else:
            self._event(
                job_id,
                attempt,
                "checkpoint_failed",
                None,
                "not checkpointable: the job has no shim connected",
            )

    def save_before_kill(self, job_id: str, attempt: int) -> asyncio.Event | None:
        """Ask the job's shim to save a checkpoint at its next mini-batch and exit (a
        preemption's first step); the event is set if the save fails. None, and nothing
        asked, where no shim is connected to save."""
        key = job_key(job_id, attempt)
        if not (self._has_socket(key) and self.shims.connected(key)):
            return None
        failed = self._save_failed[key] = asyncio.Event()
        self.shims.checkpoint(key)
        log.info("checkpoint before kill", job_id=job_id, attempt=attempt)
        return failed

    def saving(self, job_id: str, attempt: int) -> bool:
        """Whether the job was asked to save before a kill and has not ended, nor failed
        to save, since."""
        return job_key(job_id, attempt) in self._save_failed

    def save_over(self, job_id: str, attempt: int) -> None:
        """A kill waited for the job's save as long as it would: it is no longer saving."""
        self._save_failed.pop(job_key(job_id, attempt), None)

    def _has_socket(self, key: str) -> bool:
        return self.shims.is_open(key)

    def _refuse(self, job_id: str, attempt: int, event: ControlEvent, why: str) -> None:
        log.warning(
            "job control refused", job_id=job_id, attempt=attempt, control=event, reason=why
        )

    def _signal(self, job_id: str, attempt: int, sig: signal.Signals) -> bool:
        pgid = self.pgid_of(job_id, attempt)
        if pgid is None:
            return False
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True
