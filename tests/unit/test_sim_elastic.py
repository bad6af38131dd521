"""Elastic jobs in the replay (Gandiva's grow/shrink), on scripts worked out by hand.

The scripts are test_sim_timeslice's: each names the actions to take at given instants
and asks the engine to come back at the next one. The work of a job of G GPUs and run
time D is D x G GPU-seconds, and it scales linearly (schedd/sim/elastic.py); every time
below is exact in binary, so the arithmetic is compared exactly."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from schedd.cli import main
from schedd.policy import profile
from schedd.policy.actions import Action, Launch, Migrate, Plan, Preempt, Resize, Stop
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PlacedJob, Request, Shard, Snapshot, free_capacity
from schedd.policy.view import View
from schedd.sim import report
from schedd.sim.elastic import gpu_range
from schedd.sim.engine import SimError, SimOptions, Simulation
from schedd.sim.locality import LocalityModel
from schedd.sim.metrics import summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace, TraceJob
from tests.unit.test_sim_engine import by_id, job, simulate
from tests.unit.test_sim_timeslice import Observer, resume, script, suspend

ELASTIC = SimOptions(elastic=1.0, resize_overhead_s=10.0, half_life_s=1e9)


def gpus(*indexes: int, node: str = "n0") -> tuple[str, ...]:
    return tuple(f"{node}-g{i}" for i in indexes)


def on(job_id: str, *indexes: int, node: str = "n0") -> Launch:
    return Launch(job_id, (Shard(node, gpus(*indexes, node=node)),), "")


def resize(job_id: str, *indexes: int, node: str = "n0") -> Resize:
    return Resize(job_id, len(indexes), "grow or shrink", node, gpus(*indexes, node=node))


def run(
    steps: dict[float, list[Action]],
    options: SimOptions = ELASTIC,
    extra: list[TraceJob] | None = None,
    observe: Observer | None = None,
    shape: str = "1x4",
) -> SimResult:
    """Job `e`, 4 GPUs and 100 s of work (400 GPU-seconds), submitted at 0, elastic
    from 2 to 4 GPUs (with `--elastic 1`), and the `extra` jobs, on one node of four."""
    jobs = [job("e", 0, 100, gpus=4), *(extra or [])]
    return simulate(jobs, shape, script(steps, observe), options)


def simulation(steps: dict[float, list[Action]], options: SimOptions = ELASTIC) -> Simulation:
    trace = Trace("t.csv", "csv", (job("e", 0, 100, gpus=4),), 0, False)
    return Simulation(trace, ClusterShape(1, 4, None), script(steps), options)


# ---- the work scales with the GPUs ---------------------------------------------------


def test_an_elastic_job_started_on_half_its_gpus_takes_twice_as_long() -> None:
    # 400 GPU-seconds on 2 GPUs: 200 s.
    sim = simulation({0: [on("e", 0, 1)]})
    result = sim.run()
    assert by_id(result) == {"e": (0, 200)}
    [e] = sim.jobs
    assert (e.attained_gpu_s, e.run_time_s) == (400.0, 200.0)  # 2 GPUs x 200 s
    # Its queue held 2 GPUs for 200 s; the cluster 2 of 4 GPUs.
    assert result.ledger.queue_gpu_seconds["default"] == 400
    assert result.ledger.series == [(0, 2), (200, 0)]
    assert result.jobs[0].gpus == 4  # the trace's count, in the outcome


def test_grown_from_two_to_four_gpus_it_finishes_sooner() -> None:
    # 50 s on 2 GPUs do 100 of its 400 GPU-seconds; 10 s restarting; the 300 left on
    # 4 GPUs take 75 s: 50 + 10 + 75.
    sim = simulation({0: [on("e", 0, 1)], 50: [resize("e", 0, 1, 2, 3)]})
    result = sim.run()
    assert by_id(result) == {"e": (0, 135)}  # still started at 0: not a new start
    [e] = sim.jobs
    assert (e.attained_gpu_s, e.run_time_s) == (2 * 50 + 4 * 75, 125.0)
    [outcome] = result.jobs
    assert (outcome.resizes, outcome.migrations, outcome.preemptions) == (1, 0, 0)
    summary = summarize(result)
    assert summary.resizes == 1 and summary.actions == {"Launch": 1, "Resize": 1}
    assert not summary.unsupported_actions and not summary.refused_actions
    assert report.as_json(summary)["resizes"] == 1
    assert "resizes" in report.overview([summary], "s").splitlines()[0]
    assert not sim.gpu_owner and not sim.holding


def test_the_default_resize_overhead_is_thirty_seconds() -> None:
    assert SimOptions().resize_overhead_s == 30.0 == SimOptions().migrate_overhead_s
    result = run({0: [on("e", 0, 1)], 50: [resize("e", 0, 1, 2, 3)]}, SimOptions(elastic=1.0))
    assert by_id(result) == {"e": (0, 50 + 30 + 75)}


def test_shrunk_from_four_to_two_gpus_it_finishes_later() -> None:
    # 40 s on 4 GPUs do 160 GPU-seconds; 10 s restarting; the 240 left on 2 GPUs take
    # 120 s: 40 + 10 + 120.
    sim = simulation({0: [on("e", 0, 1, 2, 3)], 40: [resize("e", 0, 1)]})
    result = sim.run()
    assert by_id(result) == {"e": (0, 170)}
    assert sim.jobs[0].attained_gpu_s == 4 * 40 + 2 * 120


def test_a_resize_with_no_overhead_is_at_once_and_frees_the_gpus_for_the_same_plan() -> None:
    seen: list[tuple[float, str, int]] = []

    def observe(snapshot: Snapshot, now: float) -> None:
        seen.extend((now, p.state, p.request.gpus) for p in snapshot.placed if p.job_id == "e")

    # Resizes apply before launches: b takes the two GPUs e gives back in the same plan.
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1, 2, 3)],
        40: [on("b", 2, 3), resize("e", 0, 1)],
    }
    options = SimOptions(elastic=1.0, resize_overhead_s=0.0)
    result = run(steps, options, [job("b", 0, 50, gpus=2)], observe)
    assert by_id(result) == {"e": (0, 160), "b": (40, 90)}
    assert result.ledger.series == [(0, 4), (90, 2), (160, 0)]
    # The GPUs it freed at once are new to a second plan at 40, which sees it shrunk.
    assert (40, "running", 2) in seen and all(s != "migrating" for _, s, _ in seen)


def test_a_job_preempted_on_four_gpus_and_started_again_on_two() -> None:
    # 40 s on 4 GPUs (160 GPU-seconds), preempted (nothing lost), started again at 50 on
    # 2 GPUs: the 240 left take 120 s.
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1, 2, 3)],
        40: [Preempt("e", "")],
        50: [on("e", 2, 3)],
    }
    sim = simulation(steps)
    assert by_id(sim.run()) == {"e": (0, 170)}
    assert sim.jobs[0].attained_gpu_s == 4 * 40 + 2 * 120


def test_a_preemption_after_a_resize_falls_back_to_the_work_saved_for_it() -> None:
    # Checkpoints every 40 s. Shrunk at 30 (120 GPU-seconds saved, 280 left: 140 s on 2
    # GPUs), running again at 40; preempted at 60, before its next checkpoint (at 80):
    # back to the resize's 140 s on 2 GPUs, started again at once on 4: 70 s, 60 + 70.
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1, 2, 3)],
        30: [resize("e", 0, 1)],
        60: [Preempt("e", ""), on("e", 0, 1, 2, 3)],
    }
    options = SimOptions(elastic=1.0, resize_overhead_s=10.0, checkpoint_interval_s=40.0)
    assert by_id(run(steps, options)) == {"e": (0, 130)}


# ---- what is held while it restarts ------------------------------------------------------


def test_a_grow_holds_the_new_gpus_from_the_decision() -> None:
    # A launch onto a GPU it grows into stops the replay, during the restart too.
    b = [job("b", 0, 50)]
    steps: dict[float, list[Action]] = {0: [on("e", 0, 1)], 50: [resize("e", 0, 1, 2, 3)]}
    result = run(steps)
    assert result.ledger.series == [(0, 2), (50, 4), (135, 0)]
    taken = "Launch of guaranteed job b on GPU n0-g3, which guaranteed job e holds"
    with pytest.raises(SimError, match=taken):
        run({**steps, 55: [on("b", 3)]}, extra=b)
    with pytest.raises(SimError, match=taken):  # in the same plan: resizes apply first
        run({**steps, 50: [on("b", 3), *steps[50]]}, extra=b)


def test_a_shrink_frees_the_gpus_it_gives_up_only_after_the_overhead() -> None:
    # b's launch onto them is refused (being freed, as by a preemption) until 50.
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1, 2, 3)],
        40: [resize("e", 0, 1), on("b", 2, 3)],
        45: [on("b", 2, 3)],
        50: [on("b", 2, 3)],
    }
    result = run(steps, extra=[job("b", 0, 50, gpus=2)])
    assert result.ledger.refused == {"launch on GPUs still being freed": 2}
    assert by_id(result) == {"e": (0, 170), "b": (50, 100)}
    assert result.ledger.series == [(0, 4), (100, 2), (170, 0)]
    # A GPU it keeps is still its own: a launch there stops the replay.
    with pytest.raises(SimError, match="job b on GPU n0-g1, which guaranteed job e holds"):
        run({**steps, 45: [on("b", 1, 2)]}, extra=[job("b", 0, 50, gpus=2)])


def test_the_policy_sees_a_resizing_job_and_then_its_new_count() -> None:
    seen: dict[float, PlacedJob] = {}
    free: dict[float, int] = {}
    attained: dict[float, float] = {}
    usage: dict[float, float] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        if not snapshot.placed:
            return
        [seen[now]] = snapshot.placed
        free[now] = len(free_capacity(snapshot)["n0"].free_gpus)
        attained[now] = View.build(snapshot, now, Settings()).attained(seen[now])
        usage[now] = snapshot.usage.queues.get("default", 0.0)

    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1)],
        20: [],
        50: [resize("e", 0, 1, 2, 3)],
        55: [],
        70: [],
    }
    run(steps, observe=observe)
    before, moving, after = seen[20], seen[55], seen[70]
    assert (before.request, before.gpu_range, before.state) == (
        Request(2, 0.0, 0),
        (2, 4),
        "running",
    )
    assert free[20] == 2
    assert (moving.state, moving.state_since, moving.started_at) == ("migrating", 50, 0)
    assert moving.shards == (Shard("n0", gpus(0, 1)),)
    assert moving.moving_to == (Shard("n0", gpus(0, 1, 2, 3)),)
    assert moving.request.gpus == 2 and not moving.stoppable
    assert free[55] == 0  # its own two and the two it grows into
    assert (after.state, after.state_since, after.started_at) == ("running", 60, 0)
    assert (after.shards, after.moving_to) == ((Shard("n0", gpus(0, 1, 2, 3)),), ())
    assert (after.request, after.gpu_range) == (Request(4, 0.0, 0), (2, 4))
    assert (after.attained_s, after.attained_as_of) == (100, 60)
    # Service: 2 GPUs x time until the decision, nothing while it restarts, then 4 x time.
    assert (attained[20], attained[55], attained[70]) == (40, 100, 140)
    # Usage is charged for 2 GPUs until it runs on 4 (no decay to speak of).
    assert usage[20] == pytest.approx(40.0)
    assert usage[55] == pytest.approx(110.0)
    assert usage[70] == pytest.approx(120.0 + 40.0)


def test_the_queue_is_charged_for_the_count_the_job_runs_on() -> None:
    result = run({0: [on("e", 0, 1)], 50: [resize("e", 0, 1, 2, 3)]})
    # 2 GPUs from 0 to 60 (the restart too), 4 from 60 to 135.
    assert result.ledger.queue_gpu_seconds["default"] == 2 * 60 + 4 * 75


def test_the_service_history_counts_the_gpus_each_job_had() -> None:
    # What a learning policy reads when a job finishes: every unfinished job's service
    # so far, here e's at 40 (2 GPUs x 40 s), through its restart (50-60) and at 70
    # (100 before its grow, then 4 x 10).
    steps: dict[float, list[Action]] = {0: [on("e", 0, 1)], 50: [resize("e", 0, 1, 2, 3)]}
    sim = simulation({**steps, 40: [], 70: []})
    seen: dict[float, list[float]] = {}
    plan = sim.profile.plan

    def observed(snapshot: Snapshot, now: float) -> Plan:
        seen[now] = list(sim._service_so_far(now))
        return plan(snapshot, now)

    sim.profile = dataclasses.replace(sim.profile, plan=observed)
    sim.run()
    assert (seen[40], seen[50], seen[60], seen[70]) == ([80.0], [100.0], [100.0], [140.0])


def test_a_spread_job_shrunk_onto_one_node_runs_at_full_speed_there() -> None:
    # On two nodes at half speed: 40 s do 20 of its 100 s on 4 GPUs (80 GPU-seconds); 10
    # s restarting on n0's two; the 320 GPU-seconds left on 2 GPUs at full speed: 160 s.
    spread = Launch("e", (Shard("n0", gpus(0, 1)), Shard("n1", gpus(0, 1, node="n1"))), "")
    steps: dict[float, list[Action]] = {0: [spread], 40: [resize("e", 0, 1)]}
    jobs = [job("e", 0, 100, gpus=4)]
    result = simulate(jobs, "2x4", script(steps), ELASTIC, LocalityModel(default=0.5))
    assert by_id(result) == {"e": (0, 210)}
    assert result.ledger.series == [(0, 4), (50, 2), (210, 0)]


def test_a_stopped_resizing_job_is_cancelled_when_the_restart_is_over() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1)],
        50: [resize("e", 0, 1, 2, 3)],
        55: [Stop("e", "")],
    }
    sim = simulation(steps)
    result = sim.run()
    [e] = result.jobs
    assert (e.state, e.finish_s, sim.jobs[0].ended_at) == ("cancelled", None, 60)
    assert result.ledger.series == [(0, 2), (50, 4), (60, 0)]
    assert not sim.gpu_owner and not sim.holding


# ---- refused, and policy bugs --------------------------------------------------------


def test_resizes_that_cannot_apply_are_refused_and_counted() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1), on("one", 2)],
        10: [
            resize("w", 3),  # pending
            Resize("one", 1, "", "n0", gpus(2)),  # not elastic: one GPU
            resize("e", 0),  # below its least (2)
            Resize("e", 5, "", "n0", gpus(0, 1, 2, 3)),  # above its most (4)
            Resize("e", 3, "", "n0", gpus(0, 1)),  # 3 GPUs, 2 named
            suspend("e"),
        ],
        20: [resize("e", 0, 1, 3), resume("e")],  # suspended (resumes after the resizes)
        30: [resize("e", 0, 1, 3)],
        35: [resize("e", 0, 1)],  # resizing
    }
    extra = [job("one", 0, 100), job("w", 0, 10, gpus=4)]
    result = run(steps, extra=extra)
    assert result.ledger.refused == {
        "resize of a pending job": 1,
        "resize of a job that is not elastic": 1,
        "resize outside the job's GPU range": 2,
        "resize naming more or fewer GPUs than its count": 1,
        "resize of a suspended job": 1,
        "resize of a migrating job": 1,
    }
    assert result.ledger.actions["Resize"] == 1
    # 10 s on 2 GPUs, suspended until 20, 10 more on 2 (40 GPU-seconds), grown at 30
    # to 3: 360 left, 120 s from 40.
    assert by_id(result)["e"] == (0, 160)


def test_a_job_not_elastic_is_refused_without_the_option() -> None:
    steps: dict[float, list[Action]] = {0: [on("e", 0, 1, 2, 3)], 10: [resize("e", 0, 1)]}
    result = run(steps, SimOptions())
    assert result.ledger.refused == {"resize of a job that is not elastic": 1}
    assert by_id(result) == {"e": (0, 100)}


def test_a_resize_onto_gpus_a_preemption_still_frees_is_refused() -> None:
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1), on("b", 2, 3)],
        30: [Preempt("b", ""), resize("e", 0, 1, 2, 3)],
    }
    options = SimOptions(elastic=1.0, resize_overhead_s=10.0, preempt_overhead_s=5.0)
    result = run(steps, options, extra=[job("b", 0, 50, gpus=2)])
    assert result.ledger.refused == {"resize on GPUs still being freed": 1}
    assert by_id(result)["e"] == (0, 200)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (resize("e", 0, 1, 2), "guaranteed job e on GPU n0-g2, which guaranteed job b holds"),
        (Resize("e", 3, "", "n0", gpus(0, 1, 1)), "job e names 3 GPUs .2 distinct."),
        (Resize("e", 3, "", "n1", (*gpus(0, 1), "n1-g0")),
         "job e names GPU n0-g0, which is not on node n1"),
        (Resize("e", 2, "", "n9", gpus(0, 1)), "job e to unknown node 'n9'"),
        (Resize("e", 2, "", None, gpus(0, 1)), "job e to unknown node None"),
        (resize("zz", 0, 1), "unknown job 'zz'"),
    ],
    ids=["held", "twice", "other-node", "unknown-node", "no-node", "unknown-job"],
)  # fmt: skip
def test_a_resize_the_cluster_cannot_mean_stops_the_replay(action: Resize, message: str) -> None:
    steps: dict[float, list[Action]] = {0: [on("e", 0, 1), on("b", 2)], 30: [action]}
    with pytest.raises(SimError, match=f"policy timeslice-script: Resize of {message}"):
        run(steps, extra=[job("b", 0, 100)], shape="2x4")


@pytest.mark.parametrize(
    ("launch", "message"),
    [
        (on("e", 0), "Launch of job e names 1 GPUs .1 distinct.; it asks for 2 to 4"),
        (on("r", 0, 1, 2), "Launch of job r names 3 GPUs .3 distinct.; it asks for 4$"),
    ],
    ids=["below-least", "not-elastic"],
)
def test_a_launch_on_too_few_gpus_stops_the_replay(launch: Launch, message: str) -> None:
    # r is a 4-GPU job too, but the only elastic one is e (the draw at 0.8 says so).
    options = SimOptions(elastic=0.8)
    ranges = [gpu_range(i, 4, 0.8) for i in range(2)]
    assert ranges == [(2, 4), None]
    with pytest.raises(SimError, match=message):
        run({0: [launch]}, options, extra=[job("r", 0, 100, gpus=4)])


def test_a_migrate_of_a_smaller_elastic_job_names_its_count() -> None:
    # e runs on 2 GPUs: a move takes 2, and it runs on them at the same pace.
    steps: dict[float, list[Action]] = {
        0: [on("e", 0, 1)],
        50: [Migrate("e", "n1", gpus(0, 1, node="n1"), "")],
    }
    assert by_id(run(steps, shape="2x4")) == {"e": (0, 200 + 30)}  # the move's default 30 s
    bad: dict[float, list[Action]] = {
        **steps,
        50: [Migrate("e", "n1", gpus(0, 1, 2, 3, node="n1"), "")],
    }
    with pytest.raises(SimError, match=r"job e names 4 GPUs \(4 distinct\); it has 2"):
        run(bad, shape="2x4")


# ---- which jobs are elastic --------------------------------------------------------------


def test_the_option_marks_the_same_multi_gpu_jobs_whatever_the_profile() -> None:
    jobs = tuple(job(f"j{i}", i, 100, gpus=(1, 2, 3, 4, 8)[i % 5]) for i in range(200))
    trace = Trace("t.csv", "csv", jobs, 0, False)
    shape = ClusterShape(2, 8, None)

    def ranges(policy: str, fraction: float) -> list[tuple[int, int] | None]:
        sim = Simulation(trace, shape, profile(policy), SimOptions(elastic=fraction))
        return [j.gpu_range for j in sim.jobs]

    half = ranges("fifo", 0.5)
    assert half == ranges("gandiva", 0.5) == ranges("tiresias", 0.5)
    # Only jobs of more than one GPU, each from half its GPUs (rounded up) to all.
    elastic = {j.gpus: r for j, r in zip(jobs, half, strict=True) if r is not None}
    assert elastic == {2: (1, 2), 3: (2, 3), 4: (2, 4), 8: (4, 8)}
    multi = [r for j, r in zip(jobs, half, strict=True) if j.gpus > 1]
    assert 0.35 < sum(r is not None for r in multi) / len(multi) < 0.65
    # None at 0, all of them at 1; the jobs elastic at 0.3 are among those at 0.5.
    assert ranges("fifo", 0.0) == [None] * 200
    assert all(
        (r is not None) == (j.gpus > 1) for j, r in zip(jobs, ranges("fifo", 1.0), strict=True)
    )
    fewer = ranges("fifo", 0.3)
    assert all(r is None or r == h for r, h in zip(fewer, half, strict=True))
    assert sum(r is not None for r in fewer) < sum(r is not None for r in half)


def test_the_pending_view_carries_the_range_and_the_most_gpus() -> None:
    seen: list[tuple[str, Request, tuple[int, int] | None]] = []

    def observe(snapshot: Snapshot, now: float) -> None:
        seen.extend((p.job_id, p.request, p.gpu_range) for p in snapshot.pending if now == 0)

    run({0: [], 1: []}, extra=[job("one", 0, 10)], observe=observe)
    assert seen == [("e", Request(4, 0.0, 0), (2, 4)), ("one", Request(1, 0.0, 0), None)]


def test_a_fraction_outside_zero_to_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="--elastic: expected a fraction in"):
        SimOptions(elastic=1.5)


# ---- a replay with the gandiva profile -----------------------------------------------


def synthetic_trace(path: Path) -> Path:
    """16 jobs of 1 to 8 GPUs arriving within hours, on one node of 8 GPUs."""
    r = random.Random(21)
    rows, t = ["job_id,submit_time,duration,num_gpu"], 0
    for i in range(16):
        t += r.randint(0, 2400)
        rows.append(f"j{i},{t},{r.choice([1800, 3600, 7200])},{r.choice([1, 2, 4, 8])}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_gandiva_grows_and_shrinks_elastic_jobs_in_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = synthetic_trace(tmp_path / "elastic.csv")
    out = tmp_path / "out.json"
    main(["sim", "--trace", str(trace), "--format", "csv", "--cluster", "1x8",
          "--policy", "gandiva", "--elastic", "0.5", "--resize-overhead", "20",
          "--json", str(out)])  # fmt: skip
    assert "resizes" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["options"]["elastic"], data["options"]["resize_overhead_s"]) == (0.5, 20)
    [gandiva] = data["runs"]
    assert gandiva["finished"] == 16
    assert gandiva["resizes"] > 0 and gandiva["actions"]["Resize"] == gandiva["resizes"]
    assert not gandiva["refused_actions"] and not gandiva["unsupported_actions"]


def test_the_options_reach_the_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from schedd.sim import replay

    given: list[SimOptions] = []

    def record(*args: object) -> list[object]:
        given.append(args[3])  # type: ignore[arg-type]
        return []

    monkeypatch.setattr(replay, "replay", record)
    trace = synthetic_trace(tmp_path / "elastic.csv")
    main(["sim", "--trace", str(trace), "--format", "csv", "--cluster", "1x8",
          "--elastic", "0.25", "--resize-overhead", "7.5"])  # fmt: skip
    [options] = given
    assert (options.elastic, options.resize_overhead_s) == (0.25, 7.5)
    main(["sim", "--trace", str(trace), "--format", "csv", "--cluster", "1x8"])
    assert (given[1].elastic, given[1].resize_overhead_s) == (0.0, 30.0)
