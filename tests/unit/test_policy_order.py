"""Order plugins: which pending job is considered first, on hand-built snapshots."""

from __future__ import annotations

import pytest

from schedd.policy.order import capacity, drf, fair_las, las, priority, sjf
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PendingJob, Shard, Snapshot, Usage
from schedd.policy.view import View
from tests.unit.policy_harness import node, pending, placed, snapshot


def ordered(plugin: object, snap: Snapshot, **settings: object) -> list[str]:
    view = View.build(snap, 0.0, Settings(**settings))  # type: ignore[arg-type]
    return [j.job_id for j in plugin.order(snap.pending, view)]  # type: ignore[attr-defined]


def jobs(*specs: tuple[str, dict[str, object]]) -> list[PendingJob]:
    return [pending(job_id, at=float(i), **kw) for i, (job_id, kw) in enumerate(specs)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plugin", "specs", "expected"),
    [
        (
            priority,
            [("low", {}), ("high", {"priority": 5}), ("mid", {"priority": 1})],
            ["high", "mid", "low"],
        ),
        (priority, [("a", {}), ("b", {})], ["a", "b"]),  # ties: submission order
        (sjf, [("long", {"estimate_s": 900}), ("short", {"estimate_s": 60})], ["short", "long"]),
        # what is left counts, not the whole run: 1000 s estimated, 950 s done on 1 GPU
        (
            sjf,
            [("fresh", {"estimate_s": 100}), ("nearly", {"estimate_s": 1000, "attained_s": 950})],
            ["nearly", "fresh"],
        ),
        (
            sjf,
            [("unknown", {}), ("known", {"estimate_s": 7200})],
            ["unknown", "known"],
        ),  # default 3600
        (las, [("old", {"attained_s": 5000}), ("new", {})], ["new", "old"]),
        (
            las,
            [("a", {"attained_s": 100}), ("b", {"attained_s": 10})],
            ["a", "b"],
        ),  # one level: FIFO
    ],
)
def test_single_key_orders(
    plugin: object, specs: list[tuple[str, dict[str, object]]], expected: list[str]
) -> None:
    snap = snapshot([node("a")], jobs(*specs))
    assert ordered(plugin, snap, las_thresholds_gpu_s=(3200.0,)) == expected


def test_drf_serves_the_queue_holding_less_first() -> None:
    n = node("a", 8)
    snap = snapshot(
        [n],
        jobs(("a1", {"queue": "a"}), ("b1", {"queue": "b"})),
        [placed("run", n, [0, 1, 2], queue="a")],
    )
    assert ordered(drf, snap) == ["b1", "a1"]


def test_drf_weights_shares() -> None:
    n = node("a", 8)
    queues = (QueueSpec("a", weight=4.0), QueueSpec("b"))
    snap = snapshot(
        [n],
        jobs(("a1", {"queue": "a"}), ("b1", {"queue": "b"})),
        [placed("ra", n, [0, 1], queue="a"), placed("rb", n, [2], queue="b")],
        queues=queues,
    )
    # a holds 2/8 over weight 4 = 0.0625; b holds 1/8 over weight 1 = 0.125
    assert ordered(drf, snap) == ["a1", "b1"]


def test_drf_counts_decayed_history() -> None:
    snap = snapshot([node("a", 8)], jobs(("a1", {"queue": "a"}), ("b1", {"queue": "b"})))
    busy = Snapshot(snap.nodes, (), snap.pending, usage=Usage(queues={"a": 1e6}))
    assert ordered(drf, busy) == ["b1", "a1"]
    assert ordered(drf, busy, history_weight=0.0) == ["a1", "b1"]


def test_drf_compares_users_inside_a_queue_and_queues_level_by_level() -> None:
    n = node("a", 8)
    snap = snapshot(
        [n],
        jobs(
            ("bob1", {"queue": "org/x", "user": "bob"}),
            ("carol1", {"queue": "org/x", "user": "carol"}),
            ("dave1", {"queue": "lab", "user": "dave"}),
        ),
        [
            placed("r1", n, [0], queue="org/x", user="bob"),
            placed("r2", n, [1], queue="org/y", user="erin"),
        ],
    )
    # org holds 2 GPUs, lab none: lab first; inside org/x carol (0) before bob (1).
    assert ordered(drf, snap) == ["dave1", "carol1", "bob1"]


def test_drf_hands_out_progressively_within_one_cycle() -> None:
    # With nothing placed, each start raises its queue's share, so queues alternate.
    snap = snapshot(
        [node("a", 8)],
        jobs(
            *[(f"a{i}", {"queue": "a"}) for i in range(3)],
            *[(f"b{i}", {"queue": "b"}) for i in range(3)],
        ),
    )
    view = View.build(snap, 0.0, Settings())
    gpus = iter(snap.nodes[0].gpus)
    got = []
    for job in drf.order(snap.pending, view):
        got.append(job.job_id)
        view.take(job, (Shard("a", (next(gpus).uuid,)),))
    assert got == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_capacity_serves_the_queue_furthest_below_its_guarantee() -> None:
    n = node("a", 8)
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=4)),
        QueueSpec("b", guarantee=Resources(gpus=2)),
    )
    snap = snapshot(
        [n],
        jobs(("b1", {"queue": "b"}), ("a1", {"queue": "a"}), ("c1", {"queue": "c"})),
        [placed("ra", n, [0, 1], queue="a"), placed("rb", n, [2, 3], queue="b")],
        queues=queues,
    )
    # a at 2/4, b at 2/2, c has no guarantee: last.
    assert ordered(capacity, snap) == ["a1", "b1", "c1"]


def test_fair_las_is_fair_across_queues_and_las_inside_one() -> None:
    n = node("a", 8)
    snap = snapshot(
        [n],
        jobs(
            ("a-old", {"queue": "a", "attained_s": 10_000}),
            ("a-new", {"queue": "a"}),
            ("b-old", {"queue": "b", "attained_s": 10_000}),
        ),
        [placed("ra", n, [0], queue="a")],
    )
    assert ordered(fair_las, snap) == ["b-old", "a-new", "a-old"]
