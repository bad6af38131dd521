"""The replay engine on traces small enough to work out by hand."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest

from schedd.policy import Profile, build, profile
from schedd.policy.actions import Launch, Plan, Preempt, SetLimits, Stop
from schedd.policy.profiles import BUILTIN
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import Shard, Snapshot, free_capacity
from schedd.policy.view import View
from schedd.sim.engine import SimError, SimOptions, Simulation
from schedd.sim.locality import LocalityModel, NoLocality
from schedd.sim.metrics import summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace, TraceJob

PlanFn = Callable[[Snapshot, float], Plan]


def job(
    job_id: str,
    at: float,
    duration: float,
    gpus: int = 1,
    *,
    queue: str = "default",
    user: str = "u",
    name: str = "",
    deadline: float | None = None,
) -> TraceJob:
    return TraceJob(job_id, at, duration, gpus, user, queue, name, deadline)


def simulate(
    jobs: list[TraceJob],
    shape: str,
    policy: Profile | str = "fifo",
    options: SimOptions | None = None,
    locality: LocalityModel | None = None,
    rack_size: int | None = None,
) -> SimResult:
    nodes, gpus = (int(x) for x in shape.split("x"))
    trace = Trace("test.csv", "csv", tuple(jobs), 0, any(j.deadline_s for j in jobs))
    chosen = profile(policy) if isinstance(policy, str) else policy
    cluster = ClusterShape(nodes, gpus, rack_size)
    return Simulation(trace, cluster, chosen, options, locality).run()


def by_id(result: SimResult) -> dict[str, tuple[float | None, float | None]]:
    """job -> (first start, finish)."""
    return {j.job_id: (j.first_start_s, j.finish_s) for j in result.jobs}


def first_fit(snapshot: Snapshot, now: float) -> Plan:
    """Start every pending job that fits, in order, on the first free GPUs of one node."""
    plan = Plan()
    capacity = free_capacity(snapshot)
    for pending in snapshot.pending:
        for cap in capacity.values():
            if len(cap.free_gpus) >= pending.request.gpus:
                uuids = tuple(g.uuid for g in cap.free_gpus[: pending.request.gpus])
                cap.take(uuids, pending.request)
                plan.actions.append(Launch(pending.job_id, (Shard(cap.node.node_id, uuids),), ""))
                break
    return plan


def scripted(extra: PlanFn, tick_s: float | None = None, window: int = 1000) -> Profile:
    """First fit, plus whatever `extra` adds (it sees the same snapshot)."""

    def plan(snapshot: Snapshot, now: float) -> Plan:
        result = extra(snapshot, now)
        result.actions += first_fit(snapshot, now).actions
        return result

    return Profile("scripted", plan, pending_window=window, tick_s=tick_s)


# ---- FIFO, by hand -----------------------------------------------------------------


def test_fifo_on_one_node_of_two_gpus() -> None:
    # a takes 1 GPU at 0; b needs both and blocks c (strict FIFO) until a ends at 10;
    # b runs 10-15, then c 15-18.
    result = simulate([job("a", 0, 10), job("b", 0, 5, gpus=2), job("c", 1, 3)], "1x2")
    assert by_id(result) == {"a": (0, 10), "b": (10, 15), "c": (15, 18)}
    summary = summarize(result)
    assert summary.jct_avg_s == pytest.approx((10 + 15 + 17) / 3)
    assert summary.queueing_avg_s == pytest.approx((0 + 10 + 14) / 3)
    assert summary.makespan_s == 18
    # 1 GPU for 10 s, 2 for 5 s, 1 for 3 s, of 2 GPUs over 18 s.
    assert summary.allocation_avg == pytest.approx(23 / 36)
    # Counted at the end of each instant: b at 0 and 1, c behind it at 1, c at 10.
    assert summary.waits == {"no_capacity": 3, "fifo_order": 1}


def test_jobs_arriving_later_and_an_idle_gap() -> None:
    result = simulate([job("a", 100, 10), job("b", 200, 10)], "1x1")
    assert by_id(result) == {"a": (100, 110), "b": (200, 210)}
    summary = summarize(result)
    assert summary.makespan_s == 110
    assert summary.allocation_avg == pytest.approx(20 / 110)


def test_a_job_larger_than_a_node_spans_nodes() -> None:
    result = simulate([job("big", 0, 10, gpus=4)], "2x2", locality=NoLocality())
    assert by_id(result) == {"big": (0, 10)}


# ---- locality ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("locality", "model", "finish"),
    [
        (NoLocality(), "m", 10.0),
        (LocalityModel({"m": {4: {2: 0.5}}}), "m", 20.0),
        (LocalityModel({"m": {8: {4: 0.25, 2: 0.5}}}), "m", 20.0),  # nearest keys: 8, 2
        (LocalityModel({"m": {4: {2: 0.5}}}, default=0.8), "other", 12.5),
        (LocalityModel(None), "m", 10.0),  # no table, default 1.0
    ],
    ids=["off", "exact", "nearest", "unknown-model", "no-table"],
)
def test_a_job_across_nodes_runs_at_its_locality_speed(
    locality: LocalityModel, model: str, finish: float
) -> None:
    result = simulate([job("big", 0, 10, gpus=4, name=model)], "2x2", locality=locality)
    assert by_id(result)["big"] == (0, finish)
    # 10 s of work: what it took beyond that was lost to its spread.
    outcome = result.jobs[0]
    assert outcome.slowed_by_locality_s == pytest.approx(finish - 10.0)
    assert outcome.slowed_by_sharing_s == 0.0


@pytest.mark.parametrize(("rack_size", "nodes"), [(None, {"n1", "n2"}), (2, {"n2", "n3"})])
def test_topology_keeps_a_gang_in_one_rack_of_simulated_nodes(
    rack_size: int | None, nodes: set[str]
) -> None:
    # `a` holds half of n0; the 8-GPU gang needs two whole nodes. Without racks it takes
    # the first two empty ones; with racks of two nodes, the two of the empty rack.
    default = profile("default")
    placed: dict[str, set[str]] = {}

    def observe(snapshot: Snapshot, now: float) -> Plan:
        plan = default.plan(snapshot, now)
        for a in plan.actions:
            if isinstance(a, Launch):
                placed[a.job_id] = {s.node_id for s in a.shards}
        return plan

    watched = dataclasses.replace(default, plan=observe)
    jobs = [job("a", 0, 100, gpus=2), job("gang", 1, 10, gpus=8)]
    result = simulate(jobs, "4x4", watched, rack_size=rack_size)
    assert by_id(result)["gang"] == (1, 11)
    assert placed["gang"] == nodes


@pytest.mark.parametrize(("rack_size", "finish"), [(2, 20.0), (1, 40.0)])
def test_a_job_across_racks_runs_at_the_cross_rack_speed_again(
    rack_size: int, finish: float
) -> None:
    # Half speed across nodes, and half of that across racks of one node each.
    model = LocalityModel(default=0.5, cross_rack=0.5)
    result = simulate([job("big", 0, 10, gpus=4)], "2x2", locality=model, rack_size=rack_size)
    assert by_id(result)["big"] == (0, finish)


def test_a_job_on_one_node_runs_at_full_speed() -> None:
    slow = LocalityModel({"m": {2: {1: 0.1, 2: 0.1}}})
    result = simulate([job("a", 0, 10, gpus=2, name="m")], "1x2", locality=slow)
    assert by_id(result)["a"] == (0, 10)


# ---- preemption --------------------------------------------------------------------


def preempt_a_at_4(snapshot: Snapshot, now: float) -> Plan:
    """Preempt job a once: in its first attempt (started at 0), from t=4 on."""
    plan = Plan()
    for placed in snapshot.placed:
        first_attempt = placed.state == "running" and placed.started_at == 0
        if placed.job_id == "a" and first_attempt and now >= 4:
            plan.actions.append(Preempt("a", "test"))
    return plan


@pytest.mark.parametrize(
    ("options", "finish"),
    [
        # Requeued and restarted at once with its progress: 4 s done, 6 s left.
        (SimOptions(), 10.0),
        # Holds its GPUs 3 s doing nothing, restarts at 7.
        (SimOptions(preempt_overhead_s=3), 13.0),
        # Checkpoints every 3 s: the 1 s since the last one is lost.
        (SimOptions(checkpoint_interval_s=3), 11.0),
        # Both: restarts at 6 with 7 s to go.
        (SimOptions(preempt_overhead_s=2, checkpoint_interval_s=3), 13.0),
    ],
    ids=["free", "overhead", "checkpoint", "both"],
)
def test_a_preempted_job_keeps_its_progress(options: SimOptions, finish: float) -> None:
    seen: list[float] = []

    def observe(snapshot: Snapshot, now: float) -> Plan:
        seen.extend(p.attained_s for p in snapshot.pending if p.job_id == "a")
        return preempt_a_at_4(snapshot, now)

    result = simulate([job("a", 0, 10)], "1x1", scripted(observe, tick_s=4), options)
    outcome = result.jobs[0]
    assert (outcome.first_start_s, outcome.finish_s, outcome.preemptions) == (0, finish, 1)
    assert seen and seen[-1] == 4.0  # its attained service went back to pending with it
    assert result.ledger.actions["Preempt"] == 1
    assert summarize(result).preemptions == 1


@pytest.mark.parametrize(
    ("interval", "checkpoint"),
    [(4.0, 4.0), (None, None)],  # no checkpoints modelled: None, as the live scheduler
)
def test_placed_jobs_show_attained_service_and_checkpoint(
    interval: float | None, checkpoint: float | None
) -> None:
    views: list[tuple[float, float, float | None]] = []

    def observe(snapshot: Snapshot, now: float) -> Plan:
        view = View.build(snapshot, now, Settings())
        views.extend((now, view.attained(p), p.checkpointed_at) for p in snapshot.placed)
        return Plan()

    options = SimOptions(checkpoint_interval_s=interval)
    simulate([job("a", 0, 10, gpus=2)], "1x2", scripted(observe, tick_s=5), options)
    # At t=5 it has held 2 GPUs for 5 s; its last checkpoint was at 4.
    assert (5.0, 10.0, checkpoint) in views


def test_launch_on_gpus_still_being_freed_is_refused_and_counted() -> None:
    def preempt_and_reuse(snapshot: Snapshot, now: float) -> Plan:
        plan = preempt_a_at_4(snapshot, now)
        if plan.actions:
            gpu = snapshot.nodes[0].gpus[0].uuid
            plan.actions.append(Launch("b", (Shard(snapshot.nodes[0].node_id, (gpu,)),), ""))
        return plan

    options = SimOptions(preempt_overhead_s=2)
    result = simulate(
        [job("a", 0, 10), job("b", 1, 1)], "1x1", scripted(preempt_and_reuse, tick_s=4), options
    )
    assert result.ledger.refused["launch on GPUs still being freed"] == 1
    # At 6 the GPU is free; a, requeued ahead of b (submitted first), takes it again.
    assert by_id(result) == {"a": (0, 12), "b": (12, 13)}


def test_a_plans_claimants_reach_the_next_plans_until_a_plan_names_others() -> None:
    """The plan at 4 names b (it preempts a for it); so do the plans until 5; a plan
    naming none clears them."""
    seen: dict[float, frozenset[str]] = {}

    def claim_b_until_5(snapshot: Snapshot, now: float) -> Plan:
        seen[now] = snapshot.claimants
        plan = preempt_a_at_4(snapshot, now)
        if 4 <= now < 5:
            plan.claimants.add("b")
        return plan

    options = SimOptions(preempt_overhead_s=3)
    simulate(
        [job("a", 0, 10), job("b", 1, 1)], "1x1", scripted(claim_b_until_5, tick_s=0.5), options
    )
    b = frozenset({"b"})
    # At 4 a second plan follows the preemption at once, and sees the claim already.
    assert {t: c for t, c in seen.items() if 3.5 <= t <= 6} == {
        3.5: frozenset(),
        4.0: b,
        4.5: b,
        5.0: b,
        5.5: frozenset(),
        6.0: frozenset(),
    }


def test_a_claimant_behind_the_pending_window_is_in_the_next_snapshots() -> None:
    """With a window of one job, c (behind b) is seen only while a plan names it."""
    seen: dict[float, tuple[str, ...]] = {}

    def claim_c_at_3(snapshot: Snapshot, now: float) -> Plan:
        seen[now] = tuple(j.job_id for j in snapshot.pending)
        plan = Plan()
        if 3 <= now < 4:
            plan.claimants.add("c")
        return plan

    trace = [job("a", 0, 10), job("b", 1, 1), job("c", 2, 1)]
    simulate(trace, "1x1", scripted(claim_c_at_3, tick_s=1, window=1))
    assert {t: ids for t, ids in seen.items() if 2 <= t <= 5} == {
        2.0: ("b",),
        3.0: ("b",),
        4.0: ("b", "c"),
        5.0: ("b",),
    }


# ---- other actions -------------------------------------------------------------------


def test_a_queues_average_gpus_count_over_the_time_its_gpu_seconds_were_counted() -> None:
    """`long` holds a GPU until the policy stops it at 50, after the last finish (10):
    each queue's GPUs are averaged over the 50 s they were counted for (qb held one
    GPU throughout, qa one for 10 s), never above what the cluster has."""

    def stop_long(snapshot: Snapshot, now: float) -> Plan:
        plan = Plan()
        if now >= 50 and any(j.job_id == "long" for j in snapshot.placed):
            plan.actions.append(Stop("long", "test"))
        return plan

    trace = [job("a", 0, 10, queue="qa"), job("long", 0, 1000, queue="qb")]
    summary = summarize(simulate(trace, "1x2", scripted(stop_long, tick_s=50)))
    assert summary.makespan_s == 10
    assert {q.name: q.avg_gpus for q in summary.queues} == {"qa": 0.2, "qb": 1.0}


def test_stop_cancels_a_pending_job_and_unsupported_actions_are_counted() -> None:
    def stop_c(snapshot: Snapshot, now: float) -> Plan:
        plan = Plan()
        for pending in snapshot.pending:
            if pending.job_id == "c":
                plan.actions.append(Stop("c", "test"))
        for placed in snapshot.placed:
            plan.actions.append(SetLimits(placed.job_id, "not simulated", compute_share=50))
        return plan

    def stop_first(snapshot: Snapshot, now: float) -> Plan:
        result = stop_c(snapshot, now)
        if result.actions and isinstance(result.actions[0], Stop):
            return result  # stop c before first fit could start it
        result.actions += first_fit(snapshot, now).actions
        return result

    policy = Profile("stopper", stop_first, pending_window=100)
    result = simulate([job("a", 0, 5), job("c", 1, 5)], "1x1", policy)
    outcomes = {j.job_id: j for j in result.jobs}
    assert outcomes["c"].state == "cancelled"
    assert outcomes["c"].finish_s is None
    assert result.ledger.unsupported["SetLimits"] >= 1
    summary = summarize(result)
    assert (summary.finished, summary.cancelled, summary.never_finished) == (1, 1, 0)


@pytest.mark.parametrize(
    ("bad_launch", "message"),
    [
        (lambda s: Launch("b", (Shard("n0", ("n0-g0",)),), ""), "which guaranteed job a holds"),
        (lambda s: Launch("nope", (Shard("n0", ("n0-g1",)),), ""), "unknown job 'nope'"),
        (lambda s: Launch("b", (Shard("n0", ("n0-g1", "n0-g1")),), ""), "it asks for 1"),
    ],
    ids=["gpu-twice", "unknown-job", "wrong-size"],
)
def test_impossible_actions_stop_the_replay(
    bad_launch: Callable[[Snapshot], Launch], message: str
) -> None:
    def misbehave(snapshot: Snapshot, now: float) -> Plan:
        if any(p.job_id == "a" for p in snapshot.pending):
            return Plan([Launch("a", (Shard("n0", ("n0-g0",)),), "")])
        if now >= 1:
            return Plan([bad_launch(snapshot)])
        return Plan()

    policy = Profile("bad", misbehave, pending_window=100)
    with pytest.raises(SimError, match=message):
        simulate([job("a", 0, 10), job("b", 1, 1)], "1x2", policy)


# ---- planning rhythm ---------------------------------------------------------------


def test_plans_again_at_the_same_instant_until_quiet_through_the_window() -> None:
    # A window of one pending job: each plan starts one, the next plan sees the next.
    calls: list[float] = []

    def count(snapshot: Snapshot, now: float) -> Plan:
        calls.append(now)
        assert len(snapshot.pending) <= 1
        return Plan()

    result = simulate([job(j, 0, 5) for j in "abc"], "1x3", scripted(count, window=1))
    assert by_id(result) == {j: (0, 5) for j in "abc"}
    assert calls.count(0) == 4  # three launches, then one plan that does nothing


def test_ticks_while_jobs_run_and_stop_when_idle() -> None:
    calls: list[float] = []

    def count(snapshot: Snapshot, now: float) -> Plan:
        calls.append(now)
        return Plan()

    simulate([job("a", 0, 12), job("b", 100, 1)], "1x1", scripted(count, tick_s=5))
    # 0 (a launch: nothing freed, nothing behind the window, no second plan), 5, 10,
    # 12 (finish); idle until b: 100, 101.
    assert calls == [0, 5, 10, 12, 100, 101]


def test_plans_again_when_the_last_plan_asked_to_be_rechecked() -> None:
    calls: list[float] = []

    def recheck_at_7(snapshot: Snapshot, now: float) -> Plan:
        calls.append(now)
        return Plan(recheck_at=7.0) if now < 7 else Plan()

    simulate([job("a", 0, 12), job("b", 1, 1, gpus=2)], "1x1", scripted(recheck_at_7))
    # 0 (a starts), 1 (b arrives, can never fit), 7 (asked for), 12 (a ends); no ticks.
    assert calls == [0, 1, 7, 12]


def test_jobs_that_can_never_start_end_the_replay_unfinished() -> None:
    result = simulate([job("huge", 0, 5, gpus=16), job("a", 1, 1)], "1x2")
    summary = summarize(result)
    assert by_id(result)["a"] == (1, 2)
    assert summary.never_finished == 1
    assert summary.waits == {"too_large": 3}  # at the end of each of the 3 instants


# ---- what the policy is told -----------------------------------------------------------


def test_snapshot_carries_oracle_or_history_estimates() -> None:
    seen: dict[str, float | None] = {}

    def observe(snapshot: Snapshot, now: float) -> Plan:
        seen.update((p.job_id, p.estimate_s) for p in snapshot.pending)
        return Plan()

    jobs = [
        job("a", 0, 10, name="bert"),
        job("b", 20, 30, name="bert"),
        job("c", 20, 30, name="gpt"),
        job("d", 20, 30, name="bert", user="other"),
    ]
    history = scripted(observe)
    simulate(jobs, "1x4", history)
    assert seen == {"a": None, "b": 10.0, "c": None, "d": None}
    oracle = Profile("o", history.plan, pending_window=10, estimates="oracle")
    simulate(jobs, "1x4", oracle)
    assert seen == {"a": 10.0, "b": 30.0, "c": 30.0, "d": 30.0}


def test_snapshot_carries_decayed_usage_and_queues() -> None:
    seen: list[Snapshot] = []

    def observe(snapshot: Snapshot, now: float) -> Plan:
        seen.append(snapshot)
        return Plan()

    queues = (QueueSpec("team", Resources(gpus=1)),)
    options = SimOptions(half_life_s=10, queues=queues)
    jobs = [job("a", 0, 10, gpus=2, queue="team", user="ann"), job("b", 10, 1)]
    simulate(jobs, "1x2", scripted(observe), options)
    at_10 = next(s for s in seen if any(p.job_id == "b" for p in s.pending))
    assert at_10.multi_node and at_10.queues == queues
    # 2 GPUs for 10 s, each second weighted 2^(-age/10): 2 * tau * (1 - 1/2).
    tau = 10 / math.log(2)
    assert at_10.usage.queues["team"] == pytest.approx(tau)
    assert at_10.usage.users[("team", "ann")] == pytest.approx(tau)


def test_time_below_guarantee_counts_only_while_the_queue_waits() -> None:
    # b (queue "other") holds both GPUs 0-10; "team", guaranteed 2, waits 2-10.
    queues = (QueueSpec("team", Resources(gpus=2)),)
    jobs = [job("b", 0, 10, gpus=2, queue="other"), job("t", 2, 5, gpus=2, queue="team")]
    result = simulate(jobs, "1x2", options=SimOptions(queues=queues))
    figures = {q.name: q for q in summarize(result).queues}
    assert figures["team"].below_guarantee_s == 8
    assert figures["other"].below_guarantee_s is None
    assert figures["team"].avg_gpus == pytest.approx(2 * 5 / 15)


def test_deadlines_missed_and_met() -> None:
    jobs = [job("a", 0, 10, deadline=10), job("b", 0, 10, deadline=15), job("c", 0, 1)]
    summary = summarize(simulate(jobs, "1x1"))
    # a ends at 10 (met), b at 20 (missed), c has none.
    assert (summary.deadline_jobs, summary.deadline_missed) == (2, 1)
    assert summary.deadline_miss_rate == 0.5


def test_every_profile_replays_a_small_mixed_trace() -> None:
    from schedd.policy import PROFILES

    jobs = [job(f"j{i}", i * 3, 20 + 7 * (i % 5), gpus=(1, 2, 4, 8, 1)[i % 5]) for i in range(40)]
    for name in PROFILES:
        summary = summarize(simulate(jobs, "2x4", name))
        assert summary.finished == 40, name
        assert 0 < summary.allocation_avg <= 1


def test_chronus_guarantees_a_deadline_fifo_would_miss_and_records_its_answers() -> None:
    # A long best-effort job holds the only GPU; a short job due soon arrives behind it.
    jobs = [
        job("long", 0, 10_000),
        job("due", 1_500, 600, deadline=3_000),
        job("hopeless", 1_500, 5_000, deadline=3_000),
    ]
    fifo = summarize(simulate(jobs, "1x1", "fifo"))
    assert fifo.deadline_missed == 2
    result = simulate(jobs, "1x1", "chronus")
    chronus = summarize(result)
    assert chronus.actions["AdmitDeadline"] == 1 and chronus.actions["RefuseDeadline"] == 1
    # `long` has run its 20-minute lease: the guaranteed job preempts it, and meets its
    # deadline; the refused one waits as best-effort (SRTF puts it before `long`).
    start, finish = by_id(result)["due"]
    assert start == 1_500 and finish == 2_100
    assert chronus.deadline_missed == 1 and chronus.preemptions == 1
    assert by_id(result)["hopeless"][0] == 2_100


@pytest.mark.parametrize(("lease_s", "admitted"), [(1200.0, 2), (86_400.0, 1)])
def test_chronus_decides_a_refused_deadline_again_when_a_lease_begins(
    lease_s: float, admitted: int
) -> None:
    """`r` (1,000 s, due at 2,150) is refused on arrival: behind `g`'s guarantee the
    bound leaves 0.9 x 2,140 GPU-s for 1,990 of work. Both run (`r` as best-effort from
    1,000 s on); at 1,200 s, the second 20-minute lease, with no arrival since, it is
    decided again and now fits (800 s left by 2,150). With day-long leases, no decision
    comes before it ends."""
    jobs = [job("g", 0, 1_000, deadline=1_200), job("r", 10, 1_000, deadline=2_150)]
    spec = dataclasses.replace(
        BUILTIN["chronus"],
        settings=dataclasses.replace(BUILTIN["chronus"].settings, deadline_lease_s=lease_s),
    )
    summary = summarize(simulate(jobs, "1x1", build("chronus", spec)))
    assert summary.actions["AdmitDeadline"] == admitted
    assert summary.actions["RefuseDeadline"] == 1
    assert summary.deadline_missed == 0


@pytest.mark.parametrize("name", ["default", "las", "tiresias", "gandiva"])
def test_a_recheck_read_late_replays_as_one_found_at_once(name: str) -> None:
    """The replay reads a plan's recheck after applying it, and only for the last plan
    at an instant; found as soon as each plan is made instead, the replay is the same."""
    from schedd.policy import PROFILES

    jobs = [
        job(f"j{i}", i * 40, (30, 600, 90, 5_000, 200)[i % 5], gpus=(1, 2, 1, 4, 1)[i % 5])
        for i in range(60)
    ]
    lazy = PROFILES[name]
    eager = dataclasses.replace(lazy, plan=lambda s, now: lazy.plan(s, now).with_recheck_found())
    late, at_once = (simulate(jobs, "2x4", p) for p in (lazy, eager))
    assert late.jobs == at_once.jobs
    assert late.ledger.plan_calls == at_once.ledger.plan_calls
    # The rechecks had work to do: jobs were stopped or took turns.
    assert sum(j.preemptions + j.suspensions for j in late.jobs) > 0
