"""Hand-built snapshots for policy tests, and checks every plan must pass."""

from __future__ import annotations

from schedd.policy.actions import Launch, Plan
from schedd.policy.snapshot import Gpu, Node, PendingJob, PlacedJob, Request, Snapshot


def node(
    node_id: str,
    gpus: int = 8,
    cpus: float = 64,
    memory_mib: int = 512_000,
    gpu_memory_mib: int = 81920,
) -> Node:
    return Node(
        node_id=node_id,
        gpus=tuple(Gpu(f"{node_id}-g{i}", i, "A100", gpu_memory_mib) for i in range(gpus)),
        cpus=cpus,
        memory_mib=memory_mib,
    )


def pending(
    job_id: str,
    gpus: int = 1,
    cpus: float = 1,
    memory_mib: int = 1024,
    gpu_memory_mib: int | None = None,
    at: float = 0.0,
) -> PendingJob:
    return PendingJob(
        job_id,
        "alice",
        "default",
        0,
        "guaranteed",
        Request(gpus, cpus, memory_mib, gpu_memory_mib),
        at,
    )


def placed(
    job_id: str, on: Node, gpu_indices: list[int], cpus: float = 1, memory_mib: int = 1024
) -> PlacedJob:
    return PlacedJob(
        job_id,
        "alice",
        "default",
        on.node_id,
        tuple(on.gpus[i].uuid for i in gpu_indices),
        Request(len(gpu_indices), cpus, memory_mib),
        "running",
    )


def snapshot(
    nodes: list[Node], pending_jobs: list[PendingJob], placed_jobs: list[PlacedJob] | None = None
) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(placed_jobs or ()), tuple(pending_jobs))


def launches(plan: Plan) -> dict[str, Launch]:
    return {a.job_id: a for a in plan.actions if isinstance(a, Launch)}


def assert_valid(snap: Snapshot, plan: Plan) -> None:
    """Invariants of any plan: no GPU used twice, no node over its CPUs or memory,
    each launch on a connected node with exactly the GPUs asked, every pending job
    either launched or given a reason."""
    by_node = {n.node_id: n for n in snap.nodes}
    requests = {j.job_id: j.request for j in snap.pending}
    used = [u for j in snap.placed for u in j.gpu_uuids]
    cpus = {n: sum(j.request.cpus for j in snap.placed if j.node_id == n) for n in by_node}
    mem = {n: sum(j.request.memory_mib for j in snap.placed if j.node_id == n) for n in by_node}
    for launch in launches(plan).values():
        assert launch.node_id in by_node
        node_gpus = {g.uuid for g in by_node[launch.node_id].gpus}
        assert set(launch.gpu_uuids) <= node_gpus
        request = requests[launch.job_id]
        assert len(launch.gpu_uuids) == request.gpus
        used.extend(launch.gpu_uuids)
        cpus[launch.node_id] += request.cpus
        mem[launch.node_id] += request.memory_mib
    assert len(used) == len(set(used)), "a GPU was given twice"
    for n, total in cpus.items():
        assert total <= by_node[n].cpus + 1e-9
    for n, total in mem.items():
        assert total <= by_node[n].memory_mib
    launched = set(launches(plan))
    assert launched.isdisjoint(plan.waiting)
    assert launched | set(plan.waiting) == set(requests)
