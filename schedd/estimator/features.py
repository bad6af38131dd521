"""A job's features for the estimator: what its spec says, as a flat dict.

Strings become one-hot columns and numbers stay numbers (`DictVectorizer`), so a label
such as `model=resnet50` and a GPU count are both features without a schema. A label
whose value reads as a number (`batch_size=64`) is given both ways: the value as a
category and as a number, so that the forest can split on it either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Features = dict[str, float | str]


def features(
    *,
    user: str,
    name: str,
    queue: str,
    gpus: int,
    cpus: float,
    memory_mib: int,
    iterations: int | None = None,
    labels: dict[str, str] | None = None,
) -> Features:
    out: Features = {
        "user": user,
        "name": name,
        "queue": queue,
        "gpus": float(gpus),
        "cpus": float(cpus),
        "memory_mib": float(memory_mib),
    }
    if iterations is not None:
        out["iterations"] = float(iterations)
    for key, value in (labels or {}).items():
        out[f"label.{key}"] = value
        number = _number(value)
        if number is not None:
            out[f"label.{key}#"] = number
    return out


def of_row(row: Mapping[str, Any]) -> Features:
    """The features of a job as the store holds it: its columns (user_name, name,
    queue, gpus, cpus, memory_mib; the GPU count is what a resize made it) and, from
    `labels` and `iterations` columns where the query reads them or else from its
    `spec`, its labels and iterations."""
    spec = row.get("spec") or {}
    labels = row["labels"] if "labels" in row else spec.get("labels")
    iterations = row["iterations"] if "iterations" in row else spec.get("iterations")
    return features(
        user=row["user_name"],
        name=row["name"],
        queue=row["queue"],
        gpus=row["gpus"],
        cpus=row["cpus"],
        memory_mib=row["memory_mib"],
        iterations=iterations,
        labels=dict(labels or {}),
    )


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None
