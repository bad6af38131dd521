"""Best-fit placement of a job on one node, with the filter counted by reason.

Whole GPUs only. Among the nodes that fit, the one left with the fewest free GPUs wins
(then the fewest free CPUs), so large holes stay open for large jobs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from schedd.policy.snapshot import FreeCapacity, Node, Request


@dataclass(frozen=True, slots=True)
class Placement:
    node_id: str
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoFit:
    """No node fits now; `filtered` counts nodes by the first check they failed."""

    filtered: dict[str, int]
    most_free_gpus: int

    def describe(self, request: Request) -> str:
        if not self.filtered:
            return "no nodes are connected"
        parts = [f"{n} {'node' if n == 1 else 'nodes'} {why}" for why, n in self.filtered.items()]
        most = self.most_free_gpus
        return f"no node can take it now: {', '.join(parts)} (most free GPUs on a node: {most})"


def node_can_ever_fit(node: Node, request: Request) -> str | None:
    """None if an empty `node` could run the job, else why it never could."""
    if len(node.gpus) < request.gpus:
        return f"has {len(node.gpus)} GPUs"
    if request.gpu_memory_mib is not None and request.gpus > 0:
        big_enough = [g for g in node.gpus if g.memory_mib >= request.gpu_memory_mib]
        if len(big_enough) < request.gpus:
            return f"has {len(big_enough)} GPUs with {request.gpu_memory_mib} MiB"
    if node.cpus < request.cpus:
        return f"has {node.cpus:g} CPUs"
    if node.memory_mib < request.memory_mib:
        return f"has {node.memory_mib} MiB of memory"
    return None


def _fit(cap: FreeCapacity, request: Request) -> tuple[str, ...] | str:
    """The GPUs to use on this node, or the reason it does not fit now."""
    gpus = cap.free_gpus
    if request.gpu_memory_mib is not None:
        gpus = [g for g in gpus if g.memory_mib >= request.gpu_memory_mib]
    if len(gpus) < request.gpus:
        return "with too few free GPUs"
    if cap.cpus < request.cpus:
        return "with too few free CPUs"
    if cap.memory_mib < request.memory_mib:
        return "with too little free memory"
    chosen = sorted(gpus, key=lambda g: g.index)[: request.gpus]
    return tuple(g.uuid for g in chosen)


def best_fit(capacity: dict[str, FreeCapacity], request: Request) -> Placement | NoFit:
    best: tuple[tuple[int, float, str], Placement] | None = None
    filtered: Counter[str] = Counter()
    for node_id, cap in capacity.items():
        fit = _fit(cap, request)
        if isinstance(fit, str):
            filtered[fit] += 1
            continue
        score = (len(cap.free_gpus) - request.gpus, cap.cpus - request.cpus, node_id)
        if best is None or score < best[0]:
            best = (score, Placement(node_id, fit))
    if best is not None:
        return best[1]
    most = max((len(c.free_gpus) for c in capacity.values()), default=0)
    return NoFit(dict(filtered), most)
