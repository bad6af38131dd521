"""Suspend and Resume in the replay (Gandiva's time-slicing), on scripts worked out by hand.

Each script names the actions to take at given instants and asks the engine to come back
at the next one (`Plan.recheck_at`); every job runs on one node at full speed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from schedd.policy import Profile
from schedd.policy.actions import Action, Launch, Plan, Preempt, Resume, Stop, Suspend
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PlacedJob, Shard, Snapshot, free_capacity
from schedd.policy.view import View
from schedd.sim import report
from schedd.sim.engine import SimError, SimOptions, Simulation
from schedd.sim.metrics import summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace
from tests.unit.test_sim_engine import by_id, job, simulate

GPU = (Shard("n0", ("n0-g0",)),)
Observer = Callable[[Snapshot, float], None]


def script(
    steps: dict[float, list[Action]], observe: Observer | None = None, tick_s: float | None = None
) -> Profile:
    """Take each instant's actions once (not again when the engine plans a second time
    at that instant), and ask to be planned again at the next instant named."""
    done: set[float] = set()

    def plan(snapshot: Snapshot, now: float) -> Plan:
        if observe is not None:
            observe(snapshot, now)
        actions: list[Action] = []
        if now in steps and now not in done:
            done.add(now)
            actions = list(steps[now])
        later = [t for t in steps if t > now]
        return Plan(actions, recheck_at=min(later) if later else None)

    return Profile("timeslice-script", plan, pending_window=100, tick_s=tick_s)


def launch(job_id: str) -> Launch:
    return Launch(job_id, GPU, "")


def suspend(job_id: str) -> Suspend:
    return Suspend(job_id, "its quantum is over")


def resume(job_id: str) -> Resume:
    return Resume(job_id, "its turn")


def run_alone(steps: dict[float, list[Action]], options: SimOptions | None = None) -> SimResult:
    """One job `a` of 100 s of work, submitted at 0, on one GPU."""
    return simulate([job("a", 0, 100)], "1x1", script(steps), options)


# ---- one job paused and going on ----------------------------------------------------


def test_a_job_suspended_for_a_while_finishes_that_much_later() -> None:
    # 30 s of work, suspended 50 s, then the 70 s left: 100 + 50.
    result = run_alone({0: [launch("a")], 30: [suspend("a")], 80: [resume("a")]})
    assert by_id(result) == {"a": (0, 150)}
    [outcome] = result.jobs
    assert (outcome.jct_s, outcome.queueing_s) == (150, 0)
    assert (outcome.suspensions, outcome.preemptions) == (1, 0)
    summary = summarize(result)
    assert (summary.suspensions, summary.preemptions) == (1, 0)
    assert summary.jct_avg_s == 150 and summary.queueing_avg_s == 0
    assert (summary.actions["Suspend"], summary.actions["Resume"]) == (1, 1)
    assert not summary.unsupported_actions and not summary.refused_actions


def test_the_gpu_of_a_suspended_job_is_not_allocated_nor_charged() -> None:
    usage: dict[float, float] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        usage[now] = snapshot.usage.queues.get("default", 0.0)

    steps: dict[float, list[Action]] = {0: [launch("a")], 30: [suspend("a")], 80: [resume("a")]}
    options = SimOptions(half_life_s=1e9)  # usage decays by next to nothing
    result = simulate([job("a", 0, 100)], "1x1", script(steps, observe), options)
    # Held 0-30 and 80-150: 100 GPU-seconds of the 150 the run took.
    assert result.ledger.series == [(0, 1), (30, 0), (80, 1), (150, 0)]
    summary = summarize(result)
    assert summary.allocation_avg == pytest.approx(100 / 150)
    assert summary.queues[0].avg_gpus == pytest.approx(100 / 150)
    # Charged for 30 s before the suspension, and nothing more until the resume.
    assert usage[80] == pytest.approx(30.0)


def test_the_policy_sees_a_suspended_job_as_such() -> None:
    seen: dict[float, PlacedJob] = {}
    free: dict[float, int] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        for placed in snapshot.placed:  # a alone, or none
            seen[now] = placed
        free[now] = len(free_capacity(snapshot)["n0"].free_gpus)
        if now == 90:
            view = View.build(snapshot, now, Settings())
            assert view.attained(seen[90]) == 40.0  # 30 s before, 10 since the resume

    steps: dict[float, list[Action]] = {
        0: [launch("a")],
        30: [suspend("a")],
        50: [],
        80: [resume("a")],
        90: [],
    }
    simulate([job("a", 0, 100)], "1x1", script(steps, observe))
    paused, running = seen[50], seen[90]
    assert (paused.state, paused.state_since, paused.started_at) == ("suspended", 30, 0)
    assert (paused.attained_s, paused.attained_as_of) == (30.0, None)
    assert paused.shards == GPU  # the GPU it resumes on
    assert free[50] == 1  # not held: another job may run there
    assert (running.state, running.state_since, running.started_at) == ("running", 80, 0)
    assert (running.attained_s, running.attained_as_of) == (30.0, 80)
    assert free[90] == 0


# ---- two jobs sharing one GPU by turns ---------------------------------------------


def test_two_jobs_time_sliced_on_one_gpu_finish_when_the_arithmetic_says() -> None:
    # a (150 s) runs 0-100, b (120 s) 100-200, a 200-250 (its 50 s left), b 250-270.
    # Each plan names the GPU's new holder before the suspension that frees it: the
    # engine applies suspensions first.
    steps: dict[float, list[Action]] = {
        0: [launch("a")],
        100: [launch("b"), suspend("a")],
        200: [resume("a"), suspend("b")],
        250: [resume("b")],
    }
    result = simulate([job("a", 0, 150), job("b", 0, 120)], "1x1", script(steps))
    assert by_id(result) == {"a": (0, 250), "b": (100, 270)}
    summary = summarize(result)
    assert summary.jct_avg_s == (250 + 270) / 2
    assert summary.queueing_avg_s == (0 + 100) / 2  # submission to first start only
    assert summary.suspensions == 2
    assert summary.allocation_avg == 1.0  # the GPU was never idle
    assert report.as_json(summary)["suspensions"] == 2
    assert "suspensions" in report.overview([summary], "s").splitlines()[0]
    assert result.ledger.queue_gpu_seconds["default"] == 270


def test_a_resume_onto_a_gpu_another_job_holds_stops_the_replay() -> None:
    steps: dict[float, list[Action]] = {
        0: [launch("a")],
        10: [suspend("a"), launch("b")],
        20: [resume("a")],  # b still runs there
    }
    with pytest.raises(SimError, match="Resume of guaranteed job a on GPU n0-g0, which"):
        simulate([job("a", 0, 100), job("b", 0, 100)], "1x1", script(steps))


def test_suspend_of_a_job_not_running_and_resume_of_one_not_suspended_are_refused() -> None:
    steps: dict[float, list[Action]] = {
        0: [launch("a")],
        10: [suspend("b"), resume("a")],  # b waits; a runs
    }
    result = simulate([job("a", 0, 100), job("b", 0, 10)], "1x1", script(steps))
    assert result.ledger.refused == {"suspend of a pending job": 1, "resume of a running job": 1}
    assert "Suspend" not in result.ledger.actions and "Resume" not in result.ledger.actions
    assert by_id(result)["a"] == (0, 100)  # untouched
    assert summarize(result).refused_actions == dict(result.ledger.refused)


def test_stop_of_a_suspended_job_cancels_it() -> None:
    result = run_alone({0: [launch("a")], 30: [suspend("a")], 40: [Stop("a", "")]})
    [outcome] = result.jobs
    assert (outcome.state, outcome.finish_s) == ("cancelled", None)
    assert result.ledger.series == [(0, 1), (30, 0)]


# ---- overheads and checkpoints -------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "overhead", "finish"),
    [
        # Suspended 30-80 and 120-140: 100 s of work + 70 s suspended.
        ({30: [suspend("a")], 80: [resume("a")], 120: [suspend("a")], 140: [resume("a")]},
         0.0, 170.0),
        # The same with 2.5 s without progress after each of the two resumes.
        ({30: [suspend("a")], 80: [resume("a")], 120: [suspend("a")], 140: [resume("a")]},
         2.5, 175.0),
        # Suspended again 1 s after a resume, within its overhead: nothing done then;
        # the 70 s left run from 92.5.
        ({30: [suspend("a")], 80: [resume("a")], 81: [suspend("a")], 90: [resume("a")]},
         2.5, 162.5),
    ],
    ids=["no-overhead", "overhead-per-resume", "suspended-within-the-overhead"],
)  # fmt: skip
def test_each_resume_costs_the_suspend_overhead(
    steps: dict[float, list[Action]], overhead: float, finish: float
) -> None:
    result = run_alone({0: [launch("a")], **steps}, SimOptions(suspend_overhead_s=overhead))
    [a] = result.jobs
    assert (a.first_start_s, a.finish_s) == (0, finish)  # halves: exact in binary
    assert result.jobs[0].suspensions == 2


PREEMPTED_AFTER_THE_RESUME: dict[float, list[Action]] = {
    30: [suspend("a")],
    50: [resume("a")],
    70: [Preempt("a", ""), launch("a")],
}


@pytest.mark.parametrize(
    ("steps", "overhead", "finish"),
    [
        # Suspended at 30, between checkpoints (every 40 s): no work is lost.
        ({30: [suspend("a")], 50: [resume("a")]}, 0.0, 120.0),
        # Preempted 20 s after the resume, before its next checkpoint: it falls back to
        # the work at the resume (30 s done), not to its launch, and starts again at 70.
        (PREEMPTED_AFTER_THE_RESUME, 0.0, 140.0),
        # The same with a resume overhead of 5 s (progress from 55 on): the same fallback.
        (PREEMPTED_AFTER_THE_RESUME, 5.0, 140.0),
    ],
    ids=["suspend-resume", "preempted-after-the-resume", "preempted-after-an-overhead"],
)
def test_a_suspension_under_checkpoints_loses_no_work(
    steps: dict[float, list[Action]], overhead: float, finish: float
) -> None:
    options = SimOptions(checkpoint_interval_s=40.0, suspend_overhead_s=overhead)
    result = run_alone({0: [launch("a")], **steps}, options)
    [a] = result.jobs
    assert (a.first_start_s, a.finish_s) == (0, finish)  # halves: exact in binary


# ---- the end of the replay -------------------------------------------------------------


def test_an_idle_cluster_waits_for_the_resume_the_policy_asked_to_plan_for() -> None:
    # After the suspension nothing runs and no event is left (a's completion at 100 no
    # longer happens); the replay still comes back at 200 because the plan asked to.
    result = run_alone({0: [launch("a")], 30: [suspend("a")], 200: [resume("a")]})
    assert by_id(result) == {"a": (0, 270)}


def test_a_job_left_suspended_is_released_at_the_end() -> None:
    # Never resumed: the policy ticks, but after an instant that changed nothing the
    # replay ends rather than tick forever.
    calls: list[float] = []

    def count(snapshot: Snapshot, now: float) -> None:
        calls.append(now)
        assert len(calls) < 50, "ticking on forever"

    trace = Trace("t.csv", "csv", (job("a", 0, 100),), 0, False)
    steps: dict[float, list[Action]] = {0: [launch("a")], 30: [suspend("a")]}
    sim = Simulation(trace, ClusterShape(1, 1, None), script(steps, count, tick_s=50.0))
    result = sim.run()
    # The tick at 50 changes nothing: the end. a's completion as planned at its launch
    # (100) no longer happens, and no plan is made there. A suspension frees nothing the
    # plan did not see: no second plan at 30.
    assert calls == [0, 30, 50]
    assert result.end_s == 50
    [outcome] = result.jobs
    assert (outcome.state, outcome.finish_s, outcome.suspensions) == ("suspended", None, 1)
    assert summarize(result).never_finished == 1
    assert not sim.holding and not sim.gpu_owner
    assert result.ledger.series == [(0, 1), (30, 0)]


def test_a_resumed_job_counts_its_service_and_run_time_without_the_pause() -> None:
    trace = Trace("t.csv", "csv", (job("a", 0, 100, gpus=2),), 0, False)
    steps: dict[float, list[Action]] = {
        0: [Launch("a", (Shard("n0", ("n0-g0", "n0-g1")),), "")],
        30: [suspend("a")],
        80: [resume("a")],
    }
    sim = Simulation(trace, ClusterShape(1, 2, None), script(steps))
    sim.run()
    [a] = sim.jobs
    # 2 GPUs x (30 + 70) s; what the history estimates and the Gittins index learn from.
    assert (a.attained_gpu_s, a.run_time_s) == (200.0, 100.0)
    assert (a.first_started_at, a.finished_at) == (0, 150)
