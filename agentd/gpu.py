"""GPU backends: NVML through pynvml when a driver is present, simulated otherwise.

The backend is chosen once at start and logged. NVML calls block, so the agent calls
`sample()` from a worker thread.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from shared import logging
from shared.config import AgentConfig
from shared.protocol import GpuInfo, GpuProcess, GpuSample

log = logging.get("gpu")

MIB = 1024 * 1024


class GpuBackendError(Exception):
    pass


class GpuUnreadableError(GpuBackendError):
    """NVML answers and lists GPUs, but none of them can be read."""


class GpuBackend(Protocol):
    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...


@dataclass(frozen=True)
class _JobNote:
    gpu_uuids: tuple[str, ...]
    memory_mib: int  # on each of its GPUs
    busy_fraction: float  # 0-1, of each of its GPUs


class SimulatedBackend:
    """GPUs described in agentd.toml; their use is what the jobs on them report.

    `note_job` records a job's use (from the event loop), `sample` sums it per GPU (from
    a worker thread): a lock keeps the two apart. Without notes every GPU reads 0.
    """

    name = "simulated"

    def __init__(self, node_id: str, count: int, model: str, memory_mib: int) -> None:
        self._gpus = [
            GpuInfo(
                index=i,
                # Stable across restarts, distinct across nodes, shaped like NVML's UUIDs.
                uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpusched-sim/{node_id}/{i}")),
                model=model,
                memory_mib=memory_mib,
            )
            for i in range(count)
        ]
        self._known = {g.uuid for g in self._gpus}
        self._notes: dict[int, _JobNote] = {}
        self._lock = threading.Lock()

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def note_job(
        self, gpu_uuids: Iterable[str], pid: int, memory_mib: int, busy_fraction: float
    ) -> None:
        """Job `pid` uses `memory_mib` on each of `gpu_uuids`, busy `busy_fraction` (0-1).

        A later note for the same pid replaces this one. UUIDs this node does not have are
        logged and ignored; a fraction that is not a finite number counts as 0.
        """
        known = []
        for gpu_uuid in dict.fromkeys(gpu_uuids):
            if gpu_uuid in self._known:
                known.append(gpu_uuid)
            else:
                log.warning("simulated gpu unknown", pid=pid, gpu_uuid=gpu_uuid)
        try:
            fraction = float(busy_fraction)
        except (TypeError, ValueError):
            fraction = 0.0
        if not math.isfinite(fraction):
            fraction = 0.0
        note = _JobNote(
            gpu_uuids=tuple(known),
            memory_mib=max(0, int(memory_mib)),
            busy_fraction=min(max(fraction, 0.0), 1.0),
        )
        with self._lock:
            if note.gpu_uuids:
                self._notes[pid] = note
            else:
                self._notes.pop(pid, None)

    def forget_job(self, pid: int) -> None:
        with self._lock:
            self._notes.pop(pid, None)

    def memory_of(self, pid: int) -> int:
        """The memory last noted for `pid` on each of its GPUs (0 if none)."""
        with self._lock:
            note = self._notes.get(pid)
        return note.memory_mib if note is not None else 0

    def sample(self) -> list[GpuSample]:
        with self._lock:
            notes = list(self._notes.items())
        samples = []
        for g in self._gpus:
            on_gpu = [(pid, n) for pid, n in notes if g.uuid in n.gpu_uuids]
            busy = min(sum(n.busy_fraction for _, n in on_gpu), 1.0)
            used = min(sum(n.memory_mib for _, n in on_gpu), g.memory_mib)
            samples.append(
                GpuSample(
                    uuid=g.uuid,
                    utilization_pct=round(busy * 100),
                    memory_used_mib=used,
                    memory_total_mib=g.memory_mib,
                    processes=[
                        GpuProcess(pid=pid, memory_used_mib=min(n.memory_mib, g.memory_mib))
                        for pid, n in on_gpu
                    ],
                )
            )
        return samples


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML unavailable: {exc}") from None
        if count == 0:
            raise GpuBackendError("NVML found no GPUs")
        self._handles: list[Any] = []
        self._gpus: list[GpuInfo] = []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                info = GpuInfo(
                    index=i,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB,
                )
            except nvml.NVMLError as exc:
                # Offered for placement it would fail every job sent to it.
                log.error("gpu left out of inventory", index=i, error=str(exc))
                continue
            self._handles.append(handle)
            self._gpus.append(info)
        if not self._gpus:
            raise GpuUnreadableError(f"NVML found {count} GPUs but none could be read")
        # uuid -> the error of its last sample, for GPUs whose last sample failed
        self._failing: dict[str, str] = {}

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def devices(self) -> list[tuple[str, Any]]:
        """(UUID, NVML handle) of each GPU in the inventory, for the XID watcher."""
        return [(g.uuid, h) for g, h in zip(self._gpus, self._handles, strict=True)]

    def sample(self) -> list[GpuSample]:
        samples = []
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            try:
                sample = self._sample_one(gpu, handle)
            except self.nvml.NVMLError as exc:
                # A GPU that fell off the bus keeps its slot, reported as fully busy; the
                # others are still sampled.
                error = str(exc)
                if self._failing.get(gpu.uuid) != error:
                    log.error("gpu sample failed", gpu_uuid=gpu.uuid, error=error)
                    self._failing[gpu.uuid] = error
                sample = GpuSample(
                    uuid=gpu.uuid,
                    utilization_pct=100,
                    memory_used_mib=gpu.memory_mib,
                    memory_total_mib=gpu.memory_mib,
                    error=error,
                )
            else:
                was = self._failing.pop(gpu.uuid, None)
                if was is not None:
                    log.info("gpu sample recovered", gpu_uuid=gpu.uuid, was=was)
            samples.append(sample)
        return samples

    def _sample_one(self, gpu: GpuInfo, handle: Any) -> GpuSample:
        nvml = self.nvml
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuSample(
            uuid=gpu.uuid,
            utilization_pct=int(util),
            memory_used_mib=int(memory.used) // MIB,
            memory_total_mib=int(memory.total) // MIB,
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> list[GpuProcess]:
        nvml = self.nvml
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            # Some GPUs, virtual GPUs and older drivers cannot list processes: the GPU's
            # own readings still hold.
            return []
        return [
            # usedGpuMemory is None where the driver does not know (e.g. without permission).
            GpuProcess(pid=int(p.pid), memory_used_mib=int(p.usedGpuMemory or 0) // MIB)
            for p in running
        ]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def choose(config: AgentConfig, nvml: ModuleType | None = None) -> GpuBackend:
    """NVML when asked for or when `auto` finds a driver; else the simulated GPUs."""
    if config.gpu_backend != "simulated":
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            backend: GpuBackend = NvmlBackend(nvml)
            log.info("gpu backend chosen", backend="nvml", gpus=len(backend.inventory()))
            return backend
        except GpuUnreadableError:
            # The node has GPUs, all broken: simulating GPUs on it would send jobs there.
            raise
        except (GpuBackendError, ImportError) as exc:
            if config.gpu_backend == "nvml":
                raise GpuBackendError(f"gpu_backend = 'nvml' but {exc}") from None
            log.info("nvml not usable, simulating GPUs", reason=str(exc))
    sim = config.simulated
    backend = SimulatedBackend(config.resolved_node_id(), sim.count, sim.model, sim.memory_mib)
    log.info("gpu backend chosen", backend="simulated", gpus=sim.count, model=sim.model)
    return backend


def changed(
    old: dict[str, GpuSample], new: list[GpuSample], util_pct: int, memory_mib: int
) -> bool:
    """True when any GPU moved beyond the thresholds, failed or recovered, or its set of
    processes changed since the last sample sent."""
    for s in new:
        prev = old.get(s.uuid)
        if prev is None:
            return True
        if abs(s.utilization_pct - prev.utilization_pct) >= util_pct:
            return True
        if abs(s.memory_used_mib - prev.memory_used_mib) >= memory_mib:
            return True
        if s.error != prev.error:
            return True
        if {p.pid for p in s.processes} != {p.pid for p in prev.processes}:
            return True
    return False
