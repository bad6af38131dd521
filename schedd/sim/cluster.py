"""The simulated nodes: identical, GPUs only (jobs from traces ask for nothing else)."""

from __future__ import annotations

from schedd.policy.snapshot import Gpu, Node
from schedd.sim.shape import ClusterShape

GPU_MODEL = "sim-gpu"
GPU_MEMORY_MIB = 81920
# Jobs from traces ask for GPUs only; nodes have CPUs and memory to spare.
NODE_CPUS = 1_000_000.0
NODE_MEMORY_MIB = 1 << 40


def build_nodes(shape: ClusterShape) -> tuple[Node, ...]:
    width = len(str(shape.nodes))
    nodes = []
    for n in range(shape.nodes):
        node_id = f"n{n:0{width}d}"
        gpus = tuple(
            Gpu(f"{node_id}-g{i}", i, GPU_MODEL, GPU_MEMORY_MIB) for i in range(shape.gpus_per_node)
        )
        labels = {}
        if shape.nodes_per_rack:
            labels["rack"] = f"r{n // shape.nodes_per_rack}"
        nodes.append(Node(node_id, gpus, NODE_CPUS, NODE_MEMORY_MIB, labels=labels))
    return tuple(nodes)
