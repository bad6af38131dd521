"""The GPU benchmarks' NVML sampler (bench/gpu/_common.py), against the fake pynvml.

The benchmarks themselves need a GPU; the sampler is the part of their harness that
only runs where NVML answers, so it is checked here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.unit.fake_pynvml import MIB, FakeGpu, FakeNvml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import _common


def test_sampler_records_processes_and_stops() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-bench-0", util_pct=37, processes={4242: 300 * MIB})])
    nvml.nvmlInit()
    gpu = _common.Gpu(
        0, "fake", "GPU-bench-0", 81559, "1", "13.0", nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    )
    sampler = _common.Sampler(gpu, interval_s=0.01)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert not sampler.is_alive()
    assert len(sampler.samples) >= 3
    assert sampler.samples[0].used_mib == {4242: 300}
    assert sampler.samples[0].utilization_pct == 37
    count = len(sampler.samples)
    time.sleep(0.05)
    assert len(sampler.samples) == count  # stopped for good
