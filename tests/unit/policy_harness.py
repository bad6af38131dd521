"""Hand-built snapshots for policy tests, and checks every plan must pass."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from schedd.policy import build
from schedd.policy.actions import (
    Launch,
    Migrate,
    Plan,
    Preempt,
    Resize,
    Resume,
    SetKind,
    Suspend,
)
from schedd.policy.gittins import ServiceHistory
from schedd.policy.profiles import BUILTIN
from schedd.policy.queues import QueueSpec
from schedd.policy.snapshot import (
    GUARANTEED,
    OPPORTUNISTIC,
    PACKED,
    SUSPENDED,
    Gpu,
    Node,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    holds_gpus,
    shard_requests,
)

# Most jobs are short, a few run for days: the longer a job has run, the less it is
# worth, and the Gittins index puts a newcomer before a runner. 300 jobs: enough for
# every profile to learn from (the default waits for 256).
HEAVY_TAIL = ServiceHistory.of([600.0] * 270 + [500_000.0] * 30)


def node(
    node_id: str,
    gpus: int = 8,
    cpus: float = 64,
    memory_mib: int = 512_000,
    gpu_memory_mib: int = 81920,
    **labels: str,
) -> Node:
    return Node(
        node_id=node_id,
        gpus=tuple(Gpu(f"{node_id}-g{i}", i, "A100", gpu_memory_mib) for i in range(gpus)),
        cpus=cpus,
        memory_mib=memory_mib,
        labels=labels,
    )


def pending(
    job_id: str,
    gpus: int = 1,
    cpus: float = 1,
    memory_mib: int = 1024,
    gpu_memory_mib: int | None = None,
    at: float = 0.0,
    *,
    user: str = "alice",
    queue: str = "default",
    priority: int = 0,
    estimate_s: float | None = None,
    attained_s: float = 0.0,
    kind: str = GUARANTEED,
) -> PendingJob:
    """A job whose spec asked for `kind` (see `converted` for one a policy changed)."""
    return PendingJob(
        job_id,
        user,
        queue,
        priority,
        kind,
        Request(gpus, cpus, memory_mib, gpu_memory_mib),
        at,
        estimate_s=estimate_s,
        attained_s=attained_s,
        spec_kind=kind,
    )


def converted(job: PendingJob) -> PendingJob:
    """The guaranteed job made opportunistic while it waits (AntMan)."""
    return dataclasses.replace(job, kind=OPPORTUNISTIC)


def placed(
    job_id: str,
    on: Node,
    gpu_indices: list[int],
    cpus: float = 1,
    memory_mib: int = 1024,
    gpu_memory_mib: int | None = None,
    *,
    user: str = "alice",
    queue: str = "default",
    started_at: float | None = 0.0,
    estimate_s: float | None = None,
    attained_s: float = 0.0,
    state: str = "running",
    kind: str = GUARANTEED,
    utilization_pct: int | None = None,
) -> PlacedJob:
    return PlacedJob(
        job_id,
        user,
        queue,
        (Shard(on.node_id, tuple(on.gpus[i].uuid for i in gpu_indices)),),
        Request(len(gpu_indices), cpus, memory_mib, gpu_memory_mib),
        state,
        started_at=started_at,
        kind=kind,
        estimate_s=estimate_s,
        attained_s=attained_s,
        utilization_pct=utilization_pct,
    )


def snapshot(
    nodes: list[Node],
    pending_jobs: list[PendingJob],
    placed_jobs: list[PlacedJob] | None = None,
    *,
    queues: tuple[QueueSpec, ...] = (),
    multi_node: bool = False,
    service_history: ServiceHistory | None = None,
) -> Snapshot:
    return Snapshot(
        tuple(nodes),
        tuple(placed_jobs or ()),
        tuple(pending_jobs),
        queues=queues,
        multi_node=multi_node,
        service_history=service_history,
    )


def preempted(plan: Plan) -> set[str]:
    return {a.job_id for a in plan.actions if isinstance(a, Preempt)}


def draw_free_gpus(draw: st.DrawFn, free: list[list[int]]) -> tuple[int, list[int]] | None:
    """A drawn node's position and some of its free GPUs' indices, taken out of `free`
    (each node's free indices); None if that node has none left."""
    k = draw(st.integers(0, len(free) - 1))
    if not free[k]:
        return None
    take = free[k][: draw(st.integers(1, len(free[k])))]
    free[k] = free[k][len(take) :]
    return k, take


def run(profile: str, snap: Snapshot, now: float = 0.0, **settings: Any) -> Plan:
    """Plan with a built-in profile, its settings changed as given; checks the plan."""
    spec = BUILTIN[profile]
    if settings:
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **settings))
    plan = build(profile, spec).plan(snap, now)
    assert_valid(snap, plan)
    return plan


def launches(plan: Plan) -> dict[str, Launch]:
    return {a.job_id: a for a in plan.actions if isinstance(a, Launch)}


def assert_valid(snap: Snapshot, plan: Plan) -> None:
    """Invariants of any plan: no GPU held by two guaranteed jobs (once the plan's
    suspends and resumes are done) nor shared by two opportunistic ones, only running
    jobs paused and only suspended ones resumed, no node over its CPUs or memory,
    each launch on connected nodes with exactly the GPUs asked, each with the GPU memory
    asked (on one node unless the snapshot allows more), each move's and grow's GPUs with
    the memory asked, every pending job either launched or given a reason."""
    by_node = {n.node_id: n for n in snap.nodes}
    sizes = {g.uuid: g.memory_mib for n in snap.nodes for g in n.gpus}

    def big_enough(uuids: tuple[str, ...], request: Request) -> bool:
        least = request.gpu_memory_mib
        return least is None or all(sizes[u] >= least for u in uuids)

    requests = {j.job_id: j.request for j in snap.pending}
    ranges = {j.job_id: j.gpu_range for j in snap.pending}
    kinds = {j.job_id: j.kind for j in (*snap.pending, *snap.placed)}
    kinds.update({a.job_id: a.kind for a in plan.actions if isinstance(a, SetKind)})
    placed_by_id = {j.job_id: j for j in snap.placed}
    paused = {a.job_id for a in plan.actions if isinstance(a, Suspend)}
    resumed = {a.job_id for a in plan.actions if isinstance(a, Resume) and a.beside is None}
    packs = {a.job_id: a.beside for a in plan.actions if isinstance(a, Resume) and a.beside}
    assert all(placed_by_id[j].state in ("running", PACKED) for j in paused), "pause of what?"
    assert all(placed_by_id[j].state in (SUSPENDED, PACKED) for j in resumed), "resume of what?"
    for job_id, beside in packs.items():  # packed: it runs beside the GPUs' holder
        assert placed_by_id[job_id].state == SUSPENDED and beside not in paused
        assert placed_by_id[job_id].gpu_uuids == placed_by_id[beside].gpu_uuids
    used = [
        u
        for j in snap.placed
        for u in j.gpu_uuids
        if (holds_gpus(j) and j.job_id not in paused) or j.job_id in resumed
    ]
    used += [
        u for j in snap.placed for s in j.moving_to for u in s.gpu_uuids if u not in j.gpu_uuids
    ]
    for move in (a for a in plan.actions if isinstance(a, Migrate)):
        mover = placed_by_id[move.job_id]
        assert mover.state == "running" and move.job_id not in paused, "a move of a job not running"
        assert len(move.gpu_uuids) == mover.request.gpus
        assert set(move.gpu_uuids) <= {g.uuid for g in by_node[move.node_id].gpus}
        assert big_enough(move.gpu_uuids, mover.request), "a move to GPUs too small"
        used.extend(move.gpu_uuids)  # held from now, beside its own until it runs there
    for resize in (a for a in plan.actions if isinstance(a, Resize)):
        job = placed_by_id[resize.job_id]
        assert job.state == "running" and job.gpu_range is not None, "a resize of what may not"
        assert job.gpu_range[0] <= resize.gpus == len(resize.gpu_uuids) <= job.gpu_range[1]
        assert set(resize.gpu_uuids) <= {g.uuid for g in by_node[resize.node_id].gpus}
        grown = tuple(u for u in resize.gpu_uuids if u not in job.gpu_uuids)
        assert big_enough(grown, job.request), "a grow into GPUs too small"
        used.extend(u for u in resize.gpu_uuids if u not in job.gpu_uuids)  # a grow's new ones
    shared = [u for j in snap.placed for u in j.gpu_uuids if j.kind == OPPORTUNISTIC]
    cpus = dict.fromkeys(by_node, 0.0)
    mem = dict.fromkeys(by_node, 0)
    holders = [(j.shards, j.request) for j in snap.placed]
    for j in snap.placed:  # a move's target: a grow in place adds GPUs only
        here = {s.node_id for s in j.shards}
        holders += [((s,), j.request) for s in j.moving_to if s.node_id not in here]
    for move in (a for a in plan.actions if isinstance(a, Migrate)):
        target = (Shard(move.node_id, move.gpu_uuids),)
        holders.append((target, placed_by_id[move.job_id].request))
    for launch in launches(plan).values():
        request = requests[launch.job_id]
        least, most = ranges.get(launch.job_id) or (request.gpus, request.gpus)
        assert least <= len(launch.gpu_uuids) <= most
        assert snap.multi_node or len(launch.shards) == 1
        for shard in launch.shards:
            assert shard.node_id in by_node
            assert set(shard.gpu_uuids) <= {g.uuid for g in by_node[shard.node_id].gpus}
            assert big_enough(shard.gpu_uuids, request), "a launch on GPUs too small"
        (shared if kinds[launch.job_id] == OPPORTUNISTIC else used).extend(launch.gpu_uuids)
        holders.append((launch.shards, request))
    for shards, request in holders:
        for shard, part in zip(shards, shard_requests(request, shards), strict=True):
            if shard.node_id not in by_node:
                continue  # a node away: nothing is placed there
            cpus[shard.node_id] += part.cpus
            mem[shard.node_id] += part.memory_mib
    assert len(used) == len(set(used)), "a GPU was given twice"
    assert len(shared) == len(set(shared)), "a GPU was shared twice"
    for n, total in cpus.items():
        assert total <= by_node[n].cpus + 1e-9
    for n, total_mem in mem.items():
        assert total_mem <= by_node[n].memory_mib
    stoppable = {j.job_id for j in snap.placed if j.stoppable}
    assert preempted(plan) <= stoppable, "a victim that is not running"
    launched = set(launches(plan))
    assert launched.isdisjoint(plan.waiting)
    assert launched | set(plan.waiting) == set(requests)
