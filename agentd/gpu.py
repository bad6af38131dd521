"""GPU backends: NVML through pynvml when a driver is present, simulated otherwise.

The backend is chosen once at start and logged. NVML calls block, so the agent calls
`sample()` from a worker thread.
"""

from __future__ import annotations

import uuid
from types import ModuleType
from typing import Protocol

from shared import logging
from shared.config import AgentConfig
from shared.protocol import GpuInfo, GpuSample

log = logging.get("gpu")


class GpuBackendError(Exception):
    pass


class GpuBackend(Protocol):
    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...


class SimulatedBackend:
    """GPUs described in agentd.toml; utilisation stays 0 until jobs report their own."""

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

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> list[GpuSample]:
        return [GpuSample(uuid=g.uuid, utilization_pct=0, memory_used_mib=0) for g in self._gpus]


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
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._gpus = []
        for i, handle in enumerate(self._handles):
            self._gpus.append(
                GpuInfo(
                    index=i,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
                )
            )

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> list[GpuSample]:
        samples = []
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                used = self.nvml.nvmlDeviceGetMemoryInfo(handle).used // (1024 * 1024)
            except self.nvml.NVMLError as exc:
                # A GPU that fell off the bus keeps its slot, reported as fully busy and
                # logged; the XID handling that takes it out of service builds on this.
                log.error("gpu sample failed", gpu_uuid=gpu.uuid, error=str(exc))
                util, used = 100, gpu.memory_mib
            samples.append(
                GpuSample(uuid=gpu.uuid, utilization_pct=int(util), memory_used_mib=int(used))
            )
        return samples


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
    """True when any GPU moved beyond the thresholds since the last sample sent."""
    for s in new:
        prev = old.get(s.uuid)
        if prev is None:
            return True
        if abs(s.utilization_pct - prev.utilization_pct) >= util_pct:
            return True
        if abs(s.memory_used_mib - prev.memory_used_mib) >= memory_mib:
            return True
    return False
