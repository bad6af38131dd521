"""Simulated GPUs read what the jobs' shims report: memory, and busy time over wall time."""

from __future__ import annotations

from agentd.gpu import SimulatedBackend
from agentd.simulated_usage import SimulatedUsage
from shared.shim_protocol import Hello, Step, Suspended


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hello(pid: int) -> Hello:
    return Hello(
        protocol=1, pid=pid, job_kind="guaranteed", step=0, memory_cap_mib=None, share=100,
        suspended=False,
    )  # fmt: skip


def step(n: int, wall_s: float, gpu_s: float | None = None, mem: int | None = 2048) -> Step:
    return Step(
        step=n, wall_s=wall_s, gpu_s=gpu_s, mem_allocated_mib=mem, mem_reserved_mib=mem,
        mem_peak_mib=mem, cap_met=None, spilling=False,
    )  # fmt: skip


def setup() -> tuple[SimulatedBackend, SimulatedUsage, Clock, list[str]]:
    backend = SimulatedBackend("n1", 2, "A100", 81920)
    clock = Clock()
    uuids = [g.uuid for g in backend.inventory()]
    return backend, SimulatedUsage(backend, clock), clock, uuids


def by_uuid(backend: SimulatedBackend) -> dict[str, tuple[int, int]]:
    return {s.uuid: (s.utilization_pct, s.memory_used_mib) for s in backend.sample()}


def test_a_job_throttled_to_a_quarter_keeps_its_gpu_a_quarter_busy() -> None:
    backend, usage, clock, uuids = setup()
    usage.job_started("j.1", "guaranteed", [uuids[0]])
    usage.on_shim_event("j.1", hello(42))
    for n in range(1, 5):
        usage.on_shim_event("j.1", step(n, wall_s=0.1, gpu_s=0.05))
        clock.now += 0.2  # the step, then the throttle's sleep
    assert by_uuid(backend) == {uuids[0]: (25, 2048), uuids[1]: (0, 0)}
    samples = {s.uuid: s for s in backend.sample()}
    assert [p.pid for p in samples[uuids[0]].processes] == [42]


def test_suspended_without_freeing_keeps_memory_and_stops_compute() -> None:
    backend, usage, clock, uuids = setup()
    usage.job_started("j.1", "guaranteed", uuids)
    usage.on_shim_event("j.1", hello(7))
    usage.on_shim_event("j.1", step(1, wall_s=0.1))
    clock.now += 0.1
    usage.on_shim_event("j.1", step(2, wall_s=0.1))
    assert by_uuid(backend)[uuids[1]] == (100, 2048)
    usage.on_shim_event("j.1", Suspended(step=2, freed_mib=None))
    assert by_uuid(backend)[uuids[1]] == (0, 2048)
    # Freeing gives back the cache only: what tensors hold stays.
    usage.on_shim_event("j.1", Suspended(step=2, freed_mib=1536))
    assert by_uuid(backend)[uuids[1]] == (0, 512)
    usage.on_shim_event("j.1", Suspended(step=2, freed_mib=2048))
    assert by_uuid(backend)[uuids[1]] == (0, 0)


def test_an_ended_job_leaves_its_gpus_idle_and_unknown_jobs_are_ignored() -> None:
    backend, usage, clock, uuids = setup()
    usage.on_shim_event("other.1", hello(9))  # never started here: ignored
    usage.job_started("j.1", "guaranteed", [uuids[0]])
    usage.on_shim_event("j.1", hello(3))
    usage.on_shim_event("j.1", step(1, 0.1))
    clock.now += 0.1
    usage.on_shim_event("j.1", step(2, 0.1))
    assert by_uuid(backend)[uuids[0]] == (100, 2048)
    usage.job_ended("j.1")
    assert by_uuid(backend) == {uuids[0]: (0, 0), uuids[1]: (0, 0)}
