"""Victims lose the least work: the time since a job's start or its last checkpoint."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import build
from schedd.policy.profiles import ProfileSpec
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from tests.unit.policy_harness import (
    assert_valid,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)

QUEUES = (
    QueueSpec("a", guarantee=Resources(gpus=4)),
    QueueSpec("b", guarantee=Resources(gpus=4)),
)
NOW = 10_000.0


@pytest.mark.parametrize(
    ("started_at", "checkpointed_at", "victim"),
    [
        (1_000.0, None, "plain"),  # saved: 9000 s at risk; plain (started 9000): 1000 s
        (1_000.0, 9_900.0, "saved"),  # 100 s at risk since its checkpoint
        (1_000.0, 8_000.0, "plain"),  # 2000 s at risk, still more than plain's 1000 s
        (9_500.0, 100.0, "saved"),  # a checkpoint before this attempt: 500 s since the start
    ],
    ids=["never-checkpointed", "checkpointed-recently", "checkpointed-earlier", "stale-checkpoint"],
)
def test_reclaim_preempts_the_job_that_loses_the_least_work_since_its_checkpoint(
    started_at: float, checkpointed_at: float | None, victim: str
) -> None:
    """A job that started long ago but saved a checkpoint a moment ago loses less than
    one that started later and never saved: the start alone would pick the wrong one."""
    n = node("n", 8)
    saved = placed("saved", n, [0], queue="b", started_at=started_at)
    saved = dataclasses.replace(saved, checkpointed_at=checkpointed_at)
    plain = placed("plain", n, [1], queue="b", started_at=9_000.0)
    rest = [placed(f"b{i}", n, [i], queue="b", started_at=0.0) for i in range(2, 8)]
    snap = snapshot([n], [pending("a1", 1, queue="a")], [saved, plain, *rest], queues=QUEUES)
    plan = run("drf", snap, now=NOW)
    assert preempted(plan) == {victim}


def test_a_long_jobs_failed_reclaim_is_not_taken_for_a_short_twins_under_reservations() -> None:
    """big holds n-g1 (backfill): a job may use it only if it ends before big starts.
    long, of a's request, finds no room even with b's job stopped; short does, and is
    not answered from long's failure."""
    spec = ProfileSpec(
        order="fifo",
        place="best_fit",
        admit=("quota",),
        make_room=("reclaim",),
        blocking="backfill",
        settings=Settings(min_run_s=300.0),
    )
    n = node("n", 2)
    borrowed = placed("borrowed", n, [0], queue="b", started_at=0.0, estimate_s=20_000.0)
    waiting = [
        pending("big", 2, queue="other", at=0.0),
        pending("long", 2, queue="a", at=1.0, estimate_s=100_000.0),
        pending("short", 2, queue="a", at=2.0, estimate_s=600.0),
    ]
    queues = (QueueSpec("a", guarantee=Resources(gpus=2)),)
    snap = snapshot([n], waiting, [borrowed], queues=queues)
    plan = build("fifo-backfill-reclaim", spec).plan(snap, NOW)
    assert_valid(snap, plan)
    assert preempted(plan) == {"borrowed"}
    assert plan.waiting["short"].code == "preempting"
