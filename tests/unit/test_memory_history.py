"""The analysis of bench/gpu/memory_history.py: a history's CSV, and the estimator on it.

Running the jobs needs a GPU; what is checked here is that a history written is read
back as it was, and that the analysis gives the forest the labels a memory figure
depends on (a history made up for the test, where peak memory follows width, depth and
batch: the forest must beat the per-name mean there clearly, which it cannot without them).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import memory_history


def made_up_history(n: int, util: bool) -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = []
    for i, config in enumerate(memory_history.draw(memory_history.GPU_GRID, n, seed=3)):
        memory = 600 + config["width"] * config["depth"] * config["batch"] / 16
        rows.append(
            {
                "job": f"job-{i:03d}",
                **config,
                "steps": 100,
                memory_history.MEMORY: memory,
                "memory_source": "nvml",
                "torch_reserved_peak_mib": memory - 500,
                memory_history.UTIL: rng.uniform(20, 90) if util else None,
                memory_history.UTIL_SPREAD: rng.uniform(1, 9) if util else None,
                "util_samples": 10 if util else 0,
            }
        )
    return rows


def test_history_round_trips_through_csv(tmp_path: Path) -> None:
    rows = made_up_history(5, util=True)
    path = tmp_path / "history.csv"
    memory_history.write_history(path, rows)
    assert memory_history.read_history(path) == rows


def test_forest_learns_memory_from_the_labels() -> None:
    acc = memory_history.accuracy(made_up_history(120, util=False), train_share=0.7)
    assert (acc["train_jobs"], acc["test_jobs"]) == (84, 36)
    memory = acc[memory_history.MEMORY]
    forest = memory["forest"]["median_error_pct"]
    # Without the labels the forest knows only the name: it could not beat its mean.
    assert forest < 0.7 * memory["mean of the same name"]["median_error_pct"]
    assert forest < 0.7 * memory["median of all"]["median_error_pct"]
    assert {"width", "depth", "batch_size"} & set(memory["top_features"])


def test_targets_too_few_jobs_report_are_not_measured() -> None:
    acc = memory_history.accuracy(made_up_history(40, util=False), train_share=0.7)
    assert "forest" in acc[memory_history.MEMORY]
    assert acc[memory_history.UTIL] == {"not_measured": "0 training jobs report it, 20 needed"}
