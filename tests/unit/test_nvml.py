"""The NVML backend and the XID watcher, against the fake pynvml in `fake_pynvml`."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentd import gpu, gpu_events
from shared.protocol import GpuFault, GpuProcess
from tests.unit import fake_pynvml
from tests.unit.fake_pynvml import MIB, FakeGpu, FakeNvml
from tests.unit.recording_log import RecordingLog

GIB = 1024 * MIB


@pytest.fixture
def gpu_log(monkeypatch: pytest.MonkeyPatch) -> RecordingLog:
    rec = RecordingLog()
    monkeypatch.setattr(gpu, "log", rec)
    monkeypatch.setattr(gpu_events, "log", rec)
    return rec


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


# ---- the fake is faithful to the real module -------------------------------------------


def test_fake_uses_the_real_pynvml_names_codes_messages_and_fields() -> None:
    real = pytest.importorskip("pynvml")
    fake = FakeNvml()
    for name in dir(FakeNvml):
        if name.startswith("nvml"):
            assert callable(getattr(real, name, None)), name
    for name, value in vars(fake_pynvml).items():
        if name.startswith(("NVML_ERROR_", "nvmlEventType")) or name == "NVML_SUCCESS":
            assert getattr(real, name) == value, name
    for code, cls in fake_pynvml.NVMLError._valClassMapping.items():
        real_cls = getattr(real, cls.__name__)
        assert issubclass(real_cls, real.NVMLError)
        assert type(real.NVMLError(code)) is real_cls
        assert str(real.NVMLError(code)) == str(fake.NVMLError(code)), cls.__name__
    assert len(fake_pynvml.NVMLError._valClassMapping) == len(fake_pynvml.ERROR_CLASSES) > 10
    for struct in ("c_nvmlMemory_t", "c_nvmlUtilization_t", "c_nvmlEventData_t"):
        real_fields = [f[0] for f in getattr(real, struct)._fields_]
        assert [f.name for f in dataclasses.fields(getattr(fake_pynvml, struct))] == real_fields
    process_fields = [f[0] for f in real.c_nvmlProcessInfo_t._fields_]
    assert [f.name for f in dataclasses.fields(fake_pynvml.c_nvmlProcessInfo_t)] == process_fields


def test_fake_errors_form_the_real_hierarchy() -> None:
    fake = FakeNvml()
    lost = fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(lost, fake.NVMLError_GpuIsLost)
    assert isinstance(lost, fake.NVMLError)
    assert not isinstance(lost, fake.NVMLError_Timeout)
    assert str(fake.NVMLError_LibraryNotFound()) == "NVML Shared Library Not Found"


# ---- inventory and samples --------------------------------------------------------------


def test_inventory_calls_and_values() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", total_mib=81559), FakeGpu(uuid="GPU-b", name="L4")])
    backend = gpu.NvmlBackend(nvml)
    per_gpu = ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName"]
    per_gpu.append("nvmlDeviceGetMemoryInfo")
    assert nvml.names() == ["nvmlInit", "nvmlDeviceGetCount", *per_gpu, *per_gpu]
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in backend.inventory()] == [
        (0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559),
        (1, "GPU-b", "L4", 81559),
    ]
    assert [u for u, _ in backend.devices()] == ["GPU-a", "GPU-b"]


def test_sample_calls_and_values() -> None:
    nvml = FakeNvml(2)
    nvml.gpus[0].util_pct, nvml.gpus[0].used_mib = 37, 4096
    nvml.gpus[1].util_pct, nvml.gpus[1].used_mib = 90, 70000
    backend = gpu.NvmlBackend(nvml)
    nvml.calls.clear()
    samples = backend.sample()
    per_gpu = [
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetComputeRunningProcesses",
    ]
    assert nvml.names() == per_gpu * 2
    assert [
        (s.uuid, s.utilization_pct, s.memory_used_mib, s.memory_total_mib) for s in samples
    ] == [
        ("GPU-00000000-fake", 37, 4096, 81559),
        ("GPU-00000001-fake", 90, 70000, 81559),
    ]
    assert all(s.error is None and s.processes == [] for s in samples)


def test_per_process_memory_with_unknown_as_zero() -> None:
    nvml = FakeNvml(1)
    nvml.gpus[0].processes = {4242: 3 * GIB, 77: None, 9: 512 * MIB + 1}
    [sample] = gpu.NvmlBackend(nvml).sample()
    assert sample.processes == [
        GpuProcess(pid=4242, memory_used_mib=3072),
        GpuProcess(pid=77, memory_used_mib=0),
        GpuProcess(pid=9, memory_used_mib=512),
    ]


@pytest.mark.parametrize(
    "code", [fake_pynvml.NVML_ERROR_NOT_SUPPORTED, fake_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_process_list_not_supported_is_empty_not_an_error(code: int) -> None:
    nvml = FakeNvml(1)
    nvml.gpus[0].util_pct, nvml.gpus[0].used_mib = 12, 100
    nvml.gpus[0].processes_error = code
    [sample] = gpu.NvmlBackend(nvml).sample()
    assert (sample.error, sample.processes) == (None, [])
    assert (sample.utilization_pct, sample.memory_used_mib) == (12, 100)


def test_process_list_failing_otherwise_marks_the_gpu() -> None:
    nvml = FakeNvml(1)
    nvml.gpus[0].processes_error = fake_pynvml.NVML_ERROR_UNKNOWN
    [sample] = gpu.NvmlBackend(nvml).sample()
    assert sample.error == "Unknown Error"
    assert sample.utilization_pct == 100


def test_gpu_lost_mid_run_marks_only_that_gpu(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(3)
    for i, g in enumerate(nvml.gpus):
        g.util_pct, g.used_mib = 10 * (i + 1), 1000 * (i + 1)
    backend = gpu.NvmlBackend(nvml)
    assert all(s.error is None for s in backend.sample())
    nvml.lose(0)
    nvml.gpus[2].util_pct = 55
    nvml.calls.clear()
    lost, ok1, ok2 = backend.sample()
    assert lost.uuid == "GPU-00000000-fake"
    assert lost.error == "GPU is lost"
    assert (lost.utilization_pct, lost.memory_used_mib, lost.memory_total_mib) == (
        100,
        81559,
        81559,
    )
    # The GPUs after the lost one were still sampled, with their own values.
    assert ok1.error is None and ok2.error is None
    assert (ok1.utilization_pct, ok1.memory_used_mib) == (20, 2000)
    assert (ok2.utilization_pct, ok2.memory_used_mib) == (55, 3000)
    assert nvml.names().count("nvmlDeviceGetComputeRunningProcesses") == 2


def test_failures_are_logged_once_per_change_of_state(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(2)
    backend = gpu.NvmlBackend(nvml)
    backend.sample()
    assert gpu_log.events("error") == []
    nvml.lose(1)
    for _ in range(5):
        backend.sample()
    assert gpu_log.events("error") == ["gpu sample failed"]
    _, _, fields = gpu_log.lines[-1]
    assert fields["gpu_uuid"] == "GPU-00000001-fake" and fields["error"] == "GPU is lost"
    nvml.gpus[1].fails_with = fake_pynvml.NVML_ERROR_RESET_REQUIRED  # fails differently
    backend.sample()
    backend.sample()
    assert gpu_log.events("error") == ["gpu sample failed"] * 2
    assert gpu_log.lines[-1][2]["error"] == "GPU requires restart"
    nvml.gpus[1].fails_with = None
    backend.sample()
    backend.sample()
    assert gpu_log.events("info") == ["gpu sample recovered"]
    assert len(gpu_log.lines) == 3


def test_gpu_lost_before_start_is_left_out(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(3)
    nvml.lose(1)
    backend = gpu.NvmlBackend(nvml)
    assert [(g.index, g.uuid) for g in backend.inventory()] == [
        (0, "GPU-00000000-fake"),
        (2, "GPU-00000002-fake"),
    ]
    assert [s.uuid for s in backend.sample()] == ["GPU-00000000-fake", "GPU-00000002-fake"]
    assert gpu_log.events("error") == ["gpu left out of inventory"]
    nvml.lose(0)
    nvml.lose(2)
    with pytest.raises(gpu.GpuBackendError, match="none could be read"):
        gpu.NvmlBackend(nvml)


# ---- the XID watcher ------------------------------------------------------------------


class Faults:
    def __init__(self) -> None:
        self.got: list[GpuFault] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, fault: GpuFault) -> None:
        with self.lock:
            self.got.append(fault)
            self.threads.add(threading.current_thread().name)

    def count(self) -> int:
        with self.lock:
            return len(self.got)


def watcher_on(nvml: FakeNvml, sink: gpu_events.FaultSink, timeout_ms: int = 20) -> Any:
    backend = gpu.NvmlBackend(nvml)
    nvml.calls.clear()
    return gpu_events.for_backend(backend, sink, timeout_ms=timeout_ms)


def test_xid_event_becomes_a_fault_and_stop_frees_the_set(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(2)
    faults = Faults()
    watcher = watcher_on(nvml, faults)
    assert isinstance(watcher, gpu_events.XidWatcher)
    assert watcher.start() == 2
    [event_set] = nvml.sets
    registered = [a for n, a in nvml.calls if n == "nvmlDeviceRegisterEvents"]
    assert [(h.index, types) for h, types, _ in registered] == [
        (0, nvml.nvmlEventTypeXidCriticalError),
        (1, nvml.nvmlEventTypeXidCriticalError),
    ]
    # It keeps waiting through timeouts...
    assert wait_until(lambda: nvml.names().count("nvmlEventSetWait") >= 3)
    assert faults.count() == 0
    # ...and turns an event into a fault for the GPU it came from.
    nvml.inject_xid(1, 79)
    assert wait_until(lambda: faults.count() == 1)
    assert faults.got == [GpuFault(uuid="GPU-00000001-fake", error="XID 79", xid=79)]
    assert faults.threads == {"gpu-xid-events"}
    assert watcher.stop(timeout_s=10)
    assert event_set.freed
    assert nvml.names()[-1] == "nvmlEventSetFree"
    assert "gpu xid" in gpu_log.events("error")


def test_event_with_a_new_handle_is_matched_by_uuid() -> None:
    nvml = FakeNvml(2)
    faults = Faults()
    watcher = watcher_on(nvml, faults)
    watcher.start()
    nvml.inject_xid(0, 48, fresh_handle=True)
    assert wait_until(lambda: faults.count() == 1)
    assert faults.got[0].uuid == "GPU-00000000-fake" and faults.got[0].xid == 48
    assert watcher.stop(timeout_s=10)


def test_stop_ends_a_long_wait_within_one_timeout() -> None:
    nvml = FakeNvml(1)
    watcher = watcher_on(nvml, Faults(), timeout_ms=300)
    watcher.start()
    assert wait_until(lambda: "nvmlEventSetWait" in nvml.names())
    assert watcher.stop(timeout_s=10)
    assert nvml.sets[0].freed
    assert watcher.stop(timeout_s=1)  # a second stop is harmless


def test_gpu_without_event_support_is_skipped(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(2)
    nvml.gpus[0].events_supported = False
    faults = Faults()
    watcher = watcher_on(nvml, faults)
    assert watcher.start() == 1
    assert watcher.watched == ["GPU-00000001-fake"]
    assert "gpu xid events not watched" in gpu_log.events("warning")
    nvml.inject_xid(0, 31)  # never registered: NVML would not deliver it
    nvml.inject_xid(1, 31)
    assert wait_until(lambda: faults.count() == 1)
    assert watcher.stop(timeout_s=10)
    assert [f.uuid for f in faults.got] == ["GPU-00000001-fake"]


def test_no_gpu_with_events_starts_no_thread() -> None:
    nvml = FakeNvml(1)
    nvml.gpus[0].events_supported = False
    watcher = watcher_on(nvml, Faults())
    assert watcher.start() == 0
    assert nvml.sets[0].freed
    assert "nvmlEventSetWait" not in nvml.names()
    assert watcher.stop(timeout_s=1)


def test_a_failing_sink_does_not_end_the_watcher(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(1)
    faults = Faults()
    calls = 0

    def sink(fault: GpuFault) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        faults(fault)

    watcher = watcher_on(nvml, sink)
    watcher.start()
    nvml.inject_xid(0, 13)
    nvml.inject_xid(0, 43)
    assert wait_until(lambda: faults.count() == 1)
    assert faults.got[0].xid == 43
    assert "gpu fault sink failed" in gpu_log.events("exception")
    assert watcher.stop(timeout_s=10)


def test_a_failing_wait_is_logged_once_and_retried(gpu_log: RecordingLog) -> None:
    nvml = FakeNvml(1)
    faults = Faults()
    watcher = watcher_on(nvml, faults, timeout_ms=10)
    watcher.start()
    nvml.sets[0].fails_with = fake_pynvml.NVML_ERROR_UNKNOWN
    assert wait_until(lambda: nvml.names().count("nvmlEventSetWait") >= 6)
    nvml.sets[0].fails_with = None
    nvml.inject_xid(0, 79)
    assert wait_until(lambda: faults.count() == 1)
    assert watcher.stop(timeout_s=10)
    assert gpu_log.events("error").count("gpu xid wait failed") == 1
    assert "gpu xid wait recovered" in gpu_log.events("info")


def test_event_set_unavailable_leaves_the_agent_running(
    gpu_log: RecordingLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml(1)
    watcher = watcher_on(nvml, Faults())

    def refuse() -> None:
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(nvml, "nvmlEventSetCreate", refuse)
    assert watcher.start() == 0
    assert "gpu xid events unavailable" in gpu_log.events("error")
    assert watcher.stop(timeout_s=1)


def test_simulated_backend_has_no_xid_watcher() -> None:
    sim = gpu.SimulatedBackend("n", 2, "Sim", 1000)
    watcher = gpu_events.for_backend(sim, Faults())
    assert isinstance(watcher, gpu_events.NoXidWatcher)
    assert watcher.start() == 0 and watcher.stop()


async def test_on_loop_runs_the_sink_on_the_loop_thread() -> None:
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[tuple[GpuFault, int]] = asyncio.Queue()
    sink = gpu_events.on_loop(loop, lambda f: got.put_nowait((f, threading.get_ident())))
    fault = GpuFault(uuid="GPU-x", error="XID 79", xid=79)
    thread = threading.Thread(target=sink, args=(fault,))
    thread.start()
    thread.join()
    assert await asyncio.wait_for(got.get(), timeout=10) == (fault, threading.get_ident())


def test_on_loop_after_the_loop_closed_does_not_raise(gpu_log: RecordingLog) -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    gpu_events.on_loop(loop, lambda f: None)(GpuFault(uuid="GPU-x", error="XID 79", xid=79))
    assert gpu_log.events("warning") == ["gpu fault after shutdown"]
