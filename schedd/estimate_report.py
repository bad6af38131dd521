"""What `GET /v1/estimates/{job}` shows: the estimator's answer for a job and its basis."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from schedd.estimator.features import of_row
from schedd.estimator.forest import TARGETS, Estimator, memory_mib
from schedd.store import jobs


def report(
    row: asyncpg.Record, estimator: Estimator | None, trained_at: float | None, enabled: bool
) -> dict[str, Any]:
    spec = jobs.spec_of(row)
    out: dict[str, Any] = {"job_id": row["id"]}
    peak: float | None = None  # the predicted peak GPU memory, unrounded
    if estimator is None:
        out["estimator"] = None
        out["estimates"] = {}
        out["basis"] = (
            "not trained yet: it learns from succeeded jobs once 20 have finished"
            if enabled
            else "the resource estimator is off (estimator_retrain_s = 0)"
        )
    else:
        predicted = estimator.predict(of_row(row))
        if (memory := predicted.get("gpu_memory_peak_mib")) is not None:
            peak = memory.value
        out["estimator"] = {
            "trained_on": estimator.trained_on,
            "trained_at": datetime.fromtimestamp(trained_at or 0.0, UTC).isoformat(),
        }
        out["estimates"] = {
            target: (
                {
                    "value": round(p.value, 3),
                    "low": round(p.low, 3),
                    "high": round(p.high, 3),
                    "basis": estimator.basis(target),
                }
                if (p := predicted.get(target)) is not None
                else {"value": None, "basis": estimator.basis(target)}
            )
            for target in TARGETS
        }
    # What the scheduler plans with, and where that comes from.
    if spec.estimated_runtime_s is not None:
        used = {"run_time_s": spec.estimated_runtime_s, "source": "spec"}
    elif "run_time_s" in out["estimates"] and out["estimates"]["run_time_s"]["value"]:
        used = {"run_time_s": out["estimates"]["run_time_s"]["value"], "source": "estimator"}
    else:
        used = {
            "run_time_s": None,
            "source": "history of the user's jobs of this name, else the policy's default",
        }
    out["used"] = used
    # The GPU memory it needs where it would share a GPU (AntMan): the spec's, else the
    # estimator's predicted peak, rounded as the scheduler reads it.
    if spec.gpu_memory_mib is not None:
        sharing = {"gpu_memory_mib": spec.gpu_memory_mib, "source": "spec"}
    elif peak is not None:
        sharing = {"gpu_memory_mib": memory_mib(peak), "source": "estimator"}
    else:
        sharing = {"gpu_memory_mib": None, "source": "not known: any little-used GPU"}
    out["used_for_sharing"] = sharing
    return out
