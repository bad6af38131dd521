"""Migrate in the replay (Gandiva's migration), on scripts worked out by hand.

The scripts are test_sim_timeslice's: each names the actions to take at given instants
and asks the engine to come back at the next one. Every time and speed below is exact in
binary, so the arithmetic is compared exactly."""

from __future__ import annotations

import pytest

from schedd.policy.actions import Action, Launch, Migrate, Preempt, SetKind, Stop
from schedd.policy.settings import Settings
from schedd.policy.snapshot import OPPORTUNISTIC, PlacedJob, Shard, Snapshot, free_capacity
from schedd.policy.view import View
from schedd.sim import report
from schedd.sim.engine import SimError, SimOptions, Simulation
from schedd.sim.locality import LocalityModel
from schedd.sim.metrics import summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.sharing import SharingModel
from schedd.sim.traces import Trace
from tests.unit.test_sim_engine import by_id, job, simulate
from tests.unit.test_sim_timeslice import resume, script, suspend

G0 = (Shard("n0", ("n0-g0",)),)
G1 = (Shard("n0", ("n0-g1",)),)
TEN = SimOptions(migrate_overhead_s=10.0)


def on(job_id: str, shards: tuple[Shard, ...]) -> Launch:
    return Launch(job_id, shards, "")


def move(job_id: str, uuid: str = "n0-g1", node: str = "n0") -> Migrate:
    return Migrate(job_id, node, (uuid,), "defragment")


def run(
    steps: dict[float, list[Action]],
    options: SimOptions | None = TEN,
    extra: list[tuple[str, float]] | None = None,
) -> SimResult:
    """Job `a` of 100 s of work, submitted at 0, and the `extra` (id, work) jobs, on one
    node of two GPUs."""
    jobs = [job("a", 0, 100), *(job(j, 0, work) for j, work in extra or [])]
    return simulate(jobs, "1x2", script(steps), options)


# ---- one job moved -----------------------------------------------------------------


def test_a_migrated_job_finishes_the_overhead_later() -> None:
    # 30 s of work on g0, 10 s moving, the 70 s left on g1: 100 + 10.
    result = run({0: [on("a", G0)], 30: [move("a")]})
    assert by_id(result) == {"a": (0, 110)}  # still started at 0: not a new start
    [a] = result.jobs
    assert (a.migrations, a.preemptions, a.suspensions) == (1, 0, 0)
    assert (a.jct_s, a.queueing_s) == (110, 0)
    summary = summarize(result)
    assert (summary.migrations, summary.preemptions) == (1, 0)
    assert summary.actions == {"Launch": 1, "Migrate": 1}
    assert not summary.unsupported_actions and not summary.refused_actions
    assert report.as_json(summary)["migrations"] == 1
    assert "migrations" in report.overview([summary], "s").splitlines()[0]


def test_the_default_overhead_is_thirty_seconds() -> None:
    assert SimOptions().migrate_overhead_s == 30.0
    result = run({0: [on("a", G0)], 30: [move("a")]}, options=None)
    assert by_id(result) == {"a": (0, 130)}


def test_without_migrations_the_table_has_no_column() -> None:
    summary = summarize(run({0: [on("a", G0)]}))
    assert summary.migrations == 0
    assert "migrations" not in report.overview([summary], "s")
    assert report.as_json(summary)["migrations"] == 0


def test_a_spread_job_moved_onto_one_node_speeds_up() -> None:
    # 4 GPUs on two nodes at half speed: 40 s do 20 s of work; it moves to n2 for 10 s
    # and runs the 80 s left at full speed from 50. Left spread it would end at 200.
    spread = (Shard("n0", ("n0-g0", "n0-g1")), Shard("n1", ("n1-g0", "n1-g1")))
    target = ("n2-g0", "n2-g1", "n2-g2", "n2-g3")
    steps: dict[float, list[Action]] = {
        0: [on("big", spread)],
        40: [Migrate("big", "n2", target, "gather")],
    }
    half = LocalityModel(default=0.5)
    result = simulate([job("big", 0, 100, gpus=4)], "3x4", script(steps), TEN, half)
    assert by_id(result) == {"big": (0, 130)}
    left = simulate([job("big", 0, 100, gpus=4)], "3x4", script({0: steps[0]}), TEN, half)
    assert by_id(left) == {"big": (0, 200)}


# ---- what is held while it moves ---------------------------------------------------


def test_both_gpu_sets_are_held_during_the_move_and_the_source_is_free_after() -> None:
    # b starts on a's old GPU the moment the move is over.
    steps: dict[float, list[Action]] = {
        0: [on("a", G0)],
        30: [move("a")],
        40: [on("b", G0)],
    }
    options = SimOptions(migrate_overhead_s=10.0, half_life_s=1e9)
    result = run(steps, options, extra=[("b", 50)])
    assert by_id(result) == {"a": (0, 110), "b": (40, 90)}
    # Both GPUs held from 30: by a alone until 40, then by a and b.
    assert result.ledger.series == [(0, 1), (30, 2), (90, 1), (110, 0)]
    assert summarize(result).allocation_avg == pytest.approx((30 + 2 * 60 + 20) / (2 * 110))
    # Its queue counts a as one job of one GPU all along (0-110), and b (40-90).
    assert result.ledger.queue_gpu_seconds["default"] == 110 + 50


def test_the_policy_sees_a_migrating_job_as_such() -> None:
    calls: list[float] = []
    seen: dict[float, list[PlacedJob]] = {}
    free: dict[float, int] = {}
    attained: dict[float, float] = {}
    usage: dict[float, float] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        calls.append(now)
        seen[now] = list(snapshot.placed)
        free[now] = len(free_capacity(snapshot)["n0"].free_gpus)
        view = View.build(snapshot, now, Settings())
        attained[now] = sum(view.attained(p) for p in snapshot.placed)
        usage[now] = snapshot.usage.queues.get("default", 0.0)

    steps: dict[float, list[Action]] = {0: [on("a", G0)], 30: [move("a")], 35: [], 45: []}
    options = SimOptions(migrate_overhead_s=10.0, half_life_s=1e9)
    simulate([job("a", 0, 100)], "1x2", script(steps, observe), options)
    # One plan at 30: the move took GPUs the plan saw free, and frees none until 40;
    # a's completion as it was before the move (100) no longer happens: no plan there.
    assert calls == [0, 30, 35, 40, 45, 110]
    [moving], [moved] = seen[35], seen[45]
    assert (moving.state, moving.state_since, moving.started_at) == ("migrating", 30, 0)
    assert (moving.shards, moving.moving_to) == (G0, G1)
    assert (moving.attained_s, moving.attained_as_of, moving.checkpointed_at) == (30, None, None)
    assert not moving.stoppable
    assert free[35] == 0  # both its GPUs and the target
    assert (moved.state, moved.state_since, moved.started_at) == ("running", 40, 0)
    assert (moved.shards, moved.moving_to) == (G1, ())
    assert (moved.attained_s, moved.attained_as_of) == (30, 40)
    assert free[45] == 1
    # Service stops at the decision and goes on from the end of the move.
    assert (attained[30], attained[35], attained[40], attained[45]) == (30, 30, 30, 35)
    # Usage is charged all along, as one job of one GPU (decay all but none).
    assert usage[45] == pytest.approx(45.0)


def test_the_moved_job_counts_its_service_and_run_time_without_the_move() -> None:
    trace = Trace("t.csv", "csv", (job("a", 0, 100, gpus=2),), 0, False)
    steps: dict[float, list[Action]] = {
        0: [on("a", (Shard("n0", ("n0-g0", "n0-g1")),))],
        30: [Migrate("a", "n1", ("n1-g0", "n1-g1"), "")],
    }
    sim = Simulation(trace, ClusterShape(2, 2, None), script(steps), TEN)
    sim.run()
    [a] = sim.jobs
    assert (a.attained_gpu_s, a.run_time_s) == (200.0, 100.0)
    assert (a.first_started_at, a.finished_at) == (0, 110)
    assert not sim.gpu_owner and not sim.holding


@pytest.mark.parametrize("order", ["launch-first", "migrate-first"])
def test_a_launch_onto_the_target_in_the_same_plan_stops_the_replay(order: str) -> None:
    # Migrations apply before launches, whatever the plan's order: b finds g1 taken.
    actions: list[Action] = [on("b", G1), move("a")]
    if order == "migrate-first":
        actions.reverse()
    steps: dict[float, list[Action]] = {0: [on("a", G0)], 30: actions}
    taken = "Launch of guaranteed job b on GPU n0-g1, which guaranteed job a holds"
    with pytest.raises(SimError, match=taken):
        run(steps, extra=[("b", 50)])


def test_a_launch_onto_the_target_before_the_move_is_over_stops_the_replay() -> None:
    steps: dict[float, list[Action]] = {0: [on("a", G0)], 30: [move("a")], 39: [on("b", G1)]}
    with pytest.raises(SimError, match="Launch of guaranteed job b on GPU n0-g1, which"):
        run(steps, extra=[("b", 50)])


def test_a_launch_onto_the_gpus_a_move_frees_is_refused_until_it_is_over() -> None:
    # As onto a preempting job's GPUs: the room is being made, the policy is early.
    steps: dict[float, list[Action]] = {
        0: [on("a", G0)],
        30: [move("a"), on("b", G0)],
        35: [on("b", G0)],
        40: [on("b", G0)],
    }
    result = run(steps, extra=[("b", 50)])
    assert result.ledger.refused == {"launch on GPUs still being freed": 2}
    assert by_id(result) == {"a": (0, 110), "b": (40, 90)}


# ---- refused, and policy bugs --------------------------------------------------------


def test_migrate_of_a_pending_or_suspended_job_is_refused_and_counted() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("a", G0)],
        10: [move("b"), suspend("a")],  # b waits
        20: [move("a")],  # a is suspended
        30: [resume("a")],
    }
    result = run(steps, extra=[("b", 10)])
    assert result.ledger.refused == {"migrate of a pending job": 1, "migrate of a suspended job": 1}
    assert "Migrate" not in result.ledger.actions
    assert by_id(result)["a"] == (0, 120)  # suspended 10-30, otherwise untouched
    assert summarize(result).migrations == 0


def test_a_migrating_job_cannot_be_preempted_suspended_or_moved_again() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("a", G0)],
        30: [move("a")],
        35: [Preempt("a", ""), suspend("a"), move("a", "n0-g0")],
    }
    result = run(steps)
    assert result.ledger.refused == {
        "preempt of a migrating job": 1,
        "suspend of a migrating job": 1,
        "migrate of a migrating job": 1,
    }
    assert by_id(result) == {"a": (0, 110)}


def test_a_stopped_migrating_job_is_cancelled_when_the_move_is_over() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("a", G0)],
        30: [move("a")],
        35: [Stop("a", "")],
        36: [Stop("a", "")],  # already on its way out
    }
    trace = Trace("t.csv", "csv", (job("a", 0, 100),), 0, False)
    sim = Simulation(trace, ClusterShape(1, 2, None), script(steps), TEN)
    result = sim.run()
    [a] = result.jobs
    assert (a.state, a.finish_s) == ("cancelled", None)
    assert sim.jobs[0].ended_at == 40
    assert result.ledger.series == [(0, 1), (30, 2), (40, 0)]  # both held until then
    assert result.ledger.actions["Stop"] == 1
    assert result.ledger.refused == {"stop of a migrating job": 1}
    assert not sim.gpu_owner and not sim.holding


def test_a_migrate_onto_a_gpu_another_job_holds_stops_the_replay() -> None:
    steps: dict[float, list[Action]] = {0: [on("a", G0), on("b", G1)], 30: [move("a")]}
    taken = "Migrate of guaranteed job a on GPU n0-g1, which guaranteed job b holds"
    with pytest.raises(SimError, match=taken):
        run(steps, extra=[("b", 50)])


def test_a_migrate_onto_gpus_a_preemption_still_frees_is_refused() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("a", G0), on("b", G1)],
        30: [Preempt("b", ""), move("a")],
    }
    options = SimOptions(migrate_overhead_s=10.0, preempt_overhead_s=5.0)
    result = run(steps, options, extra=[("b", 50)])
    assert result.ledger.refused == {"migrate on GPUs still being freed": 1}
    assert by_id(result)["a"] == (0, 100)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Migrate("a", "n0", ("n0-g1", "n1-g0"), ""), "job a names 2 GPUs .2 distinct.; it has 1"),
        (Migrate("a", "n0", (), ""), "job a names 0 GPUs"),
        (Migrate("a", "n1", ("n0-g1",), ""), "job a names GPU n0-g1, which is not on node n1"),
        (Migrate("a", "n9", ("n9-g0",), ""), "job a to unknown node 'n9'"),
        (Migrate("a", "n0", ("n0-g0",), ""), "job a names GPU n0-g0, which it runs on already"),
        (Migrate("zz", "n0", ("n0-g1",), ""), "unknown job 'zz'"),
    ],
    ids=["two-nodes", "none", "other-node", "unknown-node", "own-gpu", "unknown-job"],
)  # fmt: skip
def test_a_migrate_the_cluster_cannot_mean_stops_the_replay(action: Migrate, message: str) -> None:
    steps: dict[float, list[Action]] = {0: [on("a", G0)], 30: [action]}
    with pytest.raises(SimError, match=f"policy timeslice-script: Migrate of {message}"):
        simulate([job("a", 0, 100)], "2x2", script(steps), TEN)


# ---- overheads and checkpoints -------------------------------------------------------


def test_with_no_overhead_the_move_is_at_once() -> None:
    seen: list[tuple[float, str, tuple[Shard, ...]]] = []

    def observe(snapshot: Snapshot, now: float) -> None:
        seen.extend((now, p.state, p.shards) for p in snapshot.placed if p.job_id == "a")

    # The same plan starts b on the GPU a leaves: free at once, as after a preemption
    # without overhead.
    steps: dict[float, list[Action]] = {0: [on("a", G0)], 30: [move("a"), on("b", G0)]}
    result = simulate([job("a", 0, 100), job("b", 0, 50)], "1x2", script(steps, observe),
                      SimOptions(migrate_overhead_s=0.0))  # fmt: skip
    assert by_id(result) == {"a": (0, 100), "b": (30, 80)}
    assert result.ledger.series == [(0, 1), (30, 2), (80, 1), (100, 0)]
    assert result.jobs[0].migrations == 1
    # The GPUs it freed at once are new to a second plan at 30, which sees it moved.
    assert (30, "running", G1) in seen and all(s != "migrating" for _, s, _ in seen)


@pytest.mark.parametrize(
    ("steps", "finish"),
    [
        # Moved at 30, between checkpoints (every 40 s): nothing lost; 100 + 10.
        ({30: [move("a")]}, 110.0),
        # Preempted 20 s after the move, before its next checkpoint: it falls back to the
        # work saved for the move (30 s), not to its launch, and starts again at 60.
        ({30: [move("a")], 60: [Preempt("a", ""), on("a", G0)]}, 130.0),
    ],
    ids=["moved", "preempted-after-the-move"],
)
def test_a_migration_under_checkpoints_loses_no_work(
    steps: dict[float, list[Action]], finish: float
) -> None:
    checkpoints: list[float | None] = []

    def observe(snapshot: Snapshot, now: float) -> None:
        checkpoints.extend(p.checkpointed_at for p in snapshot.placed if now == 35)

    options = SimOptions(migrate_overhead_s=10.0, checkpoint_interval_s=40.0)
    result = simulate([job("a", 0, 100)], "1x2", script({0: [on("a", G0)], 35: [], **steps},
                      observe), options)  # fmt: skip
    assert by_id(result) == {"a": (0, finish)}
    assert checkpoints == [30]  # the move saved one


# ---- sharers -----------------------------------------------------------------------------


def test_sharers_run_as_alone_beside_a_moving_job_and_are_retimed_when_it_lands() -> None:
    # a (guaranteed, 50 % busy) on g0 with the opportunistic o1; o2 alone on g1. a moves
    # to g1 at 20 (o2 stays: a guaranteed job may take a GPU an opportunistic one shares).
    # Speeds: o1 0.5 beside a, 1 while a moves (it computes nothing) and after; o2 1,
    # then 0.5 beside a from 30 until a ends at 110.
    #   a:  20 done at 20, 80 left from 30: 110.
    #   o1: 10 done at 20, 20 at 30, 80 left at full speed: 110.
    #   o2: 30 done at 30, 70 at 110, 30 left at full speed: 140.
    steps: dict[float, list[Action]] = {
        0: [
            SetKind("o1", OPPORTUNISTIC, ""),
            SetKind("o2", OPPORTUNISTIC, ""),
            on("a", G0),
            on("o1", G0),
            on("o2", G1),
        ],
        20: [move("a")],
    }
    sharing = SharingModel(util_low=50, util_high=50, slowdown=0.0)
    options = SimOptions(migrate_overhead_s=10.0, sharing=sharing)
    jobs = [job("a", 0, 100), job("o1", 0, 100), job("o2", 0, 100)]
    result = simulate(jobs, "1x2", script(steps), options)
    assert by_id(result) == {"a": (0, 110), "o1": (0, 110), "o2": (0, 140)}
    # Busy GPUs: a 0.5 + o1 0.25 + o2 0.5; a moving: o1 0.5 + o2 0.5; then o1 0.5 +
    # a 0.5 + o2 0.25; o2 alone 0.5.
    busy = result.ledger.busy_series
    assert [t for t, _ in busy] == [0, 20, 30, 110, 140]
    assert [v for _, v in busy] == pytest.approx([1.25, 1.0, 1.25, 0.5, 0.0])
    assert result.ledger.series == [(0, 2), (110, 1), (140, 0)]


def test_an_opportunistic_job_moves_away_from_its_guaranteed_neighbour() -> None:
    # g (guaranteed, 50 % busy) runs at half speed while o shares its GPU (slowdown
    # 0.5), o at 1 - 50 % beside it. o moves to g1 at 20: from then g runs alone.
    #   g: 10 done at 20, 90 left at full speed: 110.
    #   o: 10 done at 20, 90 left from 30, alone: 120.
    steps: dict[float, list[Action]] = {
        0: [SetKind("o", OPPORTUNISTIC, ""), on("g", G0), on("o", G0)],
        20: [move("o")],
    }
    sharing = SharingModel(util_low=50, util_high=50, slowdown=0.5)
    options = SimOptions(migrate_overhead_s=10.0, sharing=sharing)
    result = simulate([job("g", 0, 100), job("o", 0, 100)], "1x2", script(steps), options)
    assert by_id(result) == {"g": (0, 110), "o": (0, 120)}
    # g0 is g's all along; o takes g1 at 20 and leaves g0 to g alone at 30.
    assert result.ledger.series == [(0, 1), (20, 2), (110, 1), (120, 0)]
    # Busy: g 0.5 + o 0.25; o moving adds nothing; g 0.5 + o 0.5 alone; o alone.
    busy = result.ledger.busy_series
    assert [t for t, _ in busy] == [0, 20, 30, 110, 120]
    assert [v for _, v in busy] == pytest.approx([0.75, 0.5, 1.0, 0.5, 0.0])
