"""What an agent tells schedd of its node in its hello, from its config and GPU backend."""

from __future__ import annotations

from agentd.gpu import SimulatedBackend
from agentd.main import build_inventory
from shared.config import AgentConfig, CoordinatorConfig


def test_the_inventory_says_whether_the_coordinator_runs() -> None:
    backend = SimulatedBackend("n1", 2, "Sim", 1000)
    on = build_inventory(AgentConfig(cpus=4, memory_mib=8000, labels={"rack": "r1"}), backend)
    assert (on.coordinator, on.cpus, on.memory_mib, on.labels) == (True, 4, 8000, {"rack": "r1"})
    assert (len(on.gpus), on.gpu_backend, on.address) == (2, "simulated", None)
    off = build_inventory(
        AgentConfig(coordinator=CoordinatorConfig(enabled=False), advertise_address="10.0.0.7"),
        backend,
    )
    assert (off.coordinator, off.address) == (False, "10.0.0.7")
