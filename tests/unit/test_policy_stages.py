"""Admit, place, make-room and reservation plugins, through whole plans of a profile."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import build, framework, profile
from schedd.policy.actions import Launch, Preempt, Reserve, SetKind, Suspend
from schedd.policy.gittins import ServiceHistory
from schedd.policy.make_room.victims import hold_room, leaving_jobs
from schedd.policy.placement import Placement
from schedd.policy.profiles import BUILTIN, stages
from schedd.policy.queues import QueueSpec
from schedd.policy.reservation import reservation_for
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    GUARANTEED,
    OPPORTUNISTIC,
    Gpu,
    Node,
    PlacedJob,
    Request,
    Shard,
    Usage,
)
from schedd.policy.view import View
from tests.unit.policy_harness import (
    HEAVY_TAIL,
    converted,
    launches,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)

# ---- admit ------------------------------------------------------------------


def test_a_queue_at_its_max_waits_with_the_queue_named() -> None:
    n = node("a", 8)
    queues = (QueueSpec("a", max=Resources(gpus=3)),)
    snap = snapshot(
        [n],
        [pending("j1", 2, queue="a"), pending("j2", 1, queue="a")],
        [placed("r", n, [0, 1], queue="a")],
        queues=queues,
    )
    plan = run("drf", snap)
    assert plan.waiting["j1"].code == "queue_max"
    assert plan.waiting["j1"].reason == "queue a would exceed its max: 4 GPUs > 3"
    assert set(launches(plan)) == {"j2"}  # one more GPU is within the max


def test_a_parent_queue_max_bounds_its_children_together() -> None:
    n = node("a", 8)
    queues = (QueueSpec("org", max=Resources(gpus=2)),)
    snap = snapshot(
        [n],
        [pending("j1", 1, queue="org/b")],
        [placed("r", n, [0, 1], queue="org/a")],
        queues=queues,
    )
    plan = run("capacity", snap)
    assert plan.waiting["j1"].code == "queue_max"
    assert "queue org " in plan.waiting["j1"].reason


@pytest.mark.parametrize("profile", ["drf", "capacity", "default"])
def test_a_queues_gpu_memory_max_bounds_the_gpu_memory_its_jobs_ask(profile: str) -> None:
    """Queue a may ask 100,000 MiB of GPU memory, 40,000 of it held: `big` (2 GPUs of
    40,000) would take it to 120,000; `one` (1 of 40,000) fits; `plain` asks none and
    counts none."""
    n = node("n", 8)
    queues = (QueueSpec("a", max=Resources(gpus=1 << 40, gpu_memory_mib=100_000)),)
    held = [placed("r", n, [0], gpu_memory_mib=40_000, queue="a")]
    waiting = [
        pending("big", 2, gpu_memory_mib=40_000, queue="a"),
        pending("one", 1, gpu_memory_mib=40_000, at=1.0, queue="a"),
        pending("plain", 4, at=2.0, queue="a"),
    ]
    plan = run(profile, snapshot([n], waiting, held, queues=queues))
    assert plan.waiting["big"].code == "queue_max"
    assert plan.waiting["big"].reason == (
        "queue a would exceed its max: 120000 MiB of GPU memory > 100000 MiB"
    )
    assert set(launches(plan)) == {"one", "plain"}


def test_a_queue_over_its_gpu_memory_max_holds_back_only_jobs_that_ask_for_some() -> None:
    """Queue a holds 120,000 MiB against a max of 100,000 (lowered since, say): a job
    asking GPU memory waits; one that asks none adds none, and starts."""
    n = node("n", 8)
    queues = (QueueSpec("a", max=Resources(gpus=1 << 40, gpu_memory_mib=100_000)),)
    held = [placed("r", n, [0, 1, 2], gpu_memory_mib=40_000, queue="a")]
    waiting = [pending("asks", 1, gpu_memory_mib=1_000, queue="a"), pending("plain", 1, queue="a")]
    plan = run("drf", snapshot([n], waiting, held, queues=queues))
    assert plan.waiting["asks"].code == "queue_max" and set(launches(plan)) == {"plain"}


def test_a_quota_in_gpus_alone_does_not_limit_cpus() -> None:
    queues = (QueueSpec("a", max=Resources(gpus=8)),)
    plan = run(
        "drf", snapshot([node("a", 8)], [pending("j1", 1, cpus=16, queue="a")], queues=queues)
    )
    assert set(launches(plan)) == {"j1"}


def test_the_per_user_limit_is_a_factor_of_the_guarantee() -> None:
    n = node("a", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=4), user_limit_factor=0.5),)
    snap = snapshot(
        [n],
        [pending("bob2", 1, queue="a", user="bob"), pending("carol1", 1, queue="a", user="carol")],
        [placed("bob1", n, [0, 1], queue="a", user="bob")],
        queues=queues,
    )
    plan = run("drf", snap)
    assert plan.waiting["bob2"].code == "user_limit"
    assert (
        plan.waiting["bob2"].reason
        == "user bob would hold 3 GPUs in queue a; the per-user limit is 2"
    )
    assert set(launches(plan)) == {"carol1"}


# ---- place ------------------------------------------------------------------


def test_topology_prefers_a_node_running_jobs_of_the_same_size() -> None:
    a, b = node("a", 8), node("b", 8)
    snap = snapshot(
        [a, b],
        [pending("j", 2)],
        [placed("x", a, [0, 1, 2, 3]), placed("y", b, [0, 1]), placed("z", b, [2, 3])],
    )
    plan = run("default", snap)
    assert launches(plan)["j"].shards[0].node_id == "b"


def test_a_gang_larger_than_a_node_spans_nodes_of_one_rack_when_it_can() -> None:
    nodes = [
        node("n1", 4, rack="r1"),
        node("n2", 4, rack="r2"),
        node("n3", 4, rack="r2"),
        node("n4", 4, rack="r1"),
    ]
    snap = snapshot(nodes, [pending("gang", 8)], [placed("x", nodes[3], [0])], multi_node=True)
    plan = run("default", snap)
    assert {s.node_id for s in launches(plan)["gang"].shards} == {"n2", "n3"}


def test_a_gang_starts_whole_or_not_at_all() -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    snap = snapshot(nodes, [pending("gang", 8)], [placed("x", nodes[0], [0])], multi_node=True)
    plan = run("fifo", snap)
    assert not launches(plan)
    assert plan.waiting["gang"].code == "no_capacity"
    # Its wait says why in a gang's words, not a single node's.
    reason = plan.waiting["gang"].reason
    assert reason.startswith("gang incomplete: it starts on all 8 GPUs at once, and 7 are free")


@pytest.mark.parametrize("profile", ["fifo", "default", "chronus", "liquid", "tiresias"])
@pytest.mark.parametrize(
    ("cpus", "busy", "taken"),
    [(28, False, {"n1": 2, "n2": 1, "n3": 1}), (28, True, "no_capacity"), (36, False, "too_large")],
    ids=["n1-carries-2", "n3-short-now", "never"],
)
def test_a_gang_takes_on_each_node_no_more_gpus_than_its_cpus_carry(
    profile: str, cpus: int, busy: bool, taken: dict[str, int] | str
) -> None:
    """A gang's CPUs are split over its nodes by their GPUs: 4 GPUs and 28 CPUs are 7
    per GPU, and n1 (3 GPUs, 20 CPUs) carries 2 of them, not 3 (21 CPUs). With a job
    on n3 holding 4 of its 10 CPUs, n3 carries none now (6 left): 3 of 4, it waits.
    At 9 CPUs per GPU the nodes could only ever carry 3 of its GPUs (n1 2, n3 1): it
    never fits."""
    nodes = [node("n1", 3, cpus=20), node("n2", 1, cpus=8), node("n3", 2, cpus=10)]
    held = [placed("x", nodes[2], [1], 4)] if busy else []
    plan = run(profile, snapshot(nodes, [pending("gang", 4, cpus)], held, multi_node=True))
    if isinstance(taken, str):
        assert plan.waiting["gang"].code == taken
    else:
        shards = launches(plan)["gang"].shards
        assert {s.node_id: len(s.gpu_uuids) for s in shards} == taken
    if taken == "too_large":
        assert (
            "split by GPU, the nodes could only ever run 3 of them" in plan.waiting["gang"].reason
        )


@pytest.mark.parametrize("profile", ["fifo", "default", "chronus", "liquid"])
def test_a_gang_runs_only_on_gpus_with_the_memory_it_asks(profile: str) -> None:
    """8 GPUs of 40,000 MiB each: B's GPUs (16 GiB), as free as the others, are not."""
    nodes = [node("A", 4), node("B", 4, gpu_memory_mib=16_384), node("C", 4)]
    gang = pending("g", 8, gpu_memory_mib=40_000)
    plan = run(profile, snapshot(nodes, [gang], multi_node=True))
    assert {s.node_id for s in launches(plan)["g"].shards} == {"A", "C"}
    # Without C, only 4 GPUs could ever take it: it never fits.
    plan = run(profile, snapshot(nodes[:2], [gang], multi_node=True))
    assert plan.waiting["g"].code == "too_large"
    assert "GPUs of 40000 MiB" in plan.waiting["g"].reason


@pytest.mark.parametrize("profile", ["fifo", "default", "gandiva", "tiresias"])
@pytest.mark.parametrize("multi_node", [True, False])
def test_an_elastic_job_too_large_whole_starts_smaller(profile: str, multi_node: bool) -> None:
    """8 GPUs and 80 CPUs (10 per GPU) never fit whole: B's 10 CPUs carry one GPU of
    it, A's 100 four (or no node has 8 GPUs, where the shell runs no gangs). Elastic
    down to 4, it starts on A's 4; rigid, it waits as too large."""
    nodes = [node("A", 4, cpus=100), node("B", 4, cpus=10)]
    rigid = pending("e", 8, 80)
    elastic = dataclasses.replace(rigid, gpu_range=(4, 8))
    plan = run(profile, snapshot(nodes, [elastic], multi_node=multi_node))
    assert [(s.node_id, len(s.gpu_uuids)) for s in launches(plan)["e"].shards] == [("A", 4)]
    plan = run(profile, snapshot(nodes, [rigid], multi_node=multi_node))
    assert plan.waiting["e"].code == "too_large"


@pytest.mark.parametrize("profile", ["fifo", "default"])
def test_opportunistic_jobs_too_large_whole_wait_so_elastic_or_not(profile: str) -> None:
    """An opportunistic job runs at its whole count: 8 GPUs of 40,000 MiB, where only 4
    are that large, is too large, for a rigid job and for an elastic one before it."""
    big, small = 81_920, 16_384
    gpus = tuple(Gpu(f"A-g{i}", i, "A100", big if i < 4 else small) for i in range(8))
    a = Node("A", gpus, 64, 512_000, {})
    rigid = pending("r", 8, gpu_memory_mib=40_000, kind=OPPORTUNISTIC, at=1.0)
    elastic = dataclasses.replace(rigid, job_id="e", submitted_at=0.0, gpu_range=(4, 8))
    plan = run(profile, snapshot([a], [elastic, rigid]))
    assert plan.waiting["e"].code == plan.waiting["r"].code == "too_large"


def test_an_elastic_job_never_runnable_whole_reserves_where_it_can_run() -> None:
    """e (8 GPUs, 80 CPUs, elastic down to 4) can only ever run as 4 on A, busy until
    1,000 s: it holds A for then, not B (whose 10 CPUs could never carry it), and s
    starts on B."""
    a, b = node("A", 4, cpus=100), node("B", 4, cpus=10)
    busy = placed("x", a, [0, 1, 2, 3], 1, started_at=0.0, estimate_s=1000.0)
    e = dataclasses.replace(pending("e", 8, 80), gpu_range=(4, 8))
    s = pending("s", 1, 1, at=1.0, estimate_s=1e6)
    snap = snapshot([a, b], [e, s], [busy], multi_node=True)
    plan = run("backfill", snap, 100.0, reserve_after_s=0.0)
    reserve = next(x for x in plan.actions if isinstance(x, Reserve))
    assert (reserve.job_id, reserve.node_ids, reserve.expected_start) == ("e", ("A",), 1000.0)
    assert [sh.node_id for sh in launches(plan)["s"].shards] == ["B"]


def test_a_gang_spans_nodes_only_where_the_shell_can_run_it() -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    plan = run("fifo", snapshot(nodes, [pending("gang", 8)]))
    assert plan.waiting["gang"].code == "too_large"
    plan = run("fifo", snapshot(nodes, [pending("gang", 8)], multi_node=True))
    assert len(launches(plan)["gang"].shards) == 2
    plan = run("fifo", snapshot(nodes, [pending("gang", 9)], multi_node=True))
    assert plan.waiting["gang"].reason == "asks for 9 GPUs; the cluster has 8"


@pytest.mark.parametrize("profile", ["fifo", "default"])
def test_a_job_a_node_away_could_hold_waits_for_it_rather_than_span_nodes(profile: str) -> None:
    """Only 4-GPU nodes are connected (an 8-GPU one is restarting): an 8-GPU job meant
    for one node is not split over two of them; one larger than every node still is."""
    nodes = [node("n1", 4), node("n2", 4), node("n3", 4)]
    snap = dataclasses.replace(
        snapshot(nodes, [pending("one", 8), pending("gang", 12)], multi_node=True),
        largest_node_gpus=8,
    )
    plan = run(profile, snap)
    assert set(launches(plan)) == {"gang"}
    assert plan.waiting["one"].code == "node_away"
    assert plan.waiting["one"].reason == (
        "asks for 8 GPUs: the largest connected node has 4, and it waits for a node of 8"
        " that is away or drained rather than run across nodes"
    )
    # Without a node that large about, it runs across nodes.
    plan = run(profile, snapshot(nodes, [pending("one", 8)], multi_node=True))
    assert len(launches(plan)["one"].shards) == 2


# ---- make room ----------------------------------------------------------------

QUEUES = (
    QueueSpec("a", guarantee=Resources(gpus=4)),
    QueueSpec("b", guarantee=Resources(gpus=4)),
)


def test_a_queue_within_its_guarantee_reclaims_borrowed_gpus_losing_the_least_work() -> None:
    n = node("n", 8)
    borrowed = [placed(f"b{i}", n, [i], queue="b", started_at=100.0 * i) for i in range(8)]
    snap = snapshot([n], [pending("a1", 2, queue="a")], borrowed, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0)
    # b7 and b6 started last: they lose the least work.
    assert preempted(plan) == {"b7", "b6"}
    assert plan.waiting["a1"].code == "preempting"
    reason = next(a.reason for a in plan.actions if getattr(a, "job_id", "") == "b7")
    assert reason == "preempted: queue a reclaims its guarantee for job a1"


def test_reclaim_never_takes_a_queue_below_its_own_guarantee() -> None:
    n = node("n", 8)
    held = [placed(f"b{i}", n, [i], queue="b") for i in range(5)] + [
        placed("a0", n, [5, 6, 7], queue="a")
    ]
    snap = snapshot([n], [pending("a1", 2, queue="a")], held, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0)
    # b borrows 1 GPU; a needs 2 and a is at 3 of 4 + 2 = 5 > 4: over its guarantee, no reclaim.
    assert not preempted(plan)
    snap = snapshot([n], [pending("a1", 1, queue="a")], held, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0)
    assert preempted(plan) == {"b4"} or len(preempted(plan)) == 1


def test_each_lending_queue_gives_back_only_what_it_borrowed_in_the_order_of_work_lost() -> None:
    """Victims come from b and c interleaved by work lost; b borrowed one GPU, so its
    later jobs are passed over while c, which borrowed four, gives what a1 still needs."""
    n = node("n", 12)
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=6)),
        QueueSpec("b", guarantee=Resources(gpus=4)),
        QueueSpec("c", guarantee=Resources(gpus=2)),
    )
    b = [
        placed(f"b{t}", n, [i], queue="b", started_at=t)
        for i, t in enumerate((800, 600, 400, 200, 150))
    ]
    c = [
        placed(f"c{t}", n, [5 + i], queue="c", started_at=t)
        for i, t in enumerate((900, 700, 500, 300, 100, 50))
    ]
    snap = snapshot([n], [pending("a1", 5, queue="a")], b + c, queues=queues)
    # One GPU free; four more from [c900, b800, c700, c500, c300] (b600 would take b
    # below its guarantee).
    assert preempted(run("drf", snap, now=10_000.0)) == {"c900", "b800", "c700", "c500"}


# org is guaranteed 8 GPUs; its team org/a nothing of its own (valid: the teams'
# guarantees together are within their org's); y none at all.
NESTED = (
    QueueSpec("org", guarantee=Resources(gpus=8)),
    QueueSpec("org/a"),
    QueueSpec("org/b", guarantee=Resources(gpus=4)),
    QueueSpec("x", guarantee=Resources(gpus=8)),
    QueueSpec("y"),
)


@pytest.mark.parametrize("profile", ["drf", "capacity", "default"])
def test_reclaim_never_takes_an_org_below_its_guarantee_through_a_team(profile: str) -> None:
    """org/a holds 8 GPUs, all its org is guaranteed, and y borrows 8: x reclaims from y,
    though org/a's job, with no guarantee of its own, started later."""
    n1, n2 = node("n1"), node("n2")
    held = [
        placed("org-job", n1, list(range(8)), queue="org/a", started_at=5_000.0),
        placed("y-job", n2, list(range(8)), queue="y", started_at=0.0),
    ]
    snap = snapshot([n1, n2], [pending("x-job", 8, queue="x")], held, queues=NESTED)
    assert preempted(run(profile, snap, now=10_000.0)) == {"y-job"}


@pytest.mark.parametrize("profile", ["drf", "default"])
def test_a_team_reclaims_its_orgs_guarantee(profile: str) -> None:
    """org holds nothing and y the whole cluster: a job of org/a, whose team has no
    guarantee of its own, reclaims for org."""
    n1, n2 = node("n1"), node("n2")
    held = [
        placed("y1", n1, list(range(8)), queue="y", started_at=0.0),
        placed("y2", n2, list(range(8)), queue="y", started_at=100.0),
    ]
    snap = snapshot([n1, n2], [pending("a-job", 8, queue="org/a")], held, queues=NESTED)
    plan = run(profile, snap, now=10_000.0)
    assert preempted(plan) == {"y2"}
    reason = next(a.reason for a in plan.actions if getattr(a, "job_id", "") == "y2")
    assert reason == "preempted: queue org reclaims its guarantee for job a-job"


def test_a_team_reclaims_from_its_sibling_only_what_the_sibling_borrowed() -> None:
    """org/b is guaranteed 4 and holds 8 of its org's, org/a none of them: org/a's job
    has no guarantee of its own and its org holds all of its guarantee, so nothing is
    reclaimed. org/b's second job, holding 8 in all, reclaims nothing from org/a either."""
    n1, n2 = node("n1"), node("n2")
    held = [
        placed("b1", n1, [0, 1, 2, 3], queue="org/b", started_at=0.0),
        placed("b2", n1, [4, 5, 6, 7], queue="org/b", started_at=100.0),
        placed("y-job", n2, list(range(8)), queue="y", started_at=0.0),
    ]
    snap = snapshot([n1, n2], [pending("a-job", 4, queue="org/a")], held, queues=NESTED)
    assert not preempted(run("drf", snap, now=10_000.0))


def test_a_team_within_its_guarantee_takes_back_what_its_sibling_borrowed() -> None:
    """org/c is guaranteed 4 and holds none; org/b (guaranteed 4) holds 8: org/c takes
    back the 4 org/b borrowed inside their org (the org's total unchanged), not y's job,
    which has run longer (least work lost first)."""
    queues = (
        QueueSpec("org", guarantee=Resources(gpus=8)),
        QueueSpec("org/b", guarantee=Resources(gpus=4)),
        QueueSpec("org/c", guarantee=Resources(gpus=4)),
        QueueSpec("y"),
    )
    n1, n2 = node("n1"), node("n2")
    held = [
        placed("b1", n1, [0, 1, 2, 3], queue="org/b", started_at=0.0),
        placed("b2", n1, [4, 5, 6, 7], queue="org/b", started_at=200.0),
        placed("y-job", n2, list(range(8)), queue="y", started_at=100.0),
    ]
    snap = snapshot([n1, n2], [pending("c-job", 4, queue="org/c")], held, queues=queues)
    assert preempted(run("drf", snap, now=10_000.0)) == {"b2"}


@pytest.mark.parametrize(("b_cpus", "victims"), [(64.0, 0), (32.0, 2), (0.0, 2)])
def test_reclaim_takes_no_queue_below_its_guarantee_of_cpus(b_cpus: float, victims: int) -> None:
    """b borrows 2 GPUs beyond its guarantee of 2, on jobs of 16 CPUs each: a takes them
    back only where b keeps its guarantee of CPUs (64: none may go; 32: two may; none
    set: GPUs alone count)."""
    n = node("n", 4, cpus=128)
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=4)),
        QueueSpec("b", guarantee=Resources(gpus=2, cpus=b_cpus)),
    )
    held = [placed(f"b{i}", n, [i], cpus=16, queue="b", started_at=100.0 * i) for i in range(4)]
    snap = snapshot([n], [pending("a1", 2, queue="a")], held, queues=queues)
    assert len(preempted(run("drf", snap, now=10_000.0))) == victims


@pytest.mark.parametrize(("a_cpus", "reclaims"), [(8.0, False), (16.0, True), (0.0, True)])
def test_a_queue_reclaims_only_within_its_guarantee_of_cpus(a_cpus: float, reclaims: bool) -> None:
    """a is guaranteed 4 GPUs, and maybe CPUs: its job of 2 GPUs and 16 CPUs reclaims
    only if a stays within that guarantee of CPUs with it."""
    n = node("n", 4, cpus=128)
    queues = (QueueSpec("a", guarantee=Resources(gpus=4, cpus=a_cpus)), QueueSpec("b"))
    held = [placed(f"b{i}", n, [i], queue="b", started_at=100.0 * i) for i in range(4)]
    snap = snapshot([n], [pending("a1", 2, cpus=16, queue="a")], held, queues=queues)
    assert bool(preempted(run("drf", snap, now=10_000.0))) == reclaims


def test_young_jobs_are_protected_from_preemption() -> None:
    n = node("n", 6)
    held = [placed(f"b{i}", n, [i], queue="b", started_at=9_900.0) for i in range(6)]
    snap = snapshot([n], [pending("a1", 1, queue="a")], held, queues=QUEUES)
    assert not preempted(run("drf", snap, now=10_000.0, min_run_s=300.0))
    assert len(preempted(run("drf", snap, now=10_000.0, min_run_s=60.0))) == 1


@pytest.mark.parametrize("name", ["tiresias", "default", "default-deadlines"])
def test_a_job_of_more_service_is_no_victim_while_young(name: str) -> None:
    """2D-LAS, Gittins and deadline preemption take victims by rank, and none that ran
    less than `min_run_s`; an opportunistic job is none either (it holds no GPU of its
    own: a guaranteed job takes the GPU beside it)."""
    n = node("n", 1)
    held = [placed("old", n, [0], started_at=9_900.0, attained_s=500_000.0)]
    snap = snapshot([n], [pending("new", 1, at=9_950.0)], held)
    assert not preempted(run(name, snap, now=10_000.0, min_run_s=300.0))
    assert preempted(run(name, snap, now=10_000.0, min_run_s=60.0)) == {"old"}
    shared = [placed("old", n, [0], started_at=0.0, attained_s=500_000.0, kind=OPPORTUNISTIC)]
    plan = run(name, snapshot([n], [pending("new", 1, at=9_950.0)], shared), now=10_000.0)
    assert not preempted(plan) and "new" in launches(plan)  # its GPU is free to take


@pytest.mark.parametrize("name", ["tiresias", "default", "default-deadlines"])
def test_two_waiting_jobs_never_take_one_victim(name: str) -> None:
    """The second newcomer must not count on the runner the first one is stopping:
    each takes a victim of its own."""
    n = node("n", 2)
    held = [
        placed("old", n, [0], started_at=0.0, attained_s=500_000.0),
        placed("older", n, [1], started_at=0.0, attained_s=900_000.0),
    ]
    waiting = [pending("new", 1, at=9_950.0), pending("newer", 1, at=9_960.0)]
    plan = run(name, snapshot([n], waiting, held), now=10_000.0, min_run_s=60.0)
    assert preempted(plan) == {"old", "older"}
    named = {j: plan.waiting[j].reason.rsplit(": ", 1)[1] for j in ("new", "newer")}
    assert sorted(named.values()) == ["old", "older"]


def test_a_plan_waiting_on_young_victims_says_when_they_come_of_age() -> None:
    n = node("n", 2)
    held = [
        placed("b0", n, [0], queue="b", started_at=9_900.0),
        placed("b1", n, [1], queue="b", started_at=9_800.0),
    ]
    snap = snapshot([n], [pending("a1", 1, queue="a")], held, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0, min_run_s=300.0)
    assert not preempted(plan) and plan.recheck_at == 10_100.0  # b1, 300 s after 9,800
    # Nothing waiting: nothing to look at again.
    assert run("drf", snapshot([n], [], held, queues=QUEUES), now=10_000.0).recheck_at is None
    # fifo has no make-room stage, so time alone never changes its answer.
    assert run("fifo", snap, now=10_000.0).recheck_at is None


def test_young_jobs_coming_of_age_matter_only_to_a_queue_below_its_guarantee() -> None:
    """Queue a waits holding its whole guarantee: it reclaims nothing, whenever b's
    young jobs come of age. One GPU less and it takes back the one b borrowed once
    they have (a queue below its guarantee with nothing waiting counts for nothing)."""
    n = node("n", 8)
    full = [placed(f"a{i}", n, [i], queue="a") for i in range(4)]
    full += [placed(f"b{i}", n, [4 + i], queue="b", started_at=9_900.0) for i in range(4)]
    snap = snapshot([n], [pending("a5", 1, queue="a")], full, queues=QUEUES)
    assert run("drf", snap, now=10_000.0, min_run_s=300.0).recheck_at is None
    borrowed = [*full[:3], placed("b4", n, [3], queue="b", started_at=9_900.0), *full[4:]]
    snap = snapshot([n], [pending("a5", 1, queue="a")], borrowed, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0, min_run_s=300.0)
    assert not preempted(plan) and plan.recheck_at == 10_200.0
    assert preempted(run("drf", snap, now=10_200.0, min_run_s=300.0))


def test_a_job_the_plan_launches_counts_for_its_recheck_time() -> None:
    """The plan that starts `first` leaves `second` waiting behind it: it is looked at
    again when `first` comes of age, or (with no minimum run) drops a service queue,
    though `first` is not placed yet in the snapshot the plan was made from."""
    n = node("n", 1)
    waiting = [pending("first", 1, at=1.0), pending("second", 1, at=2.0)]
    plan = run("tiresias", snapshot([n], waiting), now=10_000.0, min_run_s=300.0)
    assert set(launches(plan)) == {"first"} and set(plan.waiting) == {"second"}
    assert plan.recheck_at == 10_300.0
    plan = run("tiresias", snapshot([n], waiting), now=10_000.0, min_run_s=0.0)
    assert plan.recheck_at == 13_200.0  # 1 GPU from 0 to the 3,200 GPU-s threshold


def test_tiresias_looks_again_when_a_running_job_drops_a_service_queue() -> None:
    n = node("n", 2)
    # 2 GPUs at 3,000 GPU-s: it crosses the 3,200 GPU-s threshold 100 s from now.
    held = [placed("wide", n, [0, 1], attained_s=3_000.0, started_at=0.0)]
    plan = run("tiresias", snapshot([n], [pending("new", 1)], held), now=10_000.0)
    assert not preempted(plan) and plan.recheck_at == 10_100.0
    later = [placed("wide", n, [0, 1], attained_s=3_200.0, started_at=0.0)]
    plan = run("tiresias", snapshot([n], [pending("new", 1)], later), now=10_100.0)
    assert preempted(plan) == {"wide"}


def test_jobs_on_their_way_out_are_not_chosen_again() -> None:
    n = node("n", 3)
    held = [placed("b0", n, [0], queue="b", state="preempting")]
    held += [placed(f"b{i}", n, [i], queue="b") for i in (1, 2)]
    snap = snapshot(
        [n],
        [pending("a1", 2, queue="a")],
        held,
        queues=(QueueSpec("a", guarantee=Resources(gpus=2)),),
    )
    victims = preempted(run("drf", snap, now=10_000.0))
    assert len(victims) == 1 and "b0" not in victims


def test_no_more_victims_while_earlier_ones_are_still_stopping() -> None:
    n = node("n", 8)
    held = [placed(f"b{i}", n, [i], queue="b", started_at=0.0) for i in range(7)]
    held.append(placed("b7", n, [7], queue="b", started_at=0.0, state="preempting"))
    snap = snapshot([n], [pending("a1", 1, queue="a")], held, queues=QUEUES)
    plan = run("drf", snap, now=10_000.0)
    assert not preempted(plan)
    assert plan.waiting["a1"].code == "preempting"
    # A second job needs more than the one GPU on its way: one more victim.
    snap = snapshot([n], [pending("a1", 2, queue="a")], held, queues=QUEUES)
    assert len(preempted(run("drf", snap, now=10_000.0))) == 1


@pytest.mark.parametrize("profile", ["drf", "default", "tiresias"])
def test_the_free_gpus_a_job_waits_on_with_leavers_are_held_for_it(profile: str) -> None:
    """a1 waits for b-leaving (on its way out) to make 4 GPUs of n1 with the 2 free
    there: no later job of the plan takes those 2 (best fit would: n1 is the fullest),
    else the stop would be for nothing and a1 would need more victims once it is done.
    A twin of a1 counts only what is left, and looks for room of its own."""
    n1, n2 = node("n1", 8), node("n2", 8)
    held = [
        placed("b-old", n1, [0, 1, 2, 3], queue="b", started_at=0.0, attained_s=9e5),
        placed("b-leaving", n1, [4, 5], queue="b", started_at=0.0, state="preempting"),
    ]
    # n2 has 3 GPUs free, of young jobs (too young to preempt): no 4 there.
    held += [placed(f"b-young{i}", n2, [i], queue="b", started_at=9_900.0) for i in range(5)]
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=8)),
        QueueSpec("b", guarantee=Resources(gpus=2)),
    )
    if profile == "tiresias":  # one tenant queue: victims by service within it
        held = [dataclasses.replace(j, queue="a") for j in held]
    jobs = [pending("a1", 4, queue="a", at=1.0), pending("a-small", 1, queue="a", at=2.0)]
    plan = run(
        profile, snapshot([n1, n2], jobs, held, queues=queues), now=10_000.0, min_run_s=300.0
    )
    assert plan.waiting["a1"].code == "preempting" and not preempted(plan)
    assert "b-leaving" in plan.waiting["a1"].reason
    assert launches(plan)["a-small"].shards[0].node_id == "n2"
    # A twin behind a1 finds n1's free GPUs held and b-leaving's counted: it makes room
    # of its own (b-old, the one victim old enough) rather than wait on the same GPUs.
    jobs.insert(1, pending("a2", 4, queue="a", at=1.5))
    plan = run(
        profile, snapshot([n1, n2], jobs, held, queues=queues), now=10_000.0, min_run_s=300.0
    )
    assert plan.waiting["a1"].code == "preempting"
    assert preempted(plan) == {"b-old"}


@pytest.mark.parametrize("profile", ["drf", "default", "tiresias"])
def test_the_gpus_of_a_leaver_count_for_one_waiting_job_only(profile: str) -> None:
    """b-leaving (on its way out) frees 2 GPUs: enough for a1, which waits for it. a2,
    behind a1 and as big, no longer counts on them: it makes room of its own (b-old)
    at once, rather than wait on the same stop and preempt only after a1 has started.
    Both are the plan's claimants, for the next plans to serve first."""
    n1 = node("n1", 8)
    held = [
        placed("b-leaving", n1, [0, 1], queue="b", started_at=0.0, state="preempting"),
        placed("b-old", n1, [2, 3], queue="b", started_at=0.0, attained_s=9e5),
    ]
    held += [placed(f"b-young{i}", n1, [i], queue="b", started_at=9_900.0) for i in range(4, 8)]
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=6)),
        QueueSpec("b", guarantee=Resources(gpus=2)),
    )
    if profile == "tiresias":  # one tenant queue: victims by service within it
        held = [dataclasses.replace(j, queue="a") for j in held]
    jobs = [pending("a1", 2, queue="a", at=1.0)]
    snap = snapshot([n1], jobs, held, queues=queues)
    plan = run(profile, snap, now=10_000.0, min_run_s=300.0)
    assert plan.waiting["a1"].code == "preempting" and not preempted(plan)
    assert plan.claimants == {"a1"}
    jobs.append(pending("a2", 2, queue="a", at=2.0))
    snap = snapshot([n1], jobs, held, queues=queues)
    plan = run(profile, snap, now=10_000.0, min_run_s=300.0)
    assert "b-leaving" in plan.waiting["a1"].reason
    assert preempted(plan) == {"b-old"}
    assert plan.waiting["a2"].code == "preempting" and "b-leaving" not in plan.waiting["a2"].reason
    assert plan.claimants == {"a1", "a2"}


@pytest.mark.parametrize("profile", ["drf", "default", "tiresias"])
def test_a_job_gpus_on_their_way_out_are_for_is_served_first(profile: str) -> None:
    """b-leaving was stopped for a1 (a claimant of the last plan): a1, 4 GPUs, counts on
    its 2 and the 2 free beside them. a0 comes first in every order (earlier, as good otherwise) and
    would take the free 2 and leave a1 to preempt again; the plan serves a1 first, so
    a0 waits. Without the claim a0 starts there."""
    n1 = node("n1", 8)
    leaving = placed("b-leaving", n1, [0, 1], queue="b", started_at=0.0, state="preempting")
    # Too young to preempt, though they attained more than a1 (else LAS looks for no
    # victims, nor at leavers, for it).
    young = [
        placed(f"b-young{i}", n1, [i], queue="b", started_at=9_900.0, attained_s=9e5)
        for i in range(4, 8)
    ]
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=6)),
        QueueSpec("b", guarantee=Resources(gpus=2)),
    )
    jobs = [pending("a0", 2, queue="a", at=1.0), pending("a1", 4, queue="a", at=2.0)]
    if profile == "tiresias":
        young = [dataclasses.replace(j, queue="a") for j in young]
        leaving = dataclasses.replace(leaving, queue="a")

    def plan_with(claimants: frozenset[str]) -> framework.Plan:
        snap = snapshot([n1], jobs, [leaving, *young], queues=queues)
        snap = dataclasses.replace(snap, claimants=claimants)
        return run(profile, snap, now=10_000.0, min_run_s=300.0)

    assert "a0" in launches(plan_with(frozenset()))
    plan = plan_with(frozenset({"a1", "gone"}))  # a job no longer pending is passed over
    assert "a0" not in launches(plan) and plan.waiting["a0"].code != "preempting"
    assert plan.waiting["a1"].code == "preempting" and "b-leaving" in plan.waiting["a1"].reason
    assert plan.claimants == {"a1"}


@pytest.mark.parametrize("profile", ["drf", "default", "tiresias"])
@pytest.mark.parametrize("stops", [False, True])
def test_a_claimant_is_held_the_cpus_and_memory_it_counts_on(profile: str, stops: bool) -> None:
    """a1 (4 GPUs, 12 CPUs, 40 GiB) will run on b-leaving's 2 GPUs (on its way out, or
    stopped for a1 in this plan) and 2 of the 3 free: it counts on the 2 CPUs and 8 GiB
    b-leaving frees, and on 10 CPUs and 32 GiB of the 11 and 48 free now, which are held
    for it. a0, after it, would fit on the third free GPU but for that hold: asking 4
    CPUs, or 20 GiB, it waits; asking no more than is left, it starts."""
    gib = 1024
    n1 = node("n1", 8, cpus=16, memory_mib=80 * gib)
    b = placed("b-leaving", n1, [0, 1], 2, 8 * gib, queue="b", started_at=0.0, attained_s=9e5)
    b = b if stops else dataclasses.replace(b, state="preempting")
    young = [
        placed(f"b-young{i}", n1, [i], 1, 8 * gib, queue="b", started_at=9_900.0, attained_s=9e5)
        for i in (5, 6, 7)
    ]
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=6)),
        QueueSpec("b", guarantee=Resources(gpus=0)),
    )
    if profile == "tiresias":  # one tenant queue: victims by service within it
        b, young = (
            dataclasses.replace(b, queue="a"),
            [dataclasses.replace(j, queue="a") for j in young],
        )

    def plan_with(a0_cpus: float, a0_memory: int) -> framework.Plan:
        jobs = [
            pending("a1", 4, 12, 40 * gib, queue="a", at=1.0),
            pending("a0", 1, a0_cpus, a0_memory, queue="a", at=2.0),
        ]
        snap = snapshot([n1], jobs, [b, *young], queues=queues)
        snap = dataclasses.replace(snap, claimants=frozenset({"a1"}))
        return run(profile, snap, now=10_000.0, min_run_s=300.0)

    for too_much in ((4, 8 * gib), (1, 20 * gib)):
        plan = plan_with(*too_much)
        assert plan.waiting["a1"].code == "preempting"
        assert "b-leaving" in plan.waiting["a1"].reason
        assert preempted(plan) == ({"b-leaving"} if stops else set())
        assert "a0" not in launches(plan) and plan.waiting["a0"].code != "preempting"
    assert "a0" in launches(plan_with(1, 16 * gib))  # 11 - 10 CPUs, 48 - 32 GiB are left


@pytest.mark.parametrize("profile", ["drf", "default"])
def test_the_cpus_a_claimant_counts_on_from_a_leaver_are_for_no_later_job(profile: str) -> None:
    """a1 (4 GPUs, 12 CPUs) will run on the 4 free GPUs, whose node has 4 CPUs free: the
    other 8 it counts on come from b-leaving, whose GPUs it does not take. a2, as big,
    would run on b-leaving's GPUs with its 12 CPUs; 4 are left of them: it does not wait
    on b-leaving, and finds no room."""
    n1 = node("n1", 8, cpus=16)
    b = placed("b-leaving", n1, [4, 5, 6, 7], 12, queue="b", state="preempting")
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    jobs = [pending("a1", 4, 12, queue="a", at=1.0), pending("a2", 4, 12, queue="a", at=2.0)]
    snap = dataclasses.replace(
        snapshot([n1], jobs, [b], queues=queues), claimants=frozenset({"a1"})
    )
    plan = run(profile, snap, now=10_000.0, min_run_s=300.0)
    assert plan.waiting["a1"].code == "preempting" and "b-leaving" in plan.waiting["a1"].reason
    assert plan.waiting["a2"].code == "no_capacity" and "CPUs" in plan.waiting["a2"].reason
    assert plan.claimants == {"a1"} and not launches(plan)


@pytest.mark.parametrize("profile", ["drf", "default"])
def test_a_claimant_counts_first_on_its_own_victims_cpus_not_on_a_leavers(profile: str) -> None:
    """J (4 GPUs, 12 CPUs) fits on the 4 free GPUs but for CPUs (4 free): it stops V,
    whose 8 CPUs make up the rest. L, on its way out already, frees 2 GPUs and 4 CPUs
    that J does not need: K (2 GPUs, 4 CPUs) waits on them."""
    n1 = node("n1", 8, cpus=16)
    held = [
        placed("L", n1, [4, 5], 4, queue="b", state="preempting"),
        placed("V", n1, [6, 7], 8, queue="b", started_at=0.0, attained_s=9e5),
    ]
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    jobs = [pending("J", 4, 12, queue="a", at=1.0), pending("K", 2, 4, queue="a", at=2.0)]
    plan = run(profile, snapshot([n1], jobs, held, queues=queues), now=10_000.0, min_run_s=300.0)
    assert preempted(plan) == {"V"} and plan.waiting["J"].code == "preempting"
    assert plan.waiting["K"].code == "preempting" and "L" in plan.waiting["K"].reason
    assert plan.claimants == {"J", "K"}


def test_a_leaver_across_nodes_keeps_what_it_frees_where_the_claimant_takes_none_of_it() -> None:
    """L runs on A and B, 8 CPUs on each. J will run on L's GPUs on A and on free GPUs
    of B: L's CPUs on A go with its GPUs to J; on B, J holds the 8 free CPUs it needs,
    and L's 8 there stay L's to free for a later job."""
    a, b = node("A", 4, cpus=16), node("B", 4, cpus=16)
    gone = placed("L", a, [0, 1], queue="b", state="preempting")
    spread = (Shard("A", ("A-g0", "A-g1")), Shard("B", ("B-g2", "B-g3")))
    gone = dataclasses.replace(gone, shards=spread, request=Request(4, 16.0, 2048))
    young = placed("Y", a, [2, 3], 1, started_at=9_900.0)
    snap = snapshot([a, b], [pending("J", 4, 16)], [gone, young], multi_node=True)
    view = View.build(snap, 10_000.0, Settings())
    room = Placement((Shard("A", ("A-g0", "A-g1")), Shard("B", ("B-g0", "B-g1"))))
    hold_room(snap.pending[0], view, lambda _job, _view: room)
    assert (len(view.capacity["B"].free_gpus), view.capacity["B"].cpus) == (0, 0.0)
    left = [(p.shards, p.request.cpus) for p in leaving_jobs(view)]
    assert left == [((Shard("B", ("B-g2", "B-g3")),), 8.0)]


def _leaver_for_e() -> tuple[list[PlacedJob], tuple[QueueSpec, ...]]:
    """n1: b-leaving on GPUs 0-3, on its way out for E; young jobs (too young to
    preempt, with more service than anyone waiting) on 4-7; all of queue a, E's, which
    has no guarantee: it borrows all it runs."""
    n1 = node("n1", 8)
    held = [placed("b-leaving", n1, [0, 1, 2, 3], queue="b", started_at=0.0, state="preempting")]
    held += [
        placed(f"b-young{i}", n1, [i], queue="b", started_at=9_900.0, attained_s=9e5)
        for i in range(4, 8)
    ]
    held = [dataclasses.replace(j, queue="a") for j in held]  # victims within E's queue
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=0)),
        QueueSpec("b", guarantee=Resources(gpus=0)),
    )
    return held, queues


@pytest.mark.parametrize("profile", ["default-guaranteed", "default", "tiresias"])
def test_an_elastic_claimant_is_served_first_too(profile: str) -> None:
    """E (2 to 4 GPUs) is the claimant of b-leaving. An elastic job that finds no room
    and no guarantee to take back is looked at again once the order is through, to
    start smaller on what is left; a claimant is not put off so: K, ahead in the
    order, would take the GPUs first."""
    held, queues = _leaver_for_e()
    e = dataclasses.replace(pending("E", 4, queue="a", at=2.0), gpu_range=(2, 4))
    jobs = [pending("K", 4, queue="a", at=1.0), e]
    snap = dataclasses.replace(
        snapshot([node("n1", 8)], jobs, held, queues=queues), claimants=frozenset({"E"})
    )
    plan = run(profile, snap, now=10_000.0, min_run_s=300.0)
    assert plan.waiting["E"].code == "preempting" and "b-leaving" in plan.waiting["E"].reason
    assert "b-leaving" not in plan.waiting["K"].reason and not preempted(plan)
    assert plan.claimants == {"E"}


def test_an_elastic_claimant_still_takes_turns_before_it_preempts() -> None:
    """Under time-slicing an elastic job that finds no room takes turns with old jobs
    of its queue before anything is preempted for it; served first as a claimant, it
    still does."""
    n1 = node("n1", 8)
    held = [
        placed(job_id, n1, gpus, queue="a", started_at=0.0, attained_s=9e5)
        for job_id, gpus in (("X", [0, 1, 2, 3]), ("Y", [4, 5, 6, 7]))
    ]
    e = dataclasses.replace(pending("E", 4, queue="a", at=2.0), gpu_range=(2, 4))
    for claimants in (frozenset(), frozenset({"E"})):
        snap = dataclasses.replace(snapshot([n1], [e], held), claimants=claimants)
        plan = run("default-gandiva", snap, now=10_000.0, min_run_s=300.0)
        assert not preempted(plan), claimants
        assert [a.job_id for a in plan.actions if isinstance(a, Suspend)], claimants
        assert "E" in launches(plan)


def test_a_claimant_that_claims_nothing_waits_in_its_place_in_the_order() -> None:
    """Under strict FIFO the first job that cannot start blocks those behind it. C was a
    claimant, but nothing is on its way out for it now (its victim left, and another
    job took the GPUs): served first, it claims nothing, and takes its place in the
    order again, behind H, which starts, rather than blocking H."""
    n = node("n", 2)
    held = [placed("r", n, [0], started_at=9_990.0)]  # too young to preempt
    spec = dataclasses.replace(
        BUILTIN["fifo"], make_room=("reclaim",), settings=Settings(min_run_s=300.0)
    )
    jobs = [pending("H", 1, at=1.0), pending("C", 2, at=2.0)]
    snap = dataclasses.replace(snapshot([n], jobs, held), claimants=frozenset({"C"}))
    plan = build("fifo-reclaim", spec).plan(snap, 10_000.0)
    assert set(launches(plan)) == {"H"}
    assert plan.waiting["C"].code == "no_capacity"
    assert not plan.claimants


@pytest.mark.parametrize("profile", ["drf", "default-guaranteed", "tiresias"])
def test_a_job_that_preempts_keeps_the_free_gpus_it_counted_on(profile: str) -> None:
    """A1 (4 GPUs) stops b-old (2 GPUs) and counts on the 2 free GPUs beside it. A2,
    later in the plan, would start on those 2 (best fit: they leave n1 full, n2 would
    keep one free) and leave A1 to stop another once b-old is gone; they are held for
    A1 instead."""
    n1, n2 = node("n1", 8), node("n2", 4)
    held = [placed("b-old", n1, [0, 1], queue="b", started_at=0.0, attained_s=9e5)]
    held += [
        placed(f"b-young{i}", n1, [i], queue="b", started_at=9_900.0, attained_s=9e5)
        for i in range(4, 8)
    ]
    held.append(placed("c0", n2, [0], queue="b", started_at=9_900.0))
    queues = (
        QueueSpec("a", guarantee=Resources(gpus=8)),
        QueueSpec("b", guarantee=Resources(gpus=0)),
    )
    if profile == "tiresias":
        held = [dataclasses.replace(j, queue="a") for j in held]
    jobs = [pending("A1", 4, queue="a", at=1.0), pending("A2", 2, queue="a", at=2.0)]
    plan = run(
        profile, snapshot([n1, n2], jobs, held, queues=queues), now=10_000.0, min_run_s=300.0
    )
    assert preempted(plan) == {"b-old"}
    assert launches(plan)["A2"].shards[0].node_id == "n2"
    assert plan.claimants == {"A1"}


def test_tiresias_preempts_jobs_that_attained_more_service() -> None:
    n = node("n", 2)
    held = [placed("long", n, [0], attained_s=50_000.0), placed("short", n, [1], attained_s=100.0)]
    plan = run("tiresias", snapshot([n], [pending("new", 1)], held), now=10_000.0)
    assert preempted(plan) == {"long"}
    plan = run(
        "tiresias", snapshot([n], [pending("old", 1, attained_s=60_000.0)], held), now=10_000.0
    )
    assert not preempted(plan)


# ---- reservations and backfill -------------------------------------------------


def test_a_blocked_gang_reserves_and_only_jobs_ending_in_time_backfill() -> None:
    n = node("n", 8)
    busy = placed("busy", n, [0, 1, 2, 3], started_at=0.0, estimate_s=1000.0)  # ends at 1000
    snap = snapshot(
        [n],
        [
            pending("gang", 8, at=1.0),
            pending("long", 1, at=2.0, estimate_s=5000.0),
            pending("short", 1, at=3.0, estimate_s=500.0),
        ],
        [busy],
    )
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    assert set(launches(plan)) == {"short"}  # ends at 600, before the gang's start at 1000
    assert plan.waiting["gang"].code == "reserved"
    assert "long" in plan.waiting and "reserved for job gang" in plan.waiting["long"].reason
    (reserve,) = [a for a in plan.actions if isinstance(a, Reserve)]
    assert (reserve.job_id, reserve.node_ids, reserve.expected_start) == ("gang", ("n",), 1000.0)


def test_a_reservation_waits_for_the_cpus_beside_the_gpus() -> None:
    """On `a` four GPUs free at 1000 s, but the CPUs to run the job there only at
    5000 s; on `b` both at 3000 s: the job is promised `b` at 3000 s."""
    a, b = node("a", 8, cpus=16), node("b", 8, cpus=16)
    held = [
        placed("gpu-heavy", a, [0, 1, 2, 3], 1, started_at=0.0, estimate_s=1000.0),
        placed("cpu-heavy", a, [4], 13, started_at=0.0, estimate_s=5000.0),
        placed("whole", b, list(range(8)), 2, started_at=0.0, estimate_s=3000.0),
    ]
    snap = snapshot([a, b], [pending("job", 4, 8, at=1.0)], held)
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    (reserve,) = [x for x in plan.actions if isinstance(x, Reserve)]
    assert (reserve.node_ids, reserve.expected_start) == (("b",), 3000.0)


def test_a_gang_reservation_counts_only_the_gpus_its_share_of_cpus_can_run_on() -> None:
    """A 16-GPU gang of 32 CPUs takes 2 CPUs per GPU. `a` has 9 GPUs free now. `c`
    frees 7 GPUs at 1000 s but keeps 14 of its 16 CPUs until 6000 s: one GPU's share;
    `d` frees 8 GPUs at 2000 s. Counting GPUs alone it would be `a` and `c` at 1000 s."""
    a, c, d = node("a", 9, cpus=18), node("c", 8, cpus=16), node("d", 8, cpus=16)
    held = [
        placed("c-gpus", c, list(range(7)), 0, started_at=0.0, estimate_s=1000.0),
        placed("c-cpus", c, [7], 14, started_at=0.0, estimate_s=6000.0),
        placed("d-all", d, list(range(8)), 0, started_at=0.0, estimate_s=2000.0),
    ]
    snap = snapshot([a, c, d], [pending("gang", 16, 32, at=1.0)], held, multi_node=True)
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    (reserve,) = [x for x in plan.actions if isinstance(x, Reserve)]
    assert (reserve.node_ids, reserve.expected_start) == (("a", "d"), 2000.0)


def test_a_gang_reservation_counts_only_gpus_with_the_memory_it_asks() -> None:
    """The 16 GiB GPUs that free at 1000 s are no use to a gang asking 40,000 MiB; the
    80 GiB ones that free at 3000 s are."""
    a, b = node("a", 8), node("b", 8)
    small = node("small", 8, gpu_memory_mib=16_384)
    held = [
        placed("small-all", small, list(range(8)), started_at=0.0, estimate_s=1000.0),
        placed("b-all", b, list(range(8)), started_at=0.0, estimate_s=3000.0),
    ]
    gang = pending("gang", 16, gpu_memory_mib=40_000, at=1.0)
    snap = snapshot([a, b, small], [gang], held, multi_node=True)
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    (reserve,) = [x for x in plan.actions if isinstance(x, Reserve)]
    assert (reserve.node_ids, reserve.expected_start) == (("a", "b"), 3000.0)


def test_a_reservation_counts_the_cpus_a_job_on_shared_gpus_gives_back() -> None:
    """An opportunistic job holds 10 of the node's 16 CPUs until 500 s (no GPU of its
    own); the GPUs free at 1000 s: the job is promised the node at 1000 s."""
    n = node("n", 8, cpus=16)
    held = [
        placed("g", n, [0, 1, 2, 3], 4, started_at=0.0, estimate_s=1000.0),
        placed("o", n, [4], 10, started_at=0.0, estimate_s=500.0, kind=OPPORTUNISTIC),
    ]
    snap = snapshot([n], [pending("job", 8, 8, at=1.0)], held)
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    (reserve,) = [x for x in plan.actions if isinstance(x, Reserve)]
    assert (reserve.node_ids, reserve.expected_start) == (("n",), 1000.0)


def test_a_reservation_for_gpu_memory_beside_a_job_on_a_node_away() -> None:
    """A job still placed on a node that is away gives nothing back for the plan."""
    a, away = node("a", 8), node("away", 8)
    held = [
        placed("busy", a, list(range(8)), started_at=0.0, estimate_s=1000.0),
        placed("on-away", away, [0, 1], started_at=0.0, estimate_s=500.0),
    ]
    snap = snapshot([a], [pending("job", 4, gpu_memory_mib=40_000, at=1.0)], held)
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0)
    (reserve,) = [x for x in plan.actions if isinstance(x, Reserve)]
    assert (reserve.node_ids, reserve.expected_start) == (("a",), 1000.0)


def test_a_reservation_waits_until_the_job_has_waited_reserve_after_s() -> None:
    n = node("n", 8)
    busy = placed("busy", n, [0, 1, 2, 3], started_at=0.0, estimate_s=1000.0)
    jobs = [pending("gang", 8, at=1.0), pending("long", 1, at=2.0, estimate_s=5000.0)]
    snap = snapshot([n], jobs, [busy])
    young = run("backfill", snap, now=100.0, reserve_after_s=600.0)
    assert "long" in launches(young) and young.waiting["gang"].code == "no_capacity"
    old = run("backfill", snap, now=601.0, reserve_after_s=600.0)
    assert not launches(old) and old.waiting["gang"].code == "reserved"


def test_a_job_paused_by_the_plan_frees_its_gpus_once_for_a_reservation() -> None:
    """Its GPUs are free in the plan already: not counted again at its expected end."""
    n = node("n", 2)
    paused = placed("paused", n, [0], started_at=0.0, estimate_s=100.0)
    busy = placed("busy", n, [1], started_at=0.0, estimate_s=500.0)
    view = View.build(snapshot([n], [pending("pair", 2)], [paused, busy]), 50.0, Settings())
    view.suspend(paused)
    held = reservation_for(pending("pair", 2), view)
    assert held is not None and held.expected_start == 500.0  # busy's end, not paused's


def test_only_jobs_of_reserve_min_gpus_hold_reservations() -> None:
    n = node("n", 8)
    busy = placed("busy", n, [0, 1, 2, 3, 4, 5, 6], started_at=0.0, estimate_s=1000.0)
    jobs = [pending("two", 2, at=1.0), pending("one", 1, at=2.0, estimate_s=5000.0)]
    snap = snapshot([n], jobs, [busy])
    assert run("backfill", snap, now=100.0, reserve_after_s=0.0).waiting["two"].code == "reserved"
    plan = run("backfill", snap, now=100.0, reserve_after_s=0.0, reserve_min_gpus=4)
    assert "one" in launches(plan) and plan.waiting["two"].code == "no_capacity"


def test_without_reservations_small_jobs_would_starve_the_gang() -> None:
    # The same cluster under a profile that skips instead of reserving starts `long`.
    n = node("n", 8)
    busy = placed("busy", n, [0, 1, 2, 3], started_at=0.0, estimate_s=1000.0)
    snap = snapshot(
        [n], [pending("gang", 8, at=1.0), pending("long", 1, at=2.0, estimate_s=5000.0)], [busy]
    )
    assert "long" in launches(run("sjf", snap, now=100.0))


def test_a_victim_on_a_node_that_is_away_is_no_crash() -> None:
    """A job still counted as placed on a node that has gone is a candidate victim
    like the others, but nothing of it is given back in a trial placement."""
    here, away = node("here", 1), node("away", 1)
    held = [
        placed("old-away", away, [0], attained_s=9_000.0),
        placed("old-here", here, [0], attained_s=8_000.0),
    ]
    snap = snapshot([here], [pending("new", 1)], held)
    plan = profile("tiresias").plan(snap, 10_000.0)
    assert preempted(plan) == {"old-here"}


# ---- twins: a waiting job's wait answers those alike ---------------------------------


def test_a_twin_is_asked_again_once_the_plan_changed_the_view() -> None:
    """j1 finds no room; j2 then starts and takes queue a to its max, so j3 (j1's twin)
    waits for the max, not for room as j1 did."""
    n = node("n", 3)
    queues = (QueueSpec("a", max=Resources(gpus=2)),)
    waiting = [pending("j1", 2, queue="a"), pending("j2", 1, at=1.0, queue="a")]
    waiting.append(pending("j3", 2, at=2.0, queue="a"))
    snap = snapshot([n], waiting, [placed("r", n, [0, 1], queue="b")], queues=queues)
    plan = run("drf", snap)
    assert set(launches(plan)) == {"j2"}
    assert plan.waiting["j1"].code == "no_capacity"
    assert plan.waiting["j3"].code == "queue_max"


def test_a_twin_of_a_better_rank_is_asked_again() -> None:
    """In submission order, a job that attained much service finds no job ranked below
    it to preempt; its twin that has attained none, later, does."""
    n = node("n", 1)
    history = ServiceHistory.of([600.0] * 180 + [500_000.0] * 20)  # heavy-tailed
    held = [placed("runner", n, [0], attained_s=5_000.0, started_at=0.0)]
    waiting = [pending("long", 1, attained_s=600_000.0), pending("fresh", 1, at=1.0)]
    snap = snapshot([n], waiting, held, service_history=history)
    spec = dataclasses.replace(BUILTIN["drf"], make_room=("gittins",))
    plan = build("drf-gittins", spec).plan(snap, 10_000.0)
    assert plan.waiting["long"].code == "no_capacity"
    assert preempted(plan) == {"runner"}
    assert plan.waiting["fresh"].code == "preempting"


def test_a_twin_of_a_worse_level_is_no_victim_search_the_stages_would_make() -> None:
    """A victim search's trial placements leave nodes of equal free GPUs in another
    order. A's twin B, of a worse 2D-LAS level, must not search where A found none (as
    the stages now remember), or C would land elsewhere with twins answered than
    without."""
    spec = dataclasses.replace(
        BUILTIN["tiresias"], settings=Settings(las_thresholds_gpu_s=(3_200.0, 10_000.0, 1e5))
    )
    n1, n2 = node("n1", 8), node("n2", 8)
    held = [
        placed("v1", n1, [0, 1, 2, 3], attained_s=200_000.0),  # level 3
        placed("h1", n1, [4, 5, 6], cpus=62),  # its CPUs leave no room for A
        placed("v2", n2, [0, 1, 2, 3], attained_s=20_000.0),  # level 2
        placed("h2", n2, [4, 5, 6], cpus=62),
    ]
    waiting = [
        pending("A", 4, cpus=8, at=1.0, attained_s=5_000.0),  # level 1
        pending("B", 4, cpus=8, at=2.0, attained_s=50_000.0),  # level 2: A's twin
        pending("C", 1, at=3.0, attained_s=500_000.0),
    ]
    snap = snapshot([n1, n2], waiting, held)
    staged = stages(spec, "tiresias")
    alike = framework.plan(staged, snap, 10_000.0)
    asked = framework.plan(dataclasses.replace(staged, waits_alike=None), snap, 10_000.0)
    assert set(launches(alike)) == {"C"}
    assert alike.actions == asked.actions and alike.waiting == asked.waiting


def test_under_fifo_the_twin_of_a_converted_job_still_blocks_the_jobs_behind_it() -> None:
    """p0, made opportunistic, finds no room as guaranteed and shares; p1, its
    guaranteed twin, waits for room and so holds p2 back in FIFO order (its wait is
    not read from p0's, which blocked nobody)."""
    n = node("n", 1)
    waiting = [
        converted(pending("p0", 1, queue="a")),
        pending("p1", 1, at=1.0, queue="a"),
        pending("p2", 1, at=2.0, queue="a"),
    ]
    plan = run("fifo", snapshot([n], waiting, [placed("r", n, [0], queue="a")]))
    assert plan.waiting["p1"].code == "no_capacity"
    assert plan.waiting["p2"].code == "fifo_order"


def test_a_converted_job_of_another_user_is_answered_as_its_queue_mate_was() -> None:
    """u1's job, made opportunistic, finds no room as guaranteed; u2's, alike but for
    the user, is not tried again (`_WaitsAlike.no_room`) and shares as it would have:
    the plan is the one that asks every stage."""
    n = node("n", 2)
    waiting = [
        converted(pending("a", 2, queue="q", user="u1")),
        converted(pending("b", 2, at=1.0, queue="q", user="u2")),
    ]
    snap = snapshot([n], waiting, [placed("r", n, [0, 1], queue="q", started_at=0.0)])
    staged = stages(BUILTIN["default"], "default")
    alike = framework.plan(staged, snap, 10_000.0)
    asked = framework.plan(dataclasses.replace(staged, waits_alike=None), snap, 10_000.0)
    assert {j for j, w in alike.waiting.items()} | set(launches(alike)) == {"a", "b"}
    assert alike.actions == asked.actions and alike.waiting == asked.waiting


def test_a_converted_job_refused_by_its_users_limit_says_nothing_of_its_queue_mates() -> None:
    """u1's job, made opportunistic, is refused as guaranteed by u1's limit and shares;
    u2's after it (u2 used more of late), alike but for the user, is admitted and takes
    its guarantee back: a refusal is no sign that the queue has no room."""
    n = node("n", 4)
    q = QueueSpec("q", guarantee=Resources(gpus=2), user_limit_factor=1.0)
    held = [placed("r", n, [0, 1], queue="q", user="u1")]
    waiting = [
        converted(pending("a", 1, queue="q", user="u1")),
        converted(pending("b", 1, at=1.0, queue="q", user="u2")),
    ]
    snap = snapshot([n], waiting, held, queues=(q,))
    snap = dataclasses.replace(snap, usage=Usage(users={("q", "u2"): 1e9}))
    plan = run("default", snap, now=10_000.0)
    assert [a.job_id for a in plan.actions if isinstance(a, Launch)] == ["a", "b"]
    assert "opportunistic" in launches(plan)["a"].reason
    assert [(a.job_id, a.kind) for a in plan.actions if isinstance(a, SetKind)] == [
        ("b", GUARANTEED)
    ]
    assert "opportunistic" not in launches(plan)["b"].reason


def test_a_converted_job_counts_the_queues_claimant_before_it_reclaims() -> None:
    """p0, a newcomer of a higher Gittins index, preempts a's runner r2 and will hold its
    GPU: a's guarantee of 2 is then filled (r0 and p0), though r2 has left the count.
    p1 finds no room; p3, made opportunistic and alike to p1, reclaims nothing from b's
    borrowed GPU (before, it did, and a came to hold 3) and shares instead. With a
    guarantee of 3 there is room for one more: p1 takes it back from b."""
    n0, n1 = node("n0", 1), node("n1", 2)
    held = [
        placed("r0", n0, [0], queue="a"),
        placed("r1", n1, [0], queue="b"),
        placed("r2", n1, [1], queue="a", attained_s=700.0),
    ]
    waiting = [
        pending("p0", 1, user="u2", queue="a"),
        pending("p1", 1, at=1.0, user="u1", queue="a", attained_s=700.0),
        converted(pending("p3", 1, at=3.0, user="u2", queue="a", attained_s=700.0)),
    ]
    for guarantee, victims in ((2, {"r2"}), (3, {"r2", "r1"})):
        queues = (QueueSpec("a", guarantee=Resources(gpus=guarantee)),)
        snap = snapshot([n0, n1], waiting, held, queues=queues, service_history=HEAVY_TAIL)
        plan = run("default", snap, now=10_000.0)
        assert preempted(plan) == victims
        assert plan.waiting["p0"].code == "preempting"
        assert "opportunistic" in launches(plan)["p3"].reason
    assert plan.waiting["p1"].code == "preempting"
    reasons = {a.job_id: a.reason for a in plan.actions if isinstance(a, Preempt)}
    assert "queue a reclaims its guarantee for job p1" in reasons["r1"]


@pytest.mark.parametrize("name", ["drf", "default"])
def test_two_jobs_reclaiming_for_one_queue_never_take_one_victim(name: str) -> None:
    """Queue a holds none of its guarantee of 2; b borrows both GPUs: a1 and a2 each
    take back one, a victim of their own."""
    n = node("n", 2)
    queues = (QueueSpec("a", guarantee=Resources(gpus=2)), QueueSpec("b"))
    held = [placed("b0", n, [0], queue="b"), placed("b1", n, [1], queue="b")]
    waiting = [pending("a1", 1, queue="a"), pending("a2", 1, at=1.0, queue="a")]
    plan = run(name, snapshot([n], waiting, held, queues=queues), now=10_000.0)
    assert preempted(plan) == {"b0", "b1"}
    named = {j: plan.waiting[j].reason.rsplit(": ", 1)[1] for j in ("a1", "a2")}
    assert sorted(named.values()) == ["b0", "b1"]
