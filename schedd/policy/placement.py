"""Placement helpers shared by the place plugins: fit on a node, spread a gang, say why not.

Whole GPUs only. A job that fits on one node goes on one node; only a job larger than
any node is spread, and only where the shell can run a job across nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from operator import attrgetter

from schedd.policy.immutable import immutable
from schedd.policy.snapshot import Gpu, Node, PendingJob, PlacedJob, Request, Shard
from schedd.policy.view import View


@immutable
class Placement:
    shards: tuple[Shard, ...]


@immutable
class NoFit:
    """No placement now; `filtered` counts nodes by the first check they failed."""

    filtered: dict[str, int]
    most_free_gpus: int

    def describe(self, request: Request) -> str:
        if not self.filtered:
            return "no nodes are connected"
        most = self.most_free_gpus
        return f"no node can take it now: {self._parts()} (most free GPUs on a node: {most})"

    def describe_gang(self, request: Request, free: int) -> str:
        """For a gang across nodes, which starts whole or not at all."""
        if not self.filtered:
            return "no nodes are connected"
        return (
            f"gang incomplete: it starts on all {request.gpus} GPUs at once, and {free} are"
            f" free: {self._parts()} (most free GPUs on a node: {self.most_free_gpus})"
        )

    def _parts(self) -> str:
        return ", ".join(
            f"{n} {'node' if n == 1 else 'nodes'} {why}" for why, n in self.filtered.items()
        )


def node_can_ever_fit(node: Node, request: Request) -> str | None:
    """None if an empty `node` could run the job, else why it never could."""
    if request.node_id is not None and node.node_id != request.node_id:
        return f"is not node {request.node_id}, where the job is to run"
    if len(node.gpus) < request.gpus:
        return f"has {len(node.gpus)} GPUs"
    if (large := big_enough(node, request)) < request.gpus:  # GPUs too small
        return f"has {large} GPUs with {request.gpu_memory_mib} MiB"
    if node.cpus < request.cpus:
        return f"has {node.cpus:g} CPUs"
    if node.memory_mib < request.memory_mib:
        return f"has {node.memory_mib} MiB of memory"
    return None


def big_enough(node: Node, request: Request) -> int:
    """The node's GPUs with the GPU memory the request asks (all where it asks none)."""
    if request.gpu_memory_mib is None:
        return len(node.gpus)
    return sum(g.memory_mib >= request.gpu_memory_mib for g in node.gpus)


def needs_spreading(job: PendingJob | PlacedJob, view: View) -> bool:
    """Whether the job is larger than any node (a gang across nodes, where the shell
    runs those): larger than the connected ones and than any that is briefly away."""
    snapshot = view.snapshot
    return snapshot.multi_node and job.request.gpus > max(
        view.largest_node_gpus(), snapshot.largest_node_gpus
    )


def fit_on(view: View, node_id: str, job: PendingJob) -> tuple[str, ...] | str:
    """The GPUs this job would use on the node, or why it does not fit there now."""
    request = job.request
    if request.node_id is not None and node_id != request.node_id:
        return f"not node {request.node_id}, where the job is to run"
    cap = view.capacity[node_id]
    gpus = usable_for(view, node_id, job)
    if len(gpus) < request.gpus:
        if len(cap.free_gpus) >= request.gpus and view.reserved:
            holder = next(
                (r.job_id for g in cap.free_gpus if (r := view.reserved.get(g.uuid))), None
            )
            if holder is not None:
                return f"with free GPUs reserved for job {holder}"
        return "with too few free GPUs"
    cpus, memory = view.room(node_id, job)
    if not enough_cpus(cpus, request.cpus) or memory < request.memory_mib:
        if cpus != cap.cpus or memory != cap.memory_mib:  # kept for a reservation
            holder = view.reserved_room[node_id][0].job_id
            return f"with CPUs and memory reserved for job {holder}"
        if not enough_cpus(cpus, request.cpus):
            return "with too few free CPUs"
        return "with too little free memory"
    return tuple(g.uuid for g in sorted(gpus, key=unshared_first(view, node_id))[: request.gpus])


def enough_cpus(free: float, asked: float) -> bool:
    """Whether `free` CPUs take `asked`, give or take a sum's rounding error."""
    return free + 1e-9 >= asked


def has_room(cpus: float, memory_mib: int, request: Request) -> bool:
    """Whether `cpus` and `memory_mib` left on a node take the request's."""
    return enough_cpus(cpus, request.cpus) and memory_mib >= request.memory_mib


def unshared_first(view: View, node_id: str) -> Callable[[Gpu], tuple[bool, int] | int]:
    """Sort key: GPUs no opportunistic job shares first (a guaranteed job on a shared GPU
    slows its sharer down), then by index; by index alone where nothing is shared on
    the node (mostly: the cheaper key, the same order)."""
    shared = view.shared.get(node_id)
    if not shared:
        return _BY_INDEX
    return lambda g: (g.uuid in shared, g.index)


_BY_INDEX = attrgetter("index")


def usable_for(view: View, node_id: str, job: PendingJob | PlacedJob) -> list[Gpu]:
    """The node's free GPUs this job may take (to start, or to move to): not reserved
    for another, big enough."""
    gpus = view.usable_gpus(node_id, job)
    if job.request.gpu_memory_mib is not None:
        gpus = [g for g in gpus if g.memory_mib >= job.request.gpu_memory_mib]
    return gpus


def candidates(view: View, gpus: int) -> Iterable[str]:
    """Nodes with at least `gpus` free GPUs, fullest first: best fit against fragmentation."""
    for bucket in view.by_free[gpus:]:
        yield from list(bucket)


def no_fit(view: View, job: PendingJob, filtered: Counter[str]) -> NoFit:
    short = sum(len(b) for b in view.by_free[: job.request.gpus])
    if short:
        filtered["with too few free GPUs"] += short
    most = next((i for i in range(len(view.by_free) - 1, -1, -1) if view.by_free[i]), 0)
    return NoFit(dict(filtered), most)


def gang_room(view: View, node_id: str, job: PendingJob, usable: int | None = None) -> int:
    """How many GPUs of the node the gang may take now: of those it may use (`usable`
    of them, else `usable_for`'s), as many as the node's free CPUs and memory carry."""
    if usable is None:
        usable = len(usable_for(view, node_id, job))
    cpus, memory = view.room(node_id, job)
    return carried(cpus, memory, job.request, usable)


def carried(cpus: float, memory_mib: int, request: Request, gpus: int) -> int:
    """How many of `gpus` GPUs of a gang of `request` a node with `cpus` and
    `memory_mib` carries: a gang's CPUs and memory are split over its nodes in
    proportion to their GPUs (`shard_requests`)."""
    if not gpus or (request.cpus <= 0 and request.memory_mib <= 0):
        return gpus
    total = max(request.gpus, 1)
    most = gpus
    while most and not has_room(
        cpus,
        memory_mib,
        Request(most, request.cpus * most / total, request.memory_mib * most // total),
    ):
        most -= 1
    return most


def spread(view: View, job: PendingJob, node_ids: Iterable[str]) -> Placement | None:
    """A gang over the given nodes, emptiest first so that it spans as few as possible;
    on each no more GPUs than its free CPUs and memory carry (`gang_room`)."""
    need = job.request.gpus
    usable = [(n, usable_for(view, n, job)) for n in node_ids]
    room = {n: gang_room(view, n, job, len(g)) for n, g in usable if g}
    usable = [(n, g) for n, g in usable if room.get(n)]
    if sum(room[n] for n, _ in usable) < need:
        return None
    usable.sort(key=lambda ng: (-room[ng[0]], ng[0]))
    shards = []
    for node_id, gpus in usable:
        most = min(need, room[node_id])
        take = sorted(gpus, key=unshared_first(view, node_id))[:most]
        shards.append(Shard(node_id, tuple(g.uuid for g in take)))
        need -= len(take)
        if need == 0:
            return Placement(tuple(shards))
    return None
