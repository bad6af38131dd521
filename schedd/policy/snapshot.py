"""The immutable view of the cluster that a policy plans on.

Built by the live scheduler from PostgreSQL and the agent hub, and by the simulator
from its virtual cluster. Free capacity is derived here from the placements of the
jobs that hold resources, never stored beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    utilization_pct: int = 0
    memory_used_mib: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    gpus: tuple[Gpu, ...]
    cpus: float
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks for on one node."""

    gpus: int
    cpus: float
    memory_mib: int
    gpu_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    user: str
    queue: str
    priority: int
    kind: str
    request: Request
    submitted_at: float  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job that holds resources: assigned, running or being cancelled."""

    job_id: str
    user: str
    queue: str
    node_id: str
    gpu_uuids: tuple[str, ...]
    request: Request
    state: str
    started_at: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]  # connected nodes only: nothing is placed on a node that is away
    placed: tuple[PlacedJob, ...]
    pending: tuple[PendingJob, ...]  # in submission order


@dataclass(slots=True)
class FreeCapacity:
    """What is left on one node, as a policy works through its pending jobs."""

    node: Node
    free_gpus: list[Gpu]
    cpus: float
    memory_mib: int

    def take(self, gpu_uuids: tuple[str, ...], request: Request) -> None:
        taken = set(gpu_uuids)
        self.free_gpus = [g for g in self.free_gpus if g.uuid not in taken]
        self.cpus -= request.cpus
        self.memory_mib -= request.memory_mib


def free_capacity(snapshot: Snapshot) -> dict[str, FreeCapacity]:
    """Each connected node's capacity less what placed jobs hold on it."""
    used_gpus: set[str] = set()
    used_cpus: dict[str, float] = {}
    used_mem: dict[str, int] = {}
    for job in snapshot.placed:
        used_gpus.update(job.gpu_uuids)
        used_cpus[job.node_id] = used_cpus.get(job.node_id, 0.0) + job.request.cpus
        used_mem[job.node_id] = used_mem.get(job.node_id, 0) + job.request.memory_mib
    return {
        node.node_id: FreeCapacity(
            node=node,
            free_gpus=[g for g in node.gpus if g.uuid not in used_gpus],
            cpus=node.cpus - used_cpus.get(node.node_id, 0.0),
            memory_mib=node.memory_mib - used_mem.get(node.node_id, 0),
        )
        for node in snapshot.nodes
    }
