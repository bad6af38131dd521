"""The simulated cluster's shape: NODES identical nodes of GPUS whole GPUs, "120x8"."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class ClusterShape:
    nodes: int
    gpus_per_node: int
    # Consecutive nodes per rack (label `rack`, for topology-aware placement); None: no
    # racks, one flat network.
    nodes_per_rack: int | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


def parse_shape(text: str) -> ClusterShape:
    """`"120x8"` -> 120 nodes of 8 GPUs; ValueError with the expected form otherwise."""
    match = _SHAPE.match(text)
    if not match:
        raise ValueError("expected NODESxGPUS, e.g. 120x8")
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if nodes < 1 or gpus < 1:
        raise ValueError(f"expected at least 1 node of at least 1 GPU, got {text.strip()!r}")
    return ClusterShape(nodes, gpus)
