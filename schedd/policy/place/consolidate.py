"""Chronus's consolidation: a job's GPUs form an aligned block of 1, 2, 4 or 8.

The node is chosen by best fit; on it, a job of g GPUs takes them inside one aligned
block of the next size up (GPUs 4-7 for a 4-GPU job, 6-7 for a 2-GPU one), the fullest
such block first: its GPUs then share the closest links (a pair, a switch, a half of
the node's NVLink mesh), and the node's other blocks stay whole for the next jobs.

The rest, a gang larger than any node, is placed by local search (`_gang_nodes`):
from best fit's spread (the emptiest nodes first, as few as can hold it), one node
is swapped for another while that spans fewer racks, or leaves fewer free GPUs behind
on the nodes it touches (so that a whole node stays whole: 12 GPUs take an 8 and a
node with 4 free rather than two 8s), never more nodes.
"""

from __future__ import annotations

from schedd.policy.place import best_fit
from schedd.policy.placement import NoFit, Placement, gang_room, spread, usable_for
from schedd.policy.snapshot import PendingJob, Shard
from schedd.policy.view import View


def rounded(gpus: int) -> int:
    """The block a job is placed in: the next of 1, 2, 4, 8, then multiples of 8."""
    if gpus > 8:
        return -(-gpus // 8) * 8
    block = 1
    while block < gpus:
        block *= 2
    return block


def place(job: PendingJob, view: View) -> Placement | NoFit:
    placed = best_fit.place(job, view)
    if not isinstance(placed, Placement):
        return placed
    if len(placed.shards) > 1:
        return _gang(view, job, placed)
    node_id = placed.shards[0].node_id
    inside = _aligned(view, node_id, job)
    return Placement((Shard(node_id, inside),)) if inside is not None else placed


def _aligned(view: View, node_id: str, job: PendingJob) -> tuple[str, ...] | None:
    need = job.request.gpus
    block = rounded(need)
    if need == 0 or block > 8:
        return None
    usable = usable_for(view, node_id, job)
    blocks: dict[int, list[str]] = {}
    for gpu in sorted(usable, key=lambda g: g.index):
        blocks.setdefault(gpu.index // block, []).append(gpu.uuid)
    fitting = [(len(uuids), at, uuids) for at, uuids in blocks.items() if len(uuids) >= need]
    if not fitting:
        return None
    _, _, uuids = min(fitting)
    return tuple(uuids[:need])


MAX_SWAPS = 64  # a bound on the search, far above what a gang of a few nodes needs


def _gang(view: View, job: PendingJob, start: Placement) -> Placement:
    usable = {n: room for n in view.capacity if (room := gang_room(view, n, job))}
    chosen = _gang_nodes(view, usable, [s.node_id for s in start.shards], job.request.gpus)
    placed = spread(view, job, chosen)  # the chosen nodes hold the gang: never None
    assert placed is not None
    return placed


def _gang_nodes(view: View, usable: dict[str, int], start: list[str], need: int) -> list[str]:
    """Nodes for a gang of `need` GPUs (`usable`: free GPUs it may take, by node):
    `start` improved by swapping one node at a time for the best swap found, while one
    lowers (racks spanned, free GPUs left behind on the chosen nodes); ties by node id,
    so the search is the same every time."""

    def cost(nodes: list[str]) -> tuple[int, int]:
        racks = {view.capacity[n].node.labels.get("rack", n) for n in nodes}
        return len(racks), sum(usable[n] for n in nodes) - need

    others = sorted(usable)
    chosen = sorted(start)
    best = cost(chosen)
    for _ in range(MAX_SWAPS):
        swap: tuple[tuple[int, int], list[str]] | None = None
        have = sum(usable[n] for n in chosen)
        for i, out in enumerate(chosen):
            for other in others:
                if other in chosen or have - usable[out] + usable[other] < need:
                    continue
                trial = sorted([*chosen[:i], other, *chosen[i + 1 :]])
                c = cost(trial)
                if c < best and (swap is None or (c, trial) < swap):
                    swap = (c, trial)
        if swap is None:
            break
        best, chosen = swap
    return chosen
