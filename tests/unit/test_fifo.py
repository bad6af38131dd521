"""FIFO with best-fit placement, on hand-built snapshots."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy import profile
from tests.unit.policy_harness import assert_valid, launches, node, pending, placed, snapshot

fifo_plan = profile("fifo").plan


def test_best_fit_picks_the_node_left_fullest() -> None:
    a, b = node("a", 8), node("b", 8)
    snap = snapshot([a, b], [pending("j1", gpus=2)], [placed("x", b, [0, 1, 2, 3, 4])])
    plan = fifo_plan(snap, 0.0)
    assert_valid(snap, plan)
    assert launches(plan)["j1"].shards[0].node_id == "b"
    assert launches(plan)["j1"].gpu_uuids == ("b-g5", "b-g6")


def test_jobs_start_in_submission_order_until_one_does_not_fit() -> None:
    a = node("a", 4)
    snap = snapshot([a], [pending("j1", 2), pending("j2", 3), pending("j3", 1)])
    plan = fifo_plan(snap, 0.0)
    assert_valid(snap, plan)
    assert set(launches(plan)) == {"j1"}
    assert plan.waiting["j2"].code == "no_capacity"
    assert "too few free GPUs" in plan.waiting["j2"].reason
    assert plan.waiting["j3"].code == "fifo_order"
    assert "j2" in plan.waiting["j3"].reason


def test_a_job_no_node_could_ever_run_does_not_block_the_queue() -> None:
    snap = snapshot([node("a", 8), node("b", 4)], [pending("huge", 16), pending("small", 1)])
    plan = fifo_plan(snap, 0.0)
    assert_valid(snap, plan)
    assert plan.waiting["huge"].code == "too_large"
    assert plan.waiting["huge"].reason == "asks for 16 GPUs on one node; the largest node has 8"
    assert "small" in launches(plan)


def test_without_nodes_every_job_says_so() -> None:
    snap = snapshot([], [pending("j1"), pending("j2")])
    plan = fifo_plan(snap, 0.0)
    assert not plan.actions
    assert {w.code for w in plan.waiting.values()} == {"no_nodes"}
    assert plan.wait_counts() == {"no_nodes": 2}


def test_cpus_and_memory_filter_nodes() -> None:
    small, big = node("small", 8, cpus=4, memory_mib=8192), node("big", 8, cpus=64)
    snap = snapshot([small, big], [pending("j1", 1, cpus=8), pending("j2", 1, memory_mib=100_000)])
    plan = fifo_plan(snap, 0.0)
    assert_valid(snap, plan)
    assert {j.shards[0].node_id for j in launches(plan).values()} == {"big"}


def test_gpu_memory_request_skips_small_gpus() -> None:
    small, large = node("small", 8, gpu_memory_mib=16384), node("large", 8)
    snap = snapshot([small, large], [pending("j1", 1, gpu_memory_mib=40000)])
    assert launches(fifo_plan(snap, 0.0))["j1"].shards[0].node_id == "large"
    only_small = snapshot([small], [pending("j1", 1, gpu_memory_mib=40000)])
    plan = fifo_plan(only_small, 0.0)
    assert plan.waiting["j1"].code == "too_large"
    assert "40000 MiB" in plan.waiting["j1"].reason


def test_cpu_only_job_needs_no_gpu() -> None:
    a = node("a", 2)
    snap = snapshot([a], [pending("cpu", 0)], [placed("x", a, [0, 1])])
    plan = fifo_plan(snap, 0.0)
    assert launches(plan)["cpu"].gpu_uuids == ()


def test_busy_cluster_counts_nodes_by_reason() -> None:
    a, b = node("a", 2), node("b", 2, cpus=1)
    snap = snapshot(
        [a, b],
        [pending("j1", 1, cpus=2)],
        [placed("x", a, [0, 1]), placed("y", b, [0], cpus=1)],
    )
    plan = fifo_plan(snap, 0.0)
    reason = plan.waiting["j1"].reason
    assert "1 node with too few free GPUs" in reason
    assert "1 node with too few free CPUs" in reason


cluster = st.lists(st.integers(min_value=0, max_value=8), min_size=0, max_size=6)
jobs = st.lists(
    st.tuples(st.integers(0, 10), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 4, 16])),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(cluster, jobs, st.data())
def test_no_gpu_is_ever_over_allocated(gpus_per_node: list[int], specs: list, data) -> None:  # type: ignore[no-untyped-def, type-arg]
    nodes = [node(f"n{i}", g, cpus=16, memory_mib=65536) for i, g in enumerate(gpus_per_node)]
    busy = []
    for n in nodes:
        taken = data.draw(st.integers(0, len(n.gpus)))
        if taken:
            busy.append(placed(f"busy-{n.node_id}", n, list(range(taken)), cpus=2))
    waiting = [
        pending(f"j{i}", g, cpus=c, memory_mib=m * 1024) for i, (g, c, m) in enumerate(specs)
    ]
    snap = snapshot(nodes, waiting, busy)
    plan = fifo_plan(snap, 0.0)
    assert_valid(snap, plan)
    # FIFO: the launched jobs are exactly a prefix of the queue, skipping impossible ones.
    order = [
        j.job_id
        for j in waiting
        if plan.waiting.get(j.job_id, None) is None or plan.waiting[j.job_id].code != "too_large"
    ]
    launched = set(launches(plan))
    assert order[: len(launched)] == [j for j in order if j in launched]
