"""How fast a job runs when its GPUs span several nodes.

The table is `model_info.json`'s shape: `{model: {num_gpus: {num_nodes: relative_speed}}}`
(speed 1.0 = all GPUs on one node). Where the job's exact GPU count or node count is not
in the table, the nearest one is used (a tie goes to the larger key, the more pessimistic
reading). A job on one node always runs at full speed; a model the table does not know
runs at `default`. A job whose nodes are in more than one rack runs at `cross_rack` of
that again (the table was measured inside one rack; 1.0: racks cost nothing more).
"""

from __future__ import annotations

import json
from pathlib import Path

SpeedTable = dict[str, dict[int, dict[int, float]]]


class LocalityError(Exception):
    pass


def _nearest(keys: list[int], want: int) -> int:
    return min(keys, key=lambda k: (abs(k - want), -k))


class LocalityModel:
    def __init__(
        self, table: SpeedTable | None = None, default: float = 1.0, cross_rack: float = 1.0
    ) -> None:
        self.table = table or {}
        self.default = default
        self.cross_rack = cross_rack
        self._cache: dict[tuple[str, int, int], float] = {}

    def speed(self, model: str, gpus: int, nodes: int, racks: int = 1) -> float:
        if nodes <= 1:
            return 1.0
        key = (model, gpus, nodes)
        found = self._cache.get(key)
        if found is None:
            found = self._lookup(model, gpus, nodes)
            self._cache[key] = found
        return found * self.cross_rack if racks > 1 else found

    def _lookup(self, model: str, gpus: int, nodes: int) -> float:
        by_gpus = self.table.get(model)
        if not by_gpus:
            return self.default
        by_nodes = by_gpus[_nearest(list(by_gpus), gpus)]
        if not by_nodes:
            return self.default
        return by_nodes[_nearest(list(by_nodes), nodes)]


class NoLocality(LocalityModel):
    """Every placement runs at full speed."""

    def speed(self, model: str, gpus: int, nodes: int, racks: int = 1) -> float:
        return 1.0


def load_table(path: str | Path) -> SpeedTable:
    """Read and check a model_info.json; LocalityError names what is wrong."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LocalityError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise LocalityError(f"{path}: expected {{model: {{gpus: {{nodes: speed}}}}}}")
    table: SpeedTable = {}
    try:
        for model, by_gpus in raw.items():
            table[model] = {
                int(g): {int(n): float(s) for n, s in by_nodes.items()}
                for g, by_nodes in by_gpus.items()
            }
    except (AttributeError, TypeError, ValueError):
        raise LocalityError(
            f"{path}: model {model!r}: expected {{gpus: {{nodes: speed}}}} with numbers"
        ) from None
    for model, by_gpus in table.items():
        for by_nodes in by_gpus.values():
            if any(not s > 0 for s in by_nodes.values()):
                raise LocalityError(f"{path}: model {model!r}: speeds must be > 0")
    return table
