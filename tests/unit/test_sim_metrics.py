"""Report maths: percentiles, Jain's index, time-weighted allocation, and the JSON form."""

from __future__ import annotations

import math

import pytest

from schedd.sim.metrics import buckets, jain_index, mean, percentile, step_integral
from schedd.sim.report import as_json, render, table


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([4, 1, 3, 2], 0, 1),
        ([4, 1, 3, 2], 100, 4),
        ([10], 99, 10),
        ([0, 10], 95, 9.5),
        (list(range(1, 101)), 99, 99.01),
    ],
)
def test_percentile_interpolates_between_ranks(
    values: list[float], q: float, expected: float
) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_no_values_give_nan() -> None:
    assert math.isnan(percentile([], 50))
    assert math.isnan(mean([]))
    assert math.isnan(jain_index([]))
    assert math.isnan(jain_index([0, 0]))


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1, 1, 1], 1.0), ([1, 0], 0.5), ([5, 0, 0, 0], 0.25), ([1, 2], 9 / 10)],
)
def test_jain_index(values: list[float], expected: float) -> None:
    assert jain_index(values) == pytest.approx(expected)


SERIES = [(0.0, 1.0), (10.0, 2.0), (15.0, 1.0), (18.0, 0.0)]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0, 18, 23), (0, 20, 23), (5, 12, 5 + 4), (16, 30, 2), (-5, 0, 0)],
)
def test_step_integral(start: float, end: float, expected: float) -> None:
    assert step_integral(SERIES, start, end) == pytest.approx(expected)


def test_buckets_average_each_span() -> None:
    assert buckets(SERIES, 0, 20, count=4) == [(0, 1.0), (5, 1.0), (10, 2.0), (15, 0.6)]
    [(start, average)] = buckets(SERIES, 0, 18, count=1)
    assert start == 0
    assert average == pytest.approx(23 / 18)


def test_table_aligns_columns() -> None:
    text = table(["name", "n"], [["a", "1"], ["long", "100"]])
    assert text.splitlines() == ["name    n", "----  ---", "a       1", "long  100"]


def test_json_has_no_nan_and_the_report_names_its_unit() -> None:
    from schedd.sim.metrics import summarize
    from tests.unit.test_sim_engine import job, simulate

    summary = summarize(simulate([job("a", 0, 120)], "1x1"))
    data = as_json(summary)
    assert data["jct_avg_s"] == 120
    assert data["deadline_miss_rate"] is None  # no deadlines: undefined, not NaN
    assert data["queues"][0]["share"] == pytest.approx(1.0)
    text = render([summary], "min", "title; times in min")
    assert "avg JCT (min)" in text
    assert "2.0" in text  # 120 s in minutes
