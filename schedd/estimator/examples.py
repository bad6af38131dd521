"""Training examples from the store's finished jobs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from schedd.estimator import features as feats
from schedd.estimator.forest import Example


def example(row: Mapping[str, Any]) -> Example:
    """A succeeded job's features and what it took: run seconds on its GPUs (its
    GPU-seconds over its GPU count, all attempts), peak GPU memory, and utilisation."""
    targets: dict[str, float] = {}
    if row["gpus"] > 0 and row["attained_gpu_s"] > 0:
        targets["run_time_s"] = row["attained_gpu_s"] / row["gpus"]
    elif row["wall_s"] is not None and row["wall_s"] > 0:
        targets["run_time_s"] = row["wall_s"]
    if row["gpu_memory_peak_mib"] is not None:
        targets["gpu_memory_peak_mib"] = float(row["gpu_memory_peak_mib"])
    n = row["gpu_util_samples"]
    if n > 0:
        mean = row["gpu_util_sum"] / n
        targets["gpu_util_pct"] = mean
        if n > 1:
            targets["gpu_util_std_pct"] = math.sqrt(max(row["gpu_util_sumsq"] / n - mean**2, 0.0))
    return Example(feats.of_row(row), targets)
