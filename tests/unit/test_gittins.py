"""The Gittins index learned from finished jobs, and the plugins that rank and preempt by it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedd.policy import framework
from schedd.policy.actions import Wait
from schedd.policy.gittins import MAX_POINTS, MIN_SAMPLES, ServiceHistory, table_for
from schedd.policy.order.gittins import pending_rank, rank
from schedd.policy.profiles import BUILTIN, stages
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View
from schedd.sim.service_book import ServiceBook
from tests.unit.policy_harness import (
    HEAVY_TAIL,
    launches,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)

# Enough finished jobs for the default profile to learn its index from.
LEARNED = BUILTIN["default"].settings.gittins_min_finished
# Half the jobs take 1 GPU-second, half 4: a newcomer (index 1/2: one chance in two to
# finish in one second) is worth more than a job past its first second (1 in 3 s).
SHORT_OR_LONG = ServiceHistory.of([1.0, 4.0] * LEARNED)
# Every job takes about 10,000 GPU-seconds: a job that has started is worth finishing.
ALIKE = ServiceHistory.of([10_000.0 + i for i in range(LEARNED * 2)])


def test_the_index_of_a_two_point_distribution_is_the_closed_form() -> None:
    table = table_for(SHORT_OR_LONG)
    assert table is not None
    assert table.index(0.0) == pytest.approx(0.5)
    assert table.index(1.0) == pytest.approx(1 / 3)
    assert table.index(3.5) > table.index(1.0)  # nearer the end, worth more
    assert table.drops_below(0.0, 0.4) == 1.0
    assert table.drops_below(1.0, 0.2) == 4.0  # past every job known: ranked last


def test_alike_run_times_rank_a_started_job_above_a_newcomer() -> None:
    table = table_for(ALIKE)
    assert table is not None
    assert table.index(5_000.0) > table.index(0.0)
    assert table.drops_below(0.0, table.index(0.0)) == table.points[-1]


def test_a_heavy_tail_ranks_a_newcomer_above_a_long_runner() -> None:
    table = table_for(HEAVY_TAIL)
    assert table is not None
    assert table.index(0.0) > table.index(1_000.0)


def test_too_short_a_history_gives_no_table() -> None:
    assert table_for(None) is None
    assert table_for(ServiceHistory.of([5.0] * (MIN_SAMPLES - 1))) is None
    assert table_for(ServiceHistory.of([5.0] * 99), min_finished=100) is None
    assert table_for(ServiceHistory.of([5.0] * 100), min_finished=100) is not None
    # Below the floor a smaller threshold is not taken at its word.
    assert table_for(ServiceHistory.of([5.0] * (MIN_SAMPLES - 1)), min_finished=1) is None


def test_the_default_orders_by_2d_las_until_it_has_its_share_of_history() -> None:
    """With alike run times the index keeps a started job first; 2D-LAS puts the
    newcomer (a lower queue) first. The default learns only from `LEARNED` jobs."""
    n = node("n", 1)
    waiting = [pending("new", 1, at=1.0), pending("resumed", 1, at=2.0, attained_s=5_000.0)]
    young = snapshot([n], waiting, service_history=ServiceHistory.of([10_000.0] * (LEARNED - 1)))
    assert set(launches(run("default", young))) == {"new"}
    assert set(launches(run("default-guaranteed", young))) == {"resumed"}  # learns from 32


def test_unfinished_jobs_count_as_censored_observations() -> None:
    """Kaplan-Meier: ten jobs still running at 2.5 are at risk at 2, not at 3."""
    history = ServiceHistory.of([1.0, 2.0, 3.0] * 20, [2.5] * 10)
    assert history.values == (1.0, 2.0, 3.0)
    assert history.masses == pytest.approx((2 / 7, 2 / 7, 3 / 7))
    # A job running past every finished one leaves mass beyond them.
    assert ServiceHistory.of([1.0] * 3, [9.0]).beyond == pytest.approx(0.25)


def test_zero_service_is_dropped_and_long_histories_are_thinned() -> None:
    history = ServiceHistory.of([0.0, -1.0, *range(1, 3 * MAX_POINTS + 1)])
    assert len(history.values) <= MAX_POINTS and history.finished == 3 * MAX_POINTS
    assert sum(history.masses) == pytest.approx(1.0)
    assert list(history.values) == sorted(history.values)


@given(st.lists(st.floats(1.0, 1e6), min_size=MIN_SAMPLES, max_size=200))
def test_the_index_is_at_least_one_over_the_mean(samples: list[float]) -> None:
    """Serving a job to its end is one of the choices the index maximises over."""
    table = table_for(ServiceHistory.of(samples))
    assert table is not None
    assert table.index(0.0) >= 1 / (sum(samples) / len(samples)) * (1 - 1e-9)
    assert all(x > 0 and math.isfinite(x) for x in table.indices)


@given(
    st.lists(st.sampled_from([1.0, 2.0, 5.0, 30.0, 400.0]), min_size=MIN_SAMPLES, max_size=80),
    st.floats(0.0, 500.0),
    st.integers(0, 200),
)
def test_below_until_is_where_a_scan_of_the_steps_finds_the_index_again(
    samples: list[float], attained: float, pick: int
) -> None:
    table = table_for(ServiceHistory.of(samples))
    assert table is not None
    value = table.indices[pick % len(table.indices)]  # the values asked: waiting indices
    if table.index(attained) >= value:
        return  # asked only of a job below `value`
    later = [
        p for p, i in zip(table.points, table.indices, strict=True) if p > attained and i >= value
    ]
    assert table.below_until(attained, value) == (later[0] if later else None)


@given(
    st.sampled_from([None, SHORT_OR_LONG, ALIKE, HEAVY_TAIL]),
    st.lists(st.floats(0.0, 1e6), min_size=1, max_size=20),
)
def test_the_pending_jobs_sort_key_is_their_rank(
    history: ServiceHistory | None, attained: list[float]
) -> None:
    """The order's fast key (table looked up once) ranks as `rank` does, with a table
    and without one (2D-LAS levels)."""
    jobs = [pending(f"j{i}", 1, attained_s=a) for i, a in enumerate(attained)]
    view = View.build(snapshot([node("n", 1)], jobs, service_history=history), 0.0, Settings())
    key = pending_rank(view)
    assert [key(j) for j in jobs] == [rank(j, view) for j in jobs]


# ---- the plugins, in the `default` profile ----------------------------------------


def test_the_order_follows_the_index() -> None:
    n = node("n", 1)
    waiting = [pending("new", 1, at=1.0), pending("resumed", 1, at=2.0, attained_s=5_000.0)]
    plan = run("default", snapshot([n], waiting, service_history=ALIKE))
    assert set(launches(plan)) == {"resumed"}
    plan = run("default", snapshot([n], waiting, service_history=HEAVY_TAIL))
    assert set(launches(plan)) == {"new"}


def test_a_newcomer_preempts_only_where_the_history_says_it_is_worth_more() -> None:
    n = node("n", 1)
    held = [placed("runner", n, [0], attained_s=5_000.0, started_at=0.0)]
    snap = snapshot([n], [pending("new", 1)], held, service_history=HEAVY_TAIL)
    assert preempted(run("default", snap, now=10_000.0)) == {"runner"}
    snap = snapshot([n], [pending("new", 1)], held, service_history=ALIKE)
    assert not preempted(run("default", snap, now=10_000.0))


def test_with_no_history_it_preempts_as_tiresias() -> None:
    n = node("n", 1)
    held = [placed("runner", n, [0], attained_s=5_000.0, started_at=0.0)]
    snap = snapshot([n], [pending("new", 1)], held)
    assert preempted(run("default", snap, now=10_000.0)) == {"runner"}
    held = [placed("runner", n, [0], attained_s=3_000.0, started_at=0.0)]
    snap = snapshot([n], [pending("new", 1)], held)
    assert run("default", snap, now=10_000.0).recheck_at == 10_200.0


def test_it_looks_again_when_a_runner_falls_below_a_waiting_job() -> None:
    n = node("n", 2)
    # 2 GPUs at half a GPU-second: past the 1 GPU-second point in a quarter second.
    held = [placed("wide", n, [0, 1], attained_s=0.5, started_at=0.0)]
    snap = snapshot([n], [pending("new", 1)], held, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=0.0)
    assert not preempted(plan) and plan.recheck_at == 10_000.25


def test_it_looks_again_when_a_job_it_launches_falls_below_a_waiting_job() -> None:
    """`first` starts now with no service; `second` waits at the index `first` had.
    Past its first GPU-second `first` is worth less: the plan asks to look then. A job
    the plan launches waits no more, so it is no waiting index to compare against."""
    n = node("n", 1)
    waiting = [pending("first", 1, at=1.0), pending("second", 1, at=2.0)]
    snap = snapshot([n], waiting, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=0.0)
    assert set(launches(plan)) == {"first"} and set(plan.waiting) == {"second"}
    assert plan.recheck_at == 10_001.0
    # Only a job of another queue waits (and never fits): nothing of `first`'s queue
    # waits once it runs, so its index falling is no reason to look again.
    alone = [pending("first", 1, at=1.0), pending("wide", 2, at=2.0, queue="other")]
    snap = snapshot([n], alone, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=0.0)
    assert set(launches(plan)) == {"first"} and set(plan.waiting) == {"wide"}
    assert plan.recheck_at is None


def test_it_looks_again_when_a_runner_below_a_waiting_job_comes_of_age() -> None:
    """A young runner is no victim: the plan looks again when one is both below the
    waiting index and of age, not at the earlier of the two."""
    n = node("n", 1)
    waiting = [pending("new", 1)]  # index 1/2
    crossing_later = [placed("young", n, [0], attained_s=0.0, started_at=9_900.0)]
    snap = snapshot([n], waiting, crossing_later, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=300.0)
    assert not preempted(plan) and plan.recheck_at == 10_200.0  # crosses at 10,001
    snap = snapshot([n], waiting, crossing_later, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=50.0)
    assert plan.recheck_at == 10_001.0  # of age at 9,950, below at 10,001
    below_already = [placed("young", n, [0], attained_s=1.0, started_at=9_950.0)]  # 1/3
    snap = snapshot([n], waiting, below_already, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=300.0)
    assert not preempted(plan) and plan.recheck_at == 10_250.0
    # Past every run known its index is the least and stays so: below for good.
    past_all = [placed("young", n, [0], attained_s=10.0, started_at=9_950.0)]
    snap = snapshot([n], waiting, past_all, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=300.0)
    assert not preempted(plan) and plan.recheck_at == 10_250.0


def test_it_looks_again_when_victims_would_free_enough_gpus_on_one_node() -> None:
    """A 2-GPU job waits; one GPU a node is held by another queue or falls below its
    index at 10,000.5 (a), 10,000.75 (b) and 10,001 (c). b's makes two GPUs in all,
    but only c's makes two on one node, which the job needs."""
    n1, n2 = node("n1", 2), node("n2", 2)
    held = [
        placed("a", n1, [0], attained_s=0.5),
        placed("other", n1, [1], queue="other"),
        placed("b", n2, [0], attained_s=0.25),
        placed("c", n2, [1], attained_s=0.0),
    ]
    snap = snapshot([n1, n2], [pending("new", 2)], held, service_history=SHORT_OR_LONG)
    plan = run("default", snap, now=10_000.0, min_run_s=0.0)
    assert not preempted(plan) and plan.recheck_at == 10_001.0
    # A waiting job of one GPU could take a's at once when it falls below.
    two = [pending("new", 2), pending("small", 1, at=1.0)]
    snap = snapshot([n1, n2], two, held, service_history=SHORT_OR_LONG)
    assert run("default", snap, now=10_000.0, min_run_s=0.0).recheck_at == 10_000.5


# Most jobs take 5 GPU-seconds, one 60 and one 4,000: a job past 60 is ranked below
# nearly everything, and one at 2,000 waits at a far lower index than a newcomer.
ONE_LONG = ServiceHistory.of([5.0] * 38 + [60.0, 4_000.0])


def test_where_the_best_waiting_job_is_held_back_by_more_than_gpus_a_lower_one_counts() -> None:
    """`hungry` (the highest index) asks more CPUs than the node has: freeing GPUs does
    nothing for it. `long` waits at a far lower index: `r1`, above it now, falls below
    it past 60 GPU-seconds, and `long` may then preempt it: the plan looks again then."""
    n = node("n", 1)
    runner = placed("r1", n, [0], attained_s=40.0, started_at=9_000.0)
    held = [dataclasses.replace(runner, attained_as_of=10_000.0)]  # grows from now on
    waiting = [
        pending("hungry", 1, cpus=1_000),
        pending("long", 1, at=1.0, attained_s=2_000.0),
    ]
    learned = table_for(ONE_LONG)
    assert learned is not None
    below = learned.drops_below(40.0, learned.index(2_000.0))
    assert below is not None
    snap = snapshot([n], waiting, held, service_history=ONE_LONG)
    plan = run("default-guaranteed", snap, now=10_000.0, min_run_s=0.0)
    assert not preempted(plan) and plan.recheck_at == 10_000.0 + (below - 40.0)
    later = run("default-guaranteed", snap, now=plan.recheck_at, min_run_s=0.0)
    assert preempted(later) == {"r1"}


def test_gpus_of_jobs_on_their_way_out_count_toward_room() -> None:
    """`wide` needs both GPUs of the node: one is freed by a job already leaving, the
    other by `r1` once it falls below `wide`'s index (past 5 GPU-seconds)."""
    n = node("n", 2)
    held = [
        placed("leaving", n, [0], state="preempting"),
        placed("r1", n, [1], attained_s=4.0, started_at=9_000.0),
    ]
    snap = snapshot([n], [pending("wide", 2)], held, service_history=ONE_LONG)
    learned = table_for(ONE_LONG)
    assert learned is not None
    below = learned.drops_below(4.0, learned.index(0.0))
    assert below is not None
    plan = run("default-guaranteed", snap, now=10_000.0, min_run_s=0.0)
    assert not preempted(plan) and plan.recheck_at == 10_000.0 + (below - 4.0)


def test_the_simulator_rebuilds_its_history_only_as_it_grows() -> None:
    book = ServiceBook()
    for _ in range(MIN_SAMPLES - 1):
        book.finished(100.0, lambda: [])
    assert book.history is None
    book.finished(100.0, lambda: [50.0])
    first = book.history
    assert first is not None and first.finished == MIN_SAMPLES
    for _ in range(3):
        book.finished(100.0, lambda: [])
        assert book.history is first  # not 10% more yet: the same object, its table reused
    book.finished(100.0, lambda: [])
    assert book.history is not first and book.history.finished == MIN_SAMPLES + 4


def test_a_waiting_jobs_twins_wait_alike_without_the_stages_asked_again() -> None:
    """Jobs of one queue, user and request that rank no better than one that found no
    room wait as it did; the admit stage is asked once, not once per job."""
    n = node("n", 1)
    held = [placed("runner", n, [0], attained_s=5_000.0, started_at=0.0)]
    waiting = [pending(f"new{i}", 1, at=float(i)) for i in range(4)]
    snap = snapshot([n], waiting, held, service_history=ALIKE)
    asked: list[str] = []

    def counting(job: PendingJob, view: View) -> Wait | None:
        asked.append(job.job_id)
        return None

    default = dataclasses.replace(stages(BUILTIN["default"], "default"), admit=(counting,))
    assert default.waits_alike is not None
    # Before the mark at which the default would make them opportunistic.
    plan = framework.plan(default, snap, 1_000.0)
    assert asked == ["new0"]
    assert not plan.actions and set(plan.waiting) == {w.job_id for w in waiting}
    assert {w.code for w in plan.waiting.values()} == {"no_capacity"}
    asked.clear()
    each = framework.plan(dataclasses.replace(default, waits_alike=None), snap, 1_000.0)
    assert asked == [w.job_id for w in waiting] and each.waiting == plan.waiting
