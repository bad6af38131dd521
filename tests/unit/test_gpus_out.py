"""GPUs out of placement (`Node.out`: a fault, while a job still holds the GPU): nobody
new gets them, by any path: placement, sharing, a victim's GPUs handed on, turns."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy.snapshot import OPPORTUNISTIC, SUSPENDED, Node, PlacedJob
from tests.unit.policy_harness import launches, node, pending, placed, preempted, run, snapshot


def faulty(n: Node, *indices: int) -> Node:
    return dataclasses.replace(n, out=frozenset(f"{n.node_id}-g{i}" for i in indices))


@pytest.mark.parametrize("profile", ["fifo", "default", "antman"])
def test_a_gpu_out_held_by_a_job_that_does_not_own_it_is_free_for_nobody(profile: str) -> None:
    """An opportunistic job holds the faulty GPU: as a GPU nobody owns it would be free;
    out, it is not."""
    n = faulty(node("n", 2), 1)
    guest = placed("guest", n, [1], kind=OPPORTUNISTIC, utilization_pct=10)
    plan = run(profile, snapshot([n], [pending("pair", 2)], [guest]))
    assert not launches(plan) and plan.waiting["pair"].code == "no_capacity"
    plan = run(profile, snapshot([n], [pending("one", 1)], [guest]))
    assert launches(plan)["one"].gpu_uuids == ("n-g0",)
    # The same GPU sound: the pair would start there.
    sound = dataclasses.replace(n, out=frozenset())
    plan = run(profile, snapshot([sound], [pending("pair", 2)], [guest]))
    assert launches(plan)["pair"].gpu_uuids == ("n-g0", "n-g1")


@pytest.mark.parametrize("profile", ["default", "antman"])
def test_no_opportunistic_job_shares_a_gpu_out(profile: str) -> None:
    n = faulty(node("n", 2), 0)
    holders = [placed("a", n, [0], utilization_pct=5), placed("b", n, [1], utilization_pct=30)]
    guest = pending("o", 1, kind=OPPORTUNISTIC)
    plan = run(profile, snapshot([n], [guest], holders), now=1000.0)
    assert launches(plan)["o"].gpu_uuids == ("n-g1",)  # not the least used, which is out


def test_a_victims_gpu_out_is_not_handed_on() -> None:
    """A long runner on GPUs 0 and 1 (1 out) would give way to a newcomer of 2 GPUs under
    2D-LAS; preempting it would free GPU 0 only, so it is left alone."""
    n = faulty(node("n", 2), 1)
    runner = placed("long", n, [0, 1], started_at=0.0, attained_s=1e6)
    plan = run("tiresias", snapshot([n], [pending("new", 2)], [runner]), now=10_000.0)
    assert preempted(plan) == set() and not launches(plan)
    sound = dataclasses.replace(n, out=frozenset())
    plan = run("tiresias", snapshot([sound], [pending("new", 2)], [runner]), now=10_000.0)
    assert preempted(plan) == {"long"}


def test_no_turns_on_gpus_out_and_no_resume_onto_them() -> None:
    n = faulty(node("n", 1), 0)
    holder = placed("a", n, [0], started_at=0.0)
    plan = run("gandiva", snapshot([n], [pending("new", 1)], [holder]), now=1000.0)
    assert plan.actions == [] and plan.waiting["new"].code == "no_capacity"
    # A job paused there whose partner has left stays paused.
    waiting: PlacedJob = dataclasses.replace(holder, state=SUSPENDED, state_since=0.0)
    assert run("gandiva", snapshot([n], [], [waiting]), now=1000.0).actions == []
    sound = dataclasses.replace(n, out=frozenset())
    resumed = run("gandiva", snapshot([sound], [], [waiting]), now=1000.0)
    assert [type(a).__name__ for a in resumed.actions] == ["Resume"]
