"""The backend choice, the simulated backend and `changed`; NVML itself is in test_nvml."""

from __future__ import annotations

import math

import pytest

from agentd import gpu
from shared.config import AgentConfig
from shared.protocol import GpuProcess, GpuSample
from tests.unit.fake_pynvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
    Handle,
)
from tests.unit.recording_log import RecordingLog


@pytest.fixture
def gpu_log(monkeypatch: pytest.MonkeyPatch) -> RecordingLog:
    rec = RecordingLog()
    monkeypatch.setattr(gpu, "log", rec)
    return rec


# ---- choosing a backend ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_nvml_required_but_missing_is_an_error(code: int, words: str) -> None:
    nvml = FakeNvml(2, init_error=code)
    with pytest.raises(gpu.GpuBackendError) as caught:
        gpu.choose(AgentConfig(node_id="n1", gpu_backend="nvml"), nvml=nvml)
    assert str(caught.value) == f"gpu_backend = 'nvml' but NVML unavailable: {words}"
    assert type(caught.value) is gpu.GpuBackendError


def test_nvml_required_without_gpus_is_an_error() -> None:
    with pytest.raises(gpu.GpuBackendError) as caught:
        gpu.choose(AgentConfig(node_id="n1", gpu_backend="nvml"), nvml=FakeNvml(0))
    assert str(caught.value) == "gpu_backend = 'nvml' but NVML found no GPUs"


@pytest.mark.parametrize("code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_auto_falls_back_to_simulated_without_a_driver(code: int) -> None:
    nvml = FakeNvml(2, init_error=code)
    backend = gpu.choose(AgentConfig(node_id="n1", gpu_backend="auto"), nvml=nvml)
    assert backend.name == "simulated"
    assert len(backend.inventory()) == 4  # the default simulated GPUs
    assert nvml.names() == ["nvmlInit"]


def test_auto_picks_nvml_when_a_driver_answers() -> None:
    backend = gpu.choose(AgentConfig(node_id="n1"), nvml=FakeNvml(3))
    assert backend.name == "nvml" and len(backend.inventory()) == 3


def test_auto_with_every_gpu_unreadable_does_not_simulate() -> None:
    # GPUs are there but broken: simulated GPUs on this node would attract jobs.
    nvml = FakeNvml(2)
    nvml.lose(0)
    nvml.lose(1)
    with pytest.raises(gpu.GpuBackendError, match="NVML found 2 GPUs but none could be read"):
        gpu.choose(AgentConfig(node_id="n1", gpu_backend="auto"), nvml=nvml)


def test_simulated_never_touches_nvml() -> None:
    nvml = FakeNvml(2)
    backend = gpu.choose(AgentConfig(node_id="n1", gpu_backend="simulated"), nvml=nvml)
    assert backend.name == "simulated"
    assert nvml.calls == []


def test_uuids_and_names_as_bytes_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Older pynvml releases return bytes.
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", name="L4")])
    monkeypatch.setattr(nvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h.index}".encode())
    monkeypatch.setattr(nvml, "nvmlDeviceGetName", lambda h: b"NVIDIA L4")
    backend = gpu.NvmlBackend(nvml)
    [info] = backend.inventory()
    assert (info.uuid, info.model) == ("GPU-0", "NVIDIA L4")
    [(uuid, handle)] = backend.devices()
    assert uuid == "GPU-0" and isinstance(handle, Handle)


# ---- the simulated backend -------------------------------------------------------------


def sim(count: int = 2, memory_mib: int = 1000) -> tuple[gpu.SimulatedBackend, list[str]]:
    backend = gpu.SimulatedBackend("n1", count, "Sim", memory_mib)
    return backend, [g.uuid for g in backend.inventory()]


def use(backend: gpu.SimulatedBackend) -> list[tuple[int, int, list[int]]]:
    """(util %, memory MiB, pids) per GPU."""
    return [
        (s.utilization_pct, s.memory_used_mib, [p.pid for p in s.processes])
        for s in backend.sample()
    ]


def test_simulated_uuids_are_stable_and_distinct_per_node() -> None:
    a1 = gpu.SimulatedBackend("a", 2, "Sim", 1000).inventory()
    a2 = gpu.SimulatedBackend("a", 2, "Sim", 1000).inventory()
    b = gpu.SimulatedBackend("b", 2, "Sim", 1000).inventory()
    assert [g.uuid for g in a1] == [g.uuid for g in a2]
    assert not {g.uuid for g in a1} & {g.uuid for g in b}
    assert all(g.uuid.startswith("GPU-") for g in a1)


def test_simulated_reads_zero_without_notes() -> None:
    backend, uuids = sim()
    assert backend.sample() == [
        GpuSample(uuid=u, utilization_pct=0, memory_used_mib=0, memory_total_mib=1000)
        for u in uuids
    ]


def test_simulated_sums_the_jobs_on_each_gpu() -> None:
    backend, (g0, g1) = sim()
    backend.note_job([g0, g1], pid=10, memory_mib=300, busy_fraction=0.25)
    backend.note_job([g1], pid=20, memory_mib=200, busy_fraction=0.5)
    assert use(backend) == [(25, 300, [10]), (75, 500, [10, 20])]
    [_, second] = backend.sample()
    assert second.processes == [
        GpuProcess(pid=10, memory_used_mib=300),
        GpuProcess(pid=20, memory_used_mib=200),
    ]
    assert second.error is None and second.memory_total_mib == 1000


def test_simulated_caps_at_full_use_and_the_gpus_size() -> None:
    backend, (g0, _) = sim()
    backend.note_job([g0], pid=1, memory_mib=700, busy_fraction=0.8)
    backend.note_job([g0], pid=2, memory_mib=700, busy_fraction=0.8)
    assert use(backend)[0] == (100, 1000, [1, 2])
    backend.note_job([g0], pid=3, memory_mib=5000, busy_fraction=7.0)
    [first, _] = backend.sample()
    assert (first.utilization_pct, first.memory_used_mib) == (100, 1000)
    assert first.processes[-1] == GpuProcess(pid=3, memory_used_mib=1000)


def test_simulated_note_for_the_same_pid_replaces_the_old_one() -> None:
    backend, (g0, g1) = sim()
    backend.note_job([g0], pid=10, memory_mib=300, busy_fraction=0.5)
    backend.note_job([g1], pid=10, memory_mib=100, busy_fraction=0.2)
    assert use(backend) == [(0, 0, []), (20, 100, [10])]


def test_simulated_forget_job() -> None:
    backend, (g0, _) = sim()
    backend.note_job([g0], pid=10, memory_mib=300, busy_fraction=0.5)
    backend.note_job([g0], pid=11, memory_mib=100, busy_fraction=0.1)
    backend.forget_job(10)
    assert use(backend) == [(10, 100, [11]), (0, 0, [])]
    backend.forget_job(11)
    backend.forget_job(999)  # never noted: nothing to do
    assert use(backend) == [(0, 0, []), (0, 0, [])]


def test_simulated_unknown_uuids_are_logged_and_ignored(gpu_log: RecordingLog) -> None:
    backend, (g0, _) = sim()
    backend.note_job(["GPU-elsewhere", g0], pid=10, memory_mib=300, busy_fraction=0.5)
    assert use(backend) == [(50, 300, [10]), (0, 0, [])]
    assert [(lv, e, f["gpu_uuid"]) for lv, e, f in gpu_log.lines] == [
        ("warning", "simulated gpu unknown", "GPU-elsewhere")
    ]
    # Only unknown GPUs: the job's earlier note goes, and nothing raises.
    backend.note_job(["GPU-elsewhere"], pid=10, memory_mib=300, busy_fraction=0.5)
    assert use(backend) == [(0, 0, []), (0, 0, [])]


@pytest.mark.parametrize("fraction", [math.nan, math.inf, -math.inf])
def test_simulated_non_finite_fraction_counts_as_zero(fraction: float) -> None:
    backend, (g0, _) = sim()
    backend.note_job([g0], pid=10, memory_mib=300, busy_fraction=fraction)
    backend.note_job([g0], pid=11, memory_mib=100, busy_fraction=0.3)
    assert use(backend)[0] == (30, 400, [10, 11])


# ---- what is worth sending --------------------------------------------------------------


def test_changes_below_thresholds_are_not_pushed() -> None:
    old = {"g": GpuSample(uuid="g", utilization_pct=50, memory_used_mib=1000)}
    same = [GpuSample(uuid="g", utilization_pct=55, memory_used_mib=1200)]
    moved = [GpuSample(uuid="g", utilization_pct=61, memory_used_mib=1000)]
    grew = [GpuSample(uuid="g", utilization_pct=50, memory_used_mib=1600)]
    assert not gpu.changed(old, same, 10, 512)
    assert gpu.changed(old, moved, 10, 512)
    assert gpu.changed(old, grew, 10, 512)
    assert gpu.changed({}, same, 10, 512)


def test_a_gpu_failing_or_recovering_is_pushed() -> None:
    ok = GpuSample(uuid="g", utilization_pct=100, memory_used_mib=1000)
    lost = GpuSample(uuid="g", utilization_pct=100, memory_used_mib=1000, error="GPU is lost")
    reset = GpuSample(
        uuid="g", utilization_pct=100, memory_used_mib=1000, error="GPU requires restart"
    )
    assert gpu.changed({"g": ok}, [lost], 10, 512)
    assert gpu.changed({"g": lost}, [reset], 10, 512)
    assert gpu.changed({"g": lost}, [ok], 10, 512)
    assert not gpu.changed({"g": lost}, [lost], 10, 512)


def test_a_change_in_the_set_of_processes_is_pushed() -> None:
    def with_pids(*pids: int, memory: int = 100) -> GpuSample:
        procs = [GpuProcess(pid=p, memory_used_mib=memory) for p in pids]
        return GpuSample(uuid="g", utilization_pct=50, memory_used_mib=1000, processes=procs)

    old = {"g": with_pids(1, 2)}
    assert gpu.changed(old, [with_pids(1, 2, 3)], 10, 512)  # a process started
    assert gpu.changed(old, [with_pids(1)], 10, 512)  # one ended
    assert gpu.changed(old, [with_pids(1, 3)], 10, 512)  # same count, other pids
    # The same pids in another order, or using a little more memory, are not news.
    assert not gpu.changed(old, [with_pids(2, 1)], 10, 512)
    assert not gpu.changed(old, [with_pids(1, 2, memory=300)], 10, 512)
