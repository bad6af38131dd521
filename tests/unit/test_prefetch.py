"""Liquid's pre-scheduled data transfer: inputs copied ahead to the node a waiting job
is expected to get."""

from __future__ import annotations

import dataclasses

from schedd.policy import profile
from schedd.policy.actions import Plan, Prefetch, Wait
from schedd.policy.anticipate import prefetch
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View
from tests.unit.policy_harness import node, pending, placed, run, snapshot

NOW = 10_000.0
DATA = ("https://data.example/imagenet.tar",)


def with_inputs(job: PendingJob, prefetched_to: str | None = None) -> PendingJob:
    return dataclasses.replace(job, inputs=DATA, prefetched_to=prefetched_to)


def prefetches(plan: Plan) -> dict[str, Prefetch]:
    return {a.job_id: a for a in plan.actions if isinstance(a, Prefetch)}


def busy_pair() -> tuple[list, list]:
    """n0's job is expected to end in 500 s, n1's in 100 s (estimates less time run)."""
    nodes = [node("n0", 1), node("n1", 1)]
    running = [
        placed("long", nodes[0], [0], started_at=NOW - 100, estimate_s=600.0, attained_s=100.0),
        placed("short", nodes[1], [0], started_at=NOW - 500, estimate_s=600.0, attained_s=500.0),
    ]
    return nodes, running


def test_a_waiting_jobs_inputs_go_to_the_node_that_frees_first() -> None:
    nodes, running = busy_pair()
    plan = run("liquid", snapshot(nodes, [with_inputs(pending("next"))], running), now=NOW)
    sent = prefetches(plan)["next"]
    assert (sent.node_id, sent.inputs) == ("n1", DATA)
    assert "in about 2 min" in sent.reason


def test_a_job_the_plan_paused_is_not_expected_to_free_its_node() -> None:
    """Paused for another's turn, it does not end there: its GPUs are taken meanwhile."""
    nodes, running = busy_pair()
    job = with_inputs(pending("next"))
    view = View.build(snapshot(nodes, [job], running), NOW, Settings())
    view.suspend(running[1])
    plan = Plan(waiting={"next": Wait("no_capacity", "no room")})
    (sent,) = prefetch.anticipate(view, plan)
    assert isinstance(sent, Prefetch) and sent.node_id == "n0"


def test_the_next_waiting_job_looks_at_the_next_node() -> None:
    nodes, running = busy_pair()
    waiting = [with_inputs(pending("first", at=1.0)), with_inputs(pending("second", at=2.0))]
    plan = run("liquid", snapshot(nodes, waiting, running), now=NOW)
    assert {j: a.node_id for j, a in prefetches(plan).items()} == {"first": "n1", "second": "n0"}


def test_nothing_is_sent_twice_nor_beyond_the_horizon_nor_without_inputs() -> None:
    nodes, running = busy_pair()
    done = with_inputs(pending("next"), prefetched_to="n1")
    assert not prefetches(run("liquid", snapshot(nodes, [done], running), now=NOW))
    # The first job to end does so in 100 s: a horizon of a minute sees none.
    soon = snapshot(nodes, [with_inputs(pending("next"))], running)
    assert not prefetches(run("liquid", soon, now=NOW, prefetch_horizon_s=60.0))
    assert not prefetches(run("liquid", snapshot(nodes, [pending("bare")], running), now=NOW))


def test_a_job_that_starts_now_needs_no_prefetch() -> None:
    nodes, running = busy_pair()
    nodes.append(node("n2", 1))
    plan = run("liquid", snapshot(nodes, [with_inputs(pending("next"))], running), now=NOW)
    assert not prefetches(plan)


def test_a_job_on_a_node_that_is_away_is_no_crash_and_no_target() -> None:
    nodes, running = busy_pair()
    away = node("away", 1)
    gone = placed("gone", away, [0], started_at=NOW - 590, estimate_s=600.0, attained_s=590.0)
    snap = snapshot(nodes, [with_inputs(pending("next"))], [*running, gone])
    plan = profile("liquid").plan(snap, NOW)  # the harness's checks want every node here
    assert prefetches(plan)["next"].node_id == "n1"


def test_a_job_without_gpus_is_not_sent_anywhere() -> None:
    nodes, running = busy_pair()
    cpu_only = with_inputs(pending("cpu", 0, cpus=1_000))  # waits for CPUs, not GPUs
    assert not prefetches(run("liquid", snapshot(nodes, [cpu_only], running), now=NOW))


def test_it_plans_again_when_a_job_comes_within_the_horizon_of_its_end() -> None:
    nodes, running = busy_pair()  # the first expected end is in 100 s
    snap = snapshot(nodes, [with_inputs(pending("next"))], running)
    plan = run("liquid", snap, now=NOW, prefetch_horizon_s=60.0)
    assert not prefetches(plan) and plan.recheck_at == NOW + 100 - 60
    # Sent already: nothing to wake up for.
    done = snapshot(nodes, [with_inputs(pending("next"), prefetched_to="n1")], running)
    assert run("liquid", done, now=NOW, prefetch_horizon_s=60.0).recheck_at is None
