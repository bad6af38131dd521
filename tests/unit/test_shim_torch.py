"""The shim's PyTorch path against a stand-in for torch.cuda (no GPU here).

It checks what the shim asks of PyTorch and what it reports from it: CUDA-event timing,
memory figures, the cap through the allocator's fraction, spill under `save_on_cpu`,
and freeing the cache on suspend. Real GPUs are left to bench scripts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from shared import shim
from shared import shim_protocol as sp

MIB = 1024 * 1024


class FakeEvent:
    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000  # milliseconds, as CUDA events say


class FakeCuda:
    def __init__(self) -> None:
        self.total = 10_000 * MIB
        self.allocated, self.reserved, self.peak = 1000 * MIB, 3000 * MIB, 3000 * MIB
        self.fraction: float | None = None
        self.Event = FakeEvent

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(total_memory=self.total)

    def memory_stats_as_nested_dict(self, device: int) -> dict[str, Any]:
        """Shaped as PyTorch's: per figure, per pool, current / peak / allocated / freed."""
        return {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": self.allocated}},
            "reserved_bytes": {"all": {"current": self.reserved, "peak": self.peak}},
            "num_ooms": 0,
        }

    def memory_reserved(self, device: int) -> int:
        return self.reserved

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.fraction = fraction

    def empty_cache(self) -> None:
        self.reserved = self.allocated  # the cached blocks go back


class FakeSaveOnCpu:
    active = 0

    def __init__(self, pin_memory: bool) -> None:
        assert pin_memory

    def __enter__(self) -> None:
        FakeSaveOnCpu.active += 1

    def __exit__(self, *exc: object) -> None:
        FakeSaveOnCpu.active -= 1


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    fake = FakeCuda()
    torch = SimpleNamespace(
        cuda=fake, autograd=SimpleNamespace(graph=SimpleNamespace(save_on_cpu=FakeSaveOnCpu))
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    FakeSaveOnCpu.active = 0
    yield fake


class Sent(list[dict[str, Any]]):
    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self if m["type"] == kind]


def watched_shim() -> tuple[shim.Shim, Sent]:
    s, sent = shim.Shim(), Sent()
    s._post = sent.append  # type: ignore[method-assign,assignment]  # what goes to the agent
    return s, sent


def control(s: shim.Shim, msg: sp.ShimMsg) -> None:
    s._on_line(sp.encode(msg))


def test_steps_report_gpu_time_and_memory(cuda: FakeCuda) -> None:
    cuda.reserved = 2500 * MIB  # below its peak: each figure is told apart
    s, sent = watched_shim()
    with s.step():
        time.sleep(0.01)
    (step,) = sent.of("step")
    assert step["gpu_s"] is not None and step["gpu_s"] > 0
    assert (step["mem_allocated_mib"], step["mem_reserved_mib"], step["mem_peak_mib"]) == (
        1000,
        2500,
        3000,
    )
    assert (step["cap_met"], step["spilling"]) == (None, False)


def test_a_cap_below_need_sets_the_fraction_and_spills(cuda: FakeCuda) -> None:
    s, sent = watched_shim()
    with s.step():
        pass
    control(s, sp.Limits(memory_cap_mib=2000))
    with s.step():  # the cap is applied at the end of this step
        assert FakeSaveOnCpu.active == 0
    assert cuda.fraction == pytest.approx(0.2)
    (cap,) = sent.of("cap_applied")
    assert cap == {
        "type": "cap_applied",
        "memory_cap_mib": 2000,
        "met": True,  # the cache went back: 1000 MiB reserved
        "mem_reserved_mib": 1000,
        "spilling": True,  # the job's peak, 3000 MiB, is above the cap
    }
    with s.step():
        assert FakeSaveOnCpu.active == 1  # activations kept in host memory
    assert FakeSaveOnCpu.active == 0
    assert (sent.of("step")[-1]["cap_met"], sent.of("step")[-1]["spilling"]) == (True, True)

    control(s, sp.Limits())
    with s.step():
        pass
    assert cuda.fraction == 1.0
    assert sent.of("cap_applied")[-1]["spilling"] is False
    with s.step():
        assert FakeSaveOnCpu.active == 0


def test_a_cap_above_need_does_not_spill(cuda: FakeCuda) -> None:
    s, sent = watched_shim()
    control(s, sp.Limits(memory_cap_mib=5000))
    with s.step():
        pass
    assert sent.of("cap_applied")[-1]["spilling"] is False
    assert sent.of("step")[-1]["cap_met"] is True


def test_a_cap_set_before_cuda_was_up_reaches_the_allocator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    s, sent = watched_shim()
    control(s, sp.Limits(memory_cap_mib=2000))
    with s.step():
        pass
    assert sent.of("cap_applied")[-1]["met"] is None  # nothing to cap yet
    fake = FakeCuda()
    torch = SimpleNamespace(
        cuda=fake, autograd=SimpleNamespace(graph=SimpleNamespace(save_on_cpu=FakeSaveOnCpu))
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    with s.step():
        pass
    assert fake.fraction == pytest.approx(0.2)
    assert sent.of("cap_applied")[-1]["met"] is True


def test_suspend_can_give_back_cached_memory(cuda: FakeCuda) -> None:
    s, sent = watched_shim()
    with s.step():
        pass
    control(s, sp.Suspend(free_memory=True))

    def resume_once_suspended() -> None:
        while not sent.of("suspended"):
            time.sleep(0.01)
        control(s, sp.Resume())

    resumer = threading.Thread(target=resume_once_suspended)
    resumer.start()
    with s.step():
        pass
    resumer.join()
    (suspended,) = sent.of("suspended")
    assert suspended["freed_mib"] == 2000  # 3000 reserved, 1000 of them in use
    assert len(sent.of("resumed")) == 1
