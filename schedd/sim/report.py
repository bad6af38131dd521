"""Runs as people read them (a table, times in one stated unit) and as JSON (seconds)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from schedd.sim.metrics import Summary
from schedd.sim.units import UNITS


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, others right."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def overview(summaries: Sequence[Summary], unit: str) -> str:
    scale = UNITS[unit]
    headers = [
        "policy", "jobs", "finished", f"avg JCT ({unit})", "p50", "p95", "p99",
        f"avg queueing ({unit})", f"makespan ({unit})", "GPU alloc", "GPU util", "Jain",
        "deadline miss", "preemptions",
    ]  # fmt: skip
    rows = [
        [
            s.policy,
            f"{s.jobs:,}",
            f"{s.finished:,}",
            _num(s.jct_avg_s / scale),
            _num(s.jct_p50_s / scale),
            _num(s.jct_p95_s / scale),
            _num(s.jct_p99_s / scale),
            _num(s.queueing_avg_s / scale),
            _num(s.makespan_s / scale),
            _pct(s.allocation_avg),
            _pct(s.utilization_avg),
            _num(s.jain, 3),
            _pct(s.deadline_miss_rate),
            f"{s.preemptions:,}",
        ]
        for s in summaries
    ]
    # What only some profiles do (suspend jobs to time-slice, migrate, grow or shrink,
    # pack): a column each where any run did it.
    _count_column(headers, rows, "suspensions", [s.suspensions for s in summaries])
    _count_column(headers, rows, "migrations", [s.migrations for s in summaries])
    _count_column(headers, rows, "resizes", [s.resizes for s in summaries])
    _count_column(headers, rows, "packs", [s.packs for s in summaries])
    if any(s.deadline_jobs for s in summaries):
        headers.append(f"best-effort avg JCT ({unit})")
        for row, s in zip(rows, summaries, strict=True):
            row.append(_num(s.jct_best_effort_avg_s / scale))
    return table(headers, rows)


def _count_column(headers: list[str], rows: list[list[str]], name: str, counts: list[int]) -> None:
    """A column of `counts` (one a row) after the others, only where any is not 0: a
    profile that never takes the action it counts is not shown a column of zeros."""
    if any(counts):
        headers.append(name)
        for row, count in zip(rows, counts, strict=True):
            row.append(f"{count:,}")


def details(s: Summary, unit: str) -> str:
    scale = UNITS[unit]
    lines = [f"{s.policy}:"]
    notes = []
    if s.dropped_zero_gpu:
        notes.append(f"{s.dropped_zero_gpu:,} jobs with 0 GPUs dropped")
    if s.never_finished:
        notes.append(f"{s.never_finished:,} jobs never finished (still waiting at the end)")
    if s.cancelled:
        notes.append(f"{s.cancelled:,} jobs cancelled by the policy")
    if s.deadline_jobs:
        notes.append(f"{s.deadline_missed:,} of {s.deadline_jobs:,} deadline jobs missed")
    for note in notes:
        lines.append(f"  {note}")
    lines.append(f"  plans: {s.plan_calls:,} (replay took {s.wall_s:.1f} s here)")
    if s.slowed_by_locality_s or s.slowed_by_sharing_s:
        lost = (
            f"  run time lost against running alone on one node ({unit}): "
            f"{_num(s.slowed_by_locality_s / scale)} to spread across nodes, "
            f"{_num(s.slowed_by_sharing_s / scale)} to sharing or packing GPUs"
        )
        if s.deadline_jobs:
            lost += (
                f" (best-effort jobs: {_num(s.best_effort_slowed_by_locality_s / scale)} and "
                f"{_num(s.best_effort_slowed_by_sharing_s / scale)})"
            )
        lines.append(lost)
    lines.append(f"  actions applied: {_counts(s.actions)}")
    lines.append(f"  waiting, counted in job-instants by code: {_counts(s.waits)}")
    if s.unsupported_actions:
        lines.append(f"  unsupported actions, ignored: {_counts(s.unsupported_actions)}")
    if s.refused_actions:
        lines.append(f"  actions that could not apply: {_counts(s.refused_actions)}")
    if s.replan_cap_hits:
        lines.append(f"  instants that hit the replan cap: {s.replan_cap_hits:,}")
    if len(s.queues) > 1 or any(q.guarantee_gpus for q in s.queues):
        rows = [
            [
                q.name,
                f"{q.jobs:,}",
                _num(q.weight, 2),
                _num(q.avg_gpus),
                _num(q.share),
                str(q.guarantee_gpus or "-"),
                _num(None if q.below_guarantee_s is None else q.below_guarantee_s / scale),
            ]
            for q in s.queues
        ]
        headers = [
            "queue", "jobs", "weight", "avg GPUs", "GPUs/weight", "guarantee",
            f"below guarantee ({unit})",
        ]  # fmt: skip
        lines += ["  " + line for line in table(headers, rows).splitlines()]
    return "\n".join(lines)


def render(summaries: Sequence[Summary], unit: str, title: str) -> str:
    parts = [title, "", overview(summaries, unit), ""]
    parts += [details(s, unit) + "\n" for s in summaries]
    return "\n".join(parts).rstrip() + "\n"


def _clean(value: Any) -> Any:
    """JSON has no NaN: an undefined figure is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def as_json(summary: Summary) -> dict[str, Any]:
    """Every figure of the run, times in seconds."""
    data = asdict(summary)
    data["deadline_miss_rate"] = summary.deadline_miss_rate
    data["queues"] = [{**asdict(q), "share": q.share} for q in summary.queues]
    return dict(_clean(data))
