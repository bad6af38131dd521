"""Trace readers: each format's CSV into one list of jobs, in seconds, in submission order.

Formats (see docs/simulator.md for the columns):
- `itp`: Microsoft ITP raw traces, `job_id,submission_time,duration,num_gpu`, seconds.
- `itp-deadline`: ITP with `model_name` and an absolute `deadline`, seconds.
- `chronus`: the Philly-derived Chronus traces, in MINUTES; `user` is the virtual cluster
  (the job's queue and user); a job with `best_effort` 0 has its first deadline at
  submission + the first value of `expect_time_list`.
- `csv`: `job_id,submit_time,duration,num_gpu` and optionally `user,queue,name,deadline`,
  seconds (`deadline` absolute, on the same clock as `submit_time`).

Jobs asking for 0 GPUs are dropped and counted, as the reference simulators did: a GPU
scheduler has nothing to decide for them.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

FORMATS = ("itp", "itp-deadline", "chronus", "csv")
DEFAULT_USER = "default"
DEFAULT_QUEUE = "default"


class TraceError(Exception):
    """A trace that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    duration_s: float  # run time alone on its GPUs, all on one node
    gpus: int
    user: str = DEFAULT_USER
    queue: str = DEFAULT_QUEUE
    name: str = ""  # the model it trains, where the trace says
    deadline_s: float | None = None  # absolute, on the clock of submit_s


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    format: str
    jobs: tuple[TraceJob, ...]  # submission order (ties: file order)
    dropped_zero_gpu: int
    has_deadlines: bool


Row = dict[str, str]
RowReader = Callable[["_Cells"], TraceJob]


class _Cells:
    """One CSV row, with typed accessors whose errors say where the bad cell is."""

    def __init__(self, path: str, line: int, row: Row) -> None:
        self.path, self.line, self.row = path, line, row

    def fail(self, column: str, why: str) -> TraceError:
        return TraceError(f"{self.path}:{self.line}: column {column!r}: {why}")

    def text(self, column: str, default: str | None = None) -> str:
        value = (self.row.get(column) or "").strip()
        if value:
            return value
        if default is not None:
            return default
        raise self.fail(column, "is empty")

    def number(self, column: str) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, f"expected a number, got {raw!r}") from None
        if not value >= 0:  # also refuses NaN
            raise self.fail(column, f"expected a number >= 0, got {raw!r}")
        return value

    def optional_number(self, column: str) -> float | None:
        return self.number(column) if (self.row.get(column) or "").strip() else None

    def count(self, column: str) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            raise self.fail(column, f"expected a whole number, got {raw!r}") from None
        if value < 0:
            raise self.fail(column, f"expected a whole number >= 0, got {raw!r}")
        return value


def _itp(cells: _Cells) -> TraceJob:
    return TraceJob(
        job_id=cells.text("job_id"),
        submit_s=cells.number("submission_time"),
        duration_s=cells.number("duration"),
        gpus=cells.count("num_gpu"),
    )


def _itp_deadline(cells: _Cells) -> TraceJob:
    return TraceJob(
        job_id=cells.text("job_id"),
        submit_s=cells.number("submission_time"),
        duration_s=cells.number("duration"),
        gpus=cells.count("num_gpu"),
        name=cells.text("model_name", ""),
        deadline_s=cells.number("deadline"),
    )


def _first_deadline_min(cells: _Cells) -> float:
    raw = cells.text("expect_time_list")
    first = raw.split("-")[0]
    try:
        value = float(first)
    except ValueError:
        raise cells.fail(
            "expect_time_list", f"expected minutes like 159-189, got {raw!r}"
        ) from None
    if not value >= 0:
        raise cells.fail("expect_time_list", f"expected minutes >= 0, got {raw!r}")
    return value


def _chronus(cells: _Cells) -> TraceJob:
    minute = 60.0
    submit_min = cells.number("submit_time")
    best_effort = cells.text("best_effort")
    if best_effort not in ("0", "1"):
        raise cells.fail("best_effort", f"expected 0 or 1, got {best_effort!r}")
    deadline = None
    if best_effort == "0":
        deadline = (submit_min + _first_deadline_min(cells)) * minute
    vc = cells.text("user")
    return TraceJob(
        job_id=cells.text("job_id"),
        submit_s=submit_min * minute,
        duration_s=cells.number("duration") * minute,
        gpus=cells.count("num_gpu"),
        user=vc,
        queue=vc,
        name=cells.text("model_name", ""),
        deadline_s=deadline,
    )


def _plain(cells: _Cells) -> TraceJob:
    user = cells.text("user", DEFAULT_USER)
    return TraceJob(
        job_id=cells.text("job_id"),
        submit_s=cells.number("submit_time"),
        duration_s=cells.number("duration"),
        gpus=cells.count("num_gpu"),
        user=user,
        queue=cells.text("queue", DEFAULT_QUEUE),
        name=cells.text("name", ""),
        deadline_s=cells.optional_number("deadline"),
    )


_READERS: dict[str, tuple[tuple[str, ...], RowReader]] = {
    "itp": (("job_id", "submission_time", "duration", "num_gpu"), _itp),
    "itp-deadline": (
        ("job_id", "submission_time", "duration", "num_gpu", "model_name", "deadline"),
        _itp_deadline,
    ),
    "chronus": (
        (
            "job_id",
            "user",
            "num_gpu",
            "submit_time",
            "model_name",
            "duration",
            "expect_time_list",
            "best_effort",
        ),
        _chronus,
    ),
    "csv": (("job_id", "submit_time", "duration", "num_gpu"), _plain),
}


def _rows(path: str, required: tuple[str, ...]) -> Iterator[_Cells]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        missing = [c for c in required if c not in columns]
        if missing:
            raise TraceError(f"{path}: missing columns {', '.join(missing)}")
        for row in reader:
            yield _Cells(path, reader.line_num, row)


def read_trace(path: str | Path, fmt: str, limit: int | None = None) -> Trace:
    """The trace's jobs in submission order; with `limit`, only the `limit` earliest
    rows (0-GPU ones included, then dropped), so jobs + dropped = limit."""
    if fmt not in _READERS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    required, reader = _READERS[fmt]
    name = str(path)
    jobs = [reader(cells) for cells in _rows(name, required)]
    jobs.sort(key=lambda j: j.submit_s)  # stable: ties keep file order
    if limit is not None:
        jobs = list(islice(jobs, limit))
    kept = tuple(j for j in jobs if j.gpus > 0)
    seen: set[str] = set()
    for job in kept:
        if job.job_id in seen:
            raise TraceError(f"{name}: job_id {job.job_id!r} appears twice")
        seen.add(job.job_id)
    return Trace(
        path=name,
        format=fmt,
        jobs=kept,
        dropped_zero_gpu=len(jobs) - len(kept),
        has_deadlines=any(j.deadline_s is not None for j in kept),
    )
