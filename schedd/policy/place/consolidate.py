"""Chronus's consolidation: a job's GPUs form an aligned block of 1, 2, 4 or 8.

The node is chosen by best fit; on it, a job of g GPUs takes them inside one aligned
block of the next size up (GPUs 4-7 for a 4-GPU job, 6-7 for a 2-GPU one), the fullest
such block first: its GPUs then share the closest links (a pair, a switch, a half of
the node's NVLink mesh), and the node's other blocks stay whole for the next jobs.
A job of more than 8 GPUs spans whole nodes as best fit spreads it.
"""

from __future__ import annotations

from schedd.policy.place import best_fit
from schedd.policy.placement import NoFit, Placement, usable_for
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
    if not isinstance(placed, Placement) or len(placed.shards) != 1:
        return placed
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
