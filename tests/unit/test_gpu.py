"""GPU backends: NVML against a fake pynvml module, the simulated one, the choice."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest

from agentd import gpu
from shared.config import AgentConfig
from shared.protocol import GpuSample


class NVMLError(Exception):
    pass


@dataclass
class Mem:
    total: int
    used: int


@dataclass
class Util:
    gpu: int


def fake_nvml(count: int = 2, init_fails: bool = False, lost: set[int] | None = None):  # type: ignore[no-untyped-def]
    calls: list[str] = []
    lost = lost or set()

    def rec(name, fn):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            calls.append(name)
            return fn(*args)

        return call

    def init() -> None:
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def util(handle: int) -> Util:
        if handle in lost:
            raise NVMLError("GPU is lost")
        return Util(gpu=30 + handle)

    mod = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=rec("nvmlInit", init),
        nvmlDeviceGetCount=rec("nvmlDeviceGetCount", lambda: count),
        nvmlDeviceGetHandleByIndex=rec("nvmlDeviceGetHandleByIndex", lambda i: i),
        nvmlDeviceGetUUID=rec("nvmlDeviceGetUUID", lambda h: f"GPU-{h:04d}".encode()),
        nvmlDeviceGetName=rec("nvmlDeviceGetName", lambda h: "NVIDIA H100"),
        nvmlDeviceGetMemoryInfo=rec(
            "nvmlDeviceGetMemoryInfo", lambda h: Mem(total=80 << 30, used=(h + 1) << 30)
        ),
        nvmlDeviceGetUtilizationRates=rec("nvmlDeviceGetUtilizationRates", util),
    )
    return mod, calls


def test_nvml_inventory_and_samples() -> None:
    mod, calls = fake_nvml(2)
    backend = gpu.NvmlBackend(mod)  # type: ignore[arg-type]
    inv = backend.inventory()
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in inv] == [
        (0, "GPU-0000", "NVIDIA H100", 81920),
        (1, "GPU-0001", "NVIDIA H100", 81920),
    ]
    assert calls[:2] == ["nvmlInit", "nvmlDeviceGetCount"]
    samples = backend.sample()
    assert [(s.utilization_pct, s.memory_used_mib) for s in samples] == [(30, 1024), (31, 2048)]


def test_lost_gpu_is_reported_busy_not_raised() -> None:
    mod, _ = fake_nvml(2, lost={1})
    samples = gpu.NvmlBackend(mod).sample()  # type: ignore[arg-type]
    assert samples[0].utilization_pct == 30
    assert (samples[1].utilization_pct, samples[1].memory_used_mib) == (100, 81920)


def test_auto_falls_back_to_simulated_without_a_driver() -> None:
    mod, _ = fake_nvml(init_fails=True)
    backend = gpu.choose(AgentConfig(node_id="n1", gpu_backend="auto"), nvml=mod)  # type: ignore[arg-type]
    assert backend.name == "simulated"
    assert len(backend.inventory()) == 4


def test_auto_picks_nvml_when_a_driver_answers() -> None:
    mod, _ = fake_nvml(3)
    backend = gpu.choose(AgentConfig(node_id="n1"), nvml=mod)  # type: ignore[arg-type]
    assert backend.name == "nvml" and len(backend.inventory()) == 3


def test_nvml_required_but_missing_is_an_error() -> None:
    mod, _ = fake_nvml(init_fails=True)
    with pytest.raises(gpu.GpuBackendError, match="Shared Library Not Found"):
        gpu.choose(AgentConfig(gpu_backend="nvml"), nvml=mod)  # type: ignore[arg-type]
    empty, _ = fake_nvml(0)
    with pytest.raises(gpu.GpuBackendError, match="no GPUs"):
        gpu.choose(AgentConfig(gpu_backend="nvml"), nvml=empty)  # type: ignore[arg-type]


def test_simulated_uuids_are_stable_and_distinct_per_node() -> None:
    a1 = gpu.SimulatedBackend("a", 2, "Sim", 1000).inventory()
    a2 = gpu.SimulatedBackend("a", 2, "Sim", 1000).inventory()
    b = gpu.SimulatedBackend("b", 2, "Sim", 1000).inventory()
    assert [g.uuid for g in a1] == [g.uuid for g in a2]
    assert not {g.uuid for g in a1} & {g.uuid for g in b}
    assert all(g.uuid.startswith("GPU-") for g in a1)


def test_changes_below_thresholds_are_not_pushed() -> None:
    old = {"g": GpuSample(uuid="g", utilization_pct=50, memory_used_mib=1000)}
    same = [GpuSample(uuid="g", utilization_pct=55, memory_used_mib=1200)]
    moved = [GpuSample(uuid="g", utilization_pct=61, memory_used_mib=1000)]
    grew = [GpuSample(uuid="g", utilization_pct=50, memory_used_mib=1600)]
    assert not gpu.changed(old, same, 10, 512)
    assert gpu.changed(old, moved, 10, 512)
    assert gpu.changed(old, grew, 10, 512)
    assert gpu.changed({}, same, 10, 512)
