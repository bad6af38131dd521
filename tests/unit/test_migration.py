"""Migration (Gandiva): running jobs move to make room on one node for a waiting job, or
to bring a job spread over nodes onto one, when the move is worth its cost."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy.actions import Migrate, Plan
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    MIGRATING,
    SUSPENDED,
    Node,
    PlacedJob,
    Request,
    Shard,
    free_capacity,
)
from schedd.policy.view import View
from tests.unit.policy_harness import launches, node, pending, placed, preempted, run, snapshot


def moves(plan: Plan) -> dict[str, Migrate]:
    return {a.job_id: a for a in plan.actions if isinstance(a, Migrate)}


def fragmented() -> tuple[list, list[PlacedJob]]:  # type: ignore[type-arg]
    """Two 4-GPU nodes with one GPU free on each: a 2-GPU job fits neither, and no
    running job of 2 GPUs is there to take turns with."""
    a, b = node("a", 4), node("b", 4)
    running = [
        placed("small", a, [0], estimate_s=50_000.0),
        placed("tail", a, [1], estimate_s=50_000.0),
        placed("tail2", a, [2], estimate_s=50_000.0),
        placed("three", b, [0, 1, 2], estimate_s=50_000.0),
    ]
    return [a, b], running


def test_a_running_job_moves_to_free_one_node_for_a_waiting_job() -> None:
    nodes, running = fragmented()
    plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], running), now=1000.0)
    # Moving the 1-GPU job to b's free GPU leaves a with two: the cheapest move.
    assert set(moves(plan)) == {"small"}
    assert (moves(plan)["small"].node_id, moves(plan)["small"].gpu_uuids) == ("b", ("b-g3",))
    assert "for job wide" in moves(plan)["small"].reason
    # It starts once the job has left; meanwhile it waits, and nobody is preempted.
    assert plan.waiting["wide"].code == "no_capacity"
    assert not preempted(plan) and not launches(plan)


def test_a_job_moves_only_onto_gpus_with_the_memory_it_asks() -> None:
    """b's one free GPU is a 16 GiB one: `small`, which asks 40,000 MiB, may not move
    there, so `tail` moves instead."""
    (a, b), running = fragmented()
    b = dataclasses.replace(
        b, gpus=(*b.gpus[:3], dataclasses.replace(b.gpus[3], memory_mib=16_384))
    )
    asks = dataclasses.replace(running[0].request, gpu_memory_mib=40_000)
    running[0] = dataclasses.replace(running[0], request=asks)
    plan = run("gandiva", snapshot([a, b], [pending("wide", 2)], running), now=1000.0)
    assert set(moves(plan)) == {"tail"} and moves(plan)["tail"].gpu_uuids == ("b-g3",)


def test_no_move_when_the_wait_is_shorter_than_the_moves_cost() -> None:
    nodes, running = fragmented()
    ending = [
        dataclasses.replace(j, estimate_s=1030.0) if "tail" in j.job_id else j for j in running
    ]
    plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], ending), now=1000.0)
    assert moves(plan) == {}  # two GPUs free on a in 30 s: not worth 60 s of a GPU
    plan = run(
        "gandiva", snapshot(nodes, [pending("wide", 2)], ending), now=1000.0, migrate_cost_s=10.0
    )
    assert set(moves(plan)) == {"small"}


def test_no_move_when_the_cluster_lacks_the_gpus_or_no_job_may_move() -> None:
    nodes, running = fragmented()
    plan = run("gandiva", snapshot(nodes, [pending("wider", 3)], running), now=1000.0)
    assert moves(plan) == {}  # 2 free in all: moving cannot give it 3
    # Jobs that started or moved less than min_run_s ago stay where they are.
    young = [dataclasses.replace(j, state_since=900.0) for j in running]
    plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], young), now=1000.0)
    assert moves(plan) == {}
    # Nor does a job that cannot save a checkpoint (live: no shim), or that its user
    # paused (it reaches no step boundary to save one at).
    for field in ({"checkpointable": False}, {"paused": True}):
        stuck = [dataclasses.replace(j, **field) for j in running]  # type: ignore[arg-type]
        plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], stuck), now=1000.0)
        assert moves(plan) == {}
    # A job taking turns with a suspended one stays too (its partner would be stranded).
    a = nodes[0]
    partner = dataclasses.replace(placed("partner", a, [0]), state=SUSPENDED, state_since=0.0)
    plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], [*running, partner]), now=1000.0)
    assert "small" not in moves(plan)


def test_jobs_moved_together_never_count_on_the_same_cpus() -> None:
    """To free A for w, m1 and m2 (6 CPUs each) could each go to B's 2 free GPUs, but
    B has 9 CPUs free: not both. x, moved off B to A instead, frees B for w."""
    a, b = node("A", 4, cpus=64), node("B", 4, cpus=10)
    held = [
        placed("m1", a, [0], 6, started_at=0.0, estimate_s=1e6),
        placed("m2", a, [1], 6, started_at=0.0, estimate_s=1e6),
        placed("x", b, [0, 1], 1, started_at=0.0, estimate_s=1e6),
    ]
    plan = run("gandiva", snapshot([a, b], [pending("w", 4, 1, estimate_s=1e6)], held), 10_000.0)
    assert set(moves(plan)) == {"x"} and moves(plan)["x"].node_id == "A"


def test_two_waiting_jobs_never_count_on_the_same_gpus() -> None:
    a, b, c = node("a", 4), node("b", 4), node("c", 4)
    running = [
        placed(f"{n.node_id}{i}", n, [i], estimate_s=50_000.0) for n in (a, b) for i in (0, 1, 2)
    ]
    running.append(placed("c-three", c, [0, 1, 2], estimate_s=50_000.0))
    snap = snapshot([a, b, c], [pending("w1", 2), pending("w2", 2)], running)
    plan = run("gandiva", snap, now=1000.0)
    # w1: a job of a moves to b's free GPU. w2 may not count on a (freed for w1), nor on
    # b's GPU (a's mover has it); c's free GPU alone cannot help it.
    assert [(m.node_id, m.gpu_uuids) for m in moves(plan).values()] == [("b", ("b-g3",))]
    assert "for job w1" in next(iter(moves(plan).values())).reason


def test_other_profiles_never_move_a_job() -> None:
    nodes, running = fragmented()
    for profile in ("fifo", "default", "drf", "tiresias"):
        plan = run(profile, snapshot(nodes, [pending("wide", 2)], running), now=1000.0)
        assert moves(plan) == {}, profile


def test_a_migrating_job_holds_both_its_gpus_and_cannot_be_stopped() -> None:
    nodes, running = fragmented()
    moving = dataclasses.replace(
        running[0], state=MIGRATING, moving_to=(Shard("b", ("b-g3",)),), state_since=1000.0
    )
    snap = snapshot(nodes, [pending("one", 1), pending("wide", 2)], [moving, *running[1:]])
    plan = run("gandiva", snap, now=1010.0)
    # b-g3 is the mover's already, and a-g0 still: only a-g3 is free.
    assert launches(plan)["one"].gpu_uuids == ("a-g3",)
    assert "small" not in moves(plan) and not preempted(plan)
    plan = run("default", snapshot(nodes, [pending("big", 4)], [moving]), now=5000.0)
    assert "small" not in preempted(plan)


def test_a_job_spread_over_nodes_moves_onto_one() -> None:
    a, b, c = node("a", 4), node("b", 4), node("c", 4)
    spread = dataclasses.replace(
        placed("spread", a, [0, 1], estimate_s=20_000.0),
        shards=(Shard("a", ("a-g0", "a-g1")), Shard("b", ("b-g0", "b-g1"))),
        request=dataclasses.replace(placed("x", a, [0, 1, 2, 3]).request),
    )
    others = [placed("fill-a", a, [2, 3]), placed("fill-b", b, [2, 3])]
    snap = snapshot([a, b, c], [], [spread, *others], multi_node=True)
    plan = run("gandiva", snap, now=1000.0)
    assert (moves(plan)["spread"].node_id, len(moves(plan)["spread"].gpu_uuids)) == ("c", 4)
    assert "onto one node from 2" in moves(plan)["spread"].reason
    # Little left to run: the move would cost more than the speed it buys.
    ending = dataclasses.replace(spread, estimate_s=250.0)
    assert moves(run("gandiva", snapshot([a, b, c], [], [ending, *others], multi_node=True),
                     now=1000.0)) == {}  # fmt: skip


def test_a_time_sliced_pair_is_parted_when_gpus_come_free() -> None:
    a, b = node("a", 1), node("b", 1)
    partner = dataclasses.replace(placed("runs", a, [0], estimate_s=9_000.0), state_since=0.0)
    waiting = dataclasses.replace(
        placed("paused", a, [0], estimate_s=9_000.0), state=SUSPENDED, state_since=0.0
    )
    plan = run("gandiva", snapshot([a, b], [], [partner, waiting]), now=400.0)
    # The running one moves to b's free GPU; the paused one resumes once it has left.
    assert (moves(plan)["runs"].node_id, moves(plan)["runs"].gpu_uuids) == ("b", ("b-g0",))
    assert "job paused, which takes turns with it" in moves(plan)["runs"].reason
    # A waiting job takes the free GPU first; and little left to share is no reason.
    plan = run("gandiva", snapshot([a, b], [pending("new")], [partner, waiting]), now=400.0)
    assert moves(plan) == {} and launches(plan)["new"].gpu_uuids == ("b-g0",)
    ending = dataclasses.replace(waiting, estimate_s=30.0)
    assert moves(run("gandiva", snapshot([a, b], [], [partner, ending]), now=400.0)) == {}


def test_no_second_move_while_one_under_way_frees_the_node() -> None:
    nodes, running = fragmented()
    nodes[1] = node("b", 5)  # a GPU free on b for a second move, were one made
    running[3] = dataclasses.replace(running[3], shards=(Shard("b", ("b-g0", "b-g1", "b-g2")),))
    moving = dataclasses.replace(
        running[0], state=MIGRATING, moving_to=(Shard("b", ("b-g3",)),), state_since=1000.0
    )
    plan = run("gandiva", snapshot(nodes, [pending("wide", 2)], [moving, *running[1:]]), now=1010.0)
    assert moves(plan) == {}  # a has 1 free and 1 leaving: enough for wide once it left


@pytest.mark.parametrize(("gpus", "code"), [(2, "preempting"), (4, "no_capacity")])
def test_a_shrink_in_place_frees_only_the_gpus_it_leaves(gpus: int, code: str) -> None:
    """A job shrinking from four GPUs to two of them on the same node frees the other
    two when it restarts: a waiting 2-GPU job waits for that, a 4-GPU job does not (the
    shrunk job keeps two), so it is told there is no room rather than to wait for it.
    (Its service puts it below the newcomer in 2D-LAS: a victim, were it not moving.)"""
    a = node("a", 4)
    shrinking = dataclasses.replace(
        placed("elastic", a, [0, 1, 2, 3], started_at=0.0, attained_s=50_000.0),
        state=MIGRATING,
        moving_to=(Shard("a", ("a-g0", "a-g1")),),
        state_since=1000.0,
    )
    plan = run("tiresias", snapshot([a], [pending("waiting", gpus)], [shrinking]), now=1000.0)
    assert not launches(plan) and not preempted(plan)
    assert plan.waiting["waiting"].code == code


@pytest.mark.parametrize("profile", ["fifo", "default", "gandiva"])
def test_a_job_requeued_to_move_resumes_on_its_gpus_before_older_jobs(profile: str) -> None:
    """Its checkpoint saved, a mover waits pinned to its target with the GPU chosen for
    it: an older waiting job that would take that GPU first does not."""
    b = node("b", 2)
    held = placed("held", b, [0], started_at=0.0, estimate_s=50_000.0)
    old = pending("old", 1, at=0.0)
    mover = dataclasses.replace(
        pending("mover", 1, at=500.0, attained_s=900.0),
        request=Request(1, 1, 1024, node_id="b"),
        resume_on=("b-g1",),
    )
    plan = run(profile, snapshot([b], [old, mover], [held]), now=1000.0)
    assert launches(plan)["mover"].gpu_uuids == ("b-g1",)
    assert "resumes on the GPUs held" in launches(plan)["mover"].reason
    # The older job gets no GPU of the mover's (under gandiva it takes turns on b-g0).
    assert "old" not in launches(plan) or launches(plan)["old"].gpu_uuids == ("b-g0",)
    assert ("old" in launches(plan)) == (profile == "gandiva")
    # Its GPU taken meanwhile: it takes its turn, pinned, as any job (under gandiva
    # literally: by turns).
    taken = [held, placed("thief", b, [1], started_at=900.0)]
    plan = run(profile, snapshot([b], [old, mover], taken), now=1000.0)
    again = launches(plan).get("mover")
    assert again is None or "resumes on the GPUs held" not in again.reason
    if profile == "gandiva":
        assert again is not None and "taking turns with thief" in again.reason
    else:
        assert again is None
        assert plan.waiting["mover"].code == {"fifo": "fifo_order"}.get(profile, "no_capacity")


def _drained(n: Node, held: int) -> Node:
    """A drained node as the shell gives it: only GPUs a job still holds, marked out."""
    kept = n.gpus[len(n.gpus) - held :]
    return dataclasses.replace(n, gpus=kept, out=frozenset(g.uuid for g in kept))


@pytest.mark.parametrize("profile", ["fifo", "default", "gandiva"])
@pytest.mark.parametrize("target", ["away", "drained idle", "drained busy", "full"])
def test_a_mover_whose_node_is_gone_runs_where_it_fits(profile: str, target: str) -> None:
    """Its target away (not in the snapshot) or drained (no GPU left to place on), a
    mover pinned there starts on another node from its checkpoint; before, it waited as
    never able to run. Only full, the node keeps it waiting there."""
    a, b = node("a", 2), node("b", 8)
    mover = dataclasses.replace(
        pending("mover", 2, at=500.0, attained_s=900.0),
        request=Request(2, 1, 1024, node_id="b"),
        resume_on=("b-g0", "b-g1"),
    )
    nodes, running = {
        "away": ([a], []),
        "drained idle": ([a, _drained(b, 0)], []),
        "drained busy": ([a, _drained(b, 2)], [placed("other", b, [6, 7])]),
        "full": ([a, b], [placed("other", b, list(range(8)))]),
    }[target]
    plan = run(profile, snapshot(nodes, [mover], running), now=1000.0)
    if target == "full":
        assert "mover" not in launches(plan)
        return
    assert launches(plan)["mover"].gpu_uuids == ("a-g0", "a-g1")
    assert "resumes on the GPUs held" not in launches(plan)["mover"].reason


def test_a_job_gathered_onto_one_of_its_nodes_holds_all_its_cpus_there() -> None:
    """Its part on `a` holds half its CPUs and memory; a move onto `a` takes the other
    half there too, in the plan that decides it and in every snapshot while it moves
    (before, only the GPUs: another job could take those CPUs meanwhile)."""
    a, b = node("a", 8, cpus=12, memory_mib=12_000), node("b", 2)
    spread = dataclasses.replace(
        placed("spread", a, [0, 1]),
        shards=(Shard("a", ("a-g0", "a-g1")), Shard("b", ("b-g0", "b-g1"))),
        request=Request(4, 8.0, 8_000),
    )
    snap = snapshot([a, b], [], [spread], multi_node=True)
    before = free_capacity(snap)["a"]
    assert (len(before.free_gpus), before.cpus, before.memory_mib) == (6, 8.0, 8_000)
    target = (Shard("a", ("a-g2", "a-g3", "a-g4", "a-g5")),)
    view = View.build(snap, 1000.0, Settings())
    view.claim(spread, target)
    claimed = view.capacity["a"]
    assert (len(claimed.free_gpus), claimed.cpus, claimed.memory_mib) == (2, 4.0, 4_000)
    moving = dataclasses.replace(spread, state=MIGRATING, moving_to=target)
    during = free_capacity(snapshot([a, b], [], [moving], multi_node=True))["a"]
    assert (len(during.free_gpus), during.cpus, during.memory_mib) == (2, 4.0, 4_000)
