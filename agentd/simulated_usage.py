"""Simulated GPUs' utilisation and memory, derived from what the jobs' shims report.

With no NVIDIA GPU, the agent's GPUs are simulated; this makes their samples say what a
real GPU would: each job's reserved memory on each of its GPUs, and how busy it keeps
them (its step's GPU time, or wall time without CUDA, over the time between two step
reports, so that a throttled or suspended job counts as mostly idle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agentd.gpu import SimulatedBackend
from shared.shim_protocol import FromShim, Hello, Step, Suspended


@dataclass
class _Job:
    gpu_uuids: list[str]
    pids: set[int] = field(default_factory=set)
    last_step_at: dict[int, float] = field(default_factory=dict)  # pid -> when


class SimulatedUsage:
    def __init__(
        self, backend: SimulatedBackend, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.backend = backend
        self.clock = clock
        self._jobs: dict[str, _Job] = {}
        self._pid_of: dict[str, int] = {}  # the latest hello's pid, by job key

    def job_started(self, key: str, kind: str, gpu_uuids: list[str]) -> None:
        self._jobs[key] = _Job(list(gpu_uuids))

    def job_ended(self, key: str) -> None:
        job = self._jobs.pop(key, None)
        self._pid_of.pop(key, None)
        for pid in job.pids if job is not None else ():
            self.backend.forget_job(pid)

    def on_shim_event(self, key: str, msg: FromShim) -> None:
        job = self._jobs.get(key)
        if job is None:
            return
        match msg:
            case Hello():
                self._pid_of[key] = msg.pid
                job.pids.add(msg.pid)
            case Step():
                pid = self._pid_of.get(key)
                if pid is None:
                    return
                now = self.clock()
                since = job.last_step_at.get(pid)
                job.last_step_at[pid] = now
                if since is None or now <= since:
                    return  # one report gives no interval yet
                busy = (msg.gpu_s if msg.gpu_s is not None else msg.wall_s) / (now - since)
                memory = msg.mem_reserved_mib or 0
                self.backend.note_job(job.gpu_uuids, pid, memory, min(busy, 1.0))
            case Suspended():
                pid = self._pid_of.get(key)
                if pid is not None:
                    # Suspended: no compute; its memory stays but for the cache it freed.
                    held = max(self.backend.memory_of(pid) - (msg.freed_mib or 0), 0)
                    self.backend.note_job(job.gpu_uuids, pid, held, 0.0)
                    job.last_step_at.pop(pid, None)
