"""Packing in the replay (Gandiva; sim/packing.py), on scripts worked out by hand.

The scripts are test_sim_timeslice's, plus the rule the policy's `decide.pack` follows
for a packed job whose partner left (it is resumed as its GPUs' holder as soon as they
are free). Each job's utilisation is given; two packed jobs run at
min(1, 100 / (u1 + u2)) x (1 - 0.1) of their speed alone: 0.9 for 30 % and 40 %, and
100 / 120 x 0.9 = 0.75 for 60 % and 60 % (exact in binary: those runs are compared
exactly)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from schedd.cli import main
from schedd.policy import Profile, build
from schedd.policy.actions import Action, Launch, Migrate, Plan, Preempt, Resize, Resume, Stop
from schedd.policy.profiles import BUILTIN
from schedd.policy.snapshot import PACKED, PlacedJob, Shard, Snapshot, free_capacity
from schedd.sim import report
from schedd.sim.engine import SimError, SimOptions, Simulation
from schedd.sim.metrics import summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.sharing import SharingModel
from schedd.sim.traces import Trace
from tests.unit.test_sim_engine import by_id, job, simulate
from tests.unit.test_sim_timeslice import Observer, resume, script, suspend

G0 = (Shard("n0", ("n0-g0",)),)
G1 = (Shard("n0", ("n0-g1",)),)
Steps = dict[float, list[Action]]


@dataclasses.dataclass(frozen=True, slots=True)
class Given(SharingModel):
    """Utilisation given per job, in trace order."""

    given: tuple[int, ...] = ()

    def utilization(self, seq: int) -> int:
        return self.given[seq]


def utils(*given: int, **options: float) -> SimOptions:
    return SimOptions(sharing=Given(given=given), **options)  # type: ignore[arg-type]


def on(job_id: str, shards: tuple[Shard, ...] = G0) -> Launch:
    return Launch(job_id, shards, "")


def pack(job_id: str, beside: str) -> Resume:
    return Resume(job_id, "they use little of the GPU", beside=beside)


def taking_over(steps: Steps, observe: Observer | None = None) -> Profile:
    """The script, and a packed job whose GPUs are free is resumed as their holder."""
    scripted = script(steps, observe)

    def plan(snapshot: Snapshot, now: float) -> Plan:
        made = scripted.plan(snapshot, now)
        free = {g.uuid for cap in free_capacity(snapshot).values() for g in cap.free_gpus}
        own = [
            Resume(j.job_id, "its partner left")
            for j in snapshot.placed
            if j.state == PACKED and free.issuperset(j.gpu_uuids)
        ]
        return Plan([*made.actions, *own], recheck_at=made.recheck_at)

    return Profile("pack-script", plan, pending_window=100)


# a runs 0-10, b 10-20 (a suspended), then a packed beside b from 20: 90 s of work left
# to a, and b's work less 10.
PACKED_AT_20: Steps = {
    0: [on("a")],
    10: [suspend("a"), on("b")],
    20: [pack("a", "b")],
}


def run(
    steps: Steps,
    options: SimOptions,
    work: tuple[float, float] = (100, 100),
    shape: str = "1x1",
    observe: Observer | None = None,
) -> SimResult:
    jobs = [job("a", 0, work[0]), job("b", 0, work[1])]
    return simulate(jobs, shape, taking_over(steps, observe), options)


# ---- the interference model ---------------------------------------------------------


def test_two_little_used_jobs_packed_run_at_nine_tenths_and_the_survivor_takes_over() -> None:
    # 30 % + 40 %: at 0.9 each. b (60 s) has 50 s left at 20: done at 20 + 50 / 0.9;
    # a (100 s, 90 left) has done 50 by then, and runs its 40 left alone, as holder.
    seen: dict[float, list[PlacedJob]] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        seen.setdefault(now, list(snapshot.placed))

    result = run(PACKED_AT_20, utils(30, 40), work=(100, 60), observe=observe)
    b_end = 20 + 50 / 0.9
    times = by_id(result)
    assert times["b"] == (10, pytest.approx(b_end, rel=1e-12))  # type: ignore[comparison-overlap]
    assert times["a"] == (0, pytest.approx(b_end + 40, rel=1e-12))  # type: ignore[comparison-overlap]
    # The engine planned at b's end, saw a packed alone, and a became the holder then.
    [alone] = seen[times["b"][1]]  # type: ignore[index]
    assert (alone.job_id, alone.state, alone.progress_ratio) == ("a", "packed", 1.0)
    s = summarize(result)
    assert s.actions == {"Launch": 2, "Suspend": 1, "Pack": 1, "Resume": 1}
    assert (s.packs, s.suspensions) == (1, 1)
    assert [(j.job_id, j.packs) for j in result.jobs] == [("a", 1), ("b", 0)]
    assert not s.refused_actions
    # The GPU was held all along (once, while two ran on it); its use: a's 30 %, b's
    # 40 %, the pair's work (30 + 40) x 0.9 = 63 %, then a's 30 % again.
    assert result.ledger.series == [(0, 1), (times["a"][1], 0)]
    busy = [(t, round(b, 9)) for t, b in result.ledger.busy_series]
    assert busy == [(0, 0.3), (10, 0.4), (20, 0.63), (b_end, 0.3), (times["a"][1], 0.0)]


def test_two_busier_jobs_packed_run_at_the_share_of_the_gpu_they_get() -> None:
    # 60 % + 60 %: 100 / 120 x 0.9 = 0.75 each; both have 90 s left at 20.
    result = run(PACKED_AT_20, utils(60, 60))
    assert by_id(result) == {"a": (0, 140), "b": (10, 140)}
    busy = [(t, round(b, 9)) for t, b in result.ledger.busy_series]
    assert busy == [(0, 0.6), (20, 0.9), (140, 0.0)]  # (60 + 60) x 0.75 = 90 %
    assert summarize(result).allocation_avg == 1.0
    # Both charged for the GPU while packed: a 0-10 and 20-140, b 10-140.
    assert result.ledger.queue_gpu_seconds["default"] == 130 + 130


def test_the_slowdown_is_an_option() -> None:
    # Without it, 30 % + 40 % fit in the GPU: both run as fast as alone.
    result = run(PACKED_AT_20, utils(30, 40, pack_slowdown=0.0), work=(100, 60))
    assert by_id(result) == {"a": (0, 110), "b": (10, 70)}
    assert SimOptions().pack_slowdown == 0.1
    with pytest.raises(ValueError, match=r"--pack-slowdown: expected 0 <= x < 1, got 1\.0"):
        SimOptions(pack_slowdown=1.0)


# ---- what the policy sees -------------------------------------------------------------


def test_the_views_show_the_pack_and_the_progress_ratios() -> None:
    seen: dict[float, dict[str, PlacedJob]] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        seen.setdefault(now, {j.job_id: j for j in snapshot.placed})

    steps: Steps = {**PACKED_AT_20, 15: [], 30: [], 35: [], 40: [suspend("a")], 45: []}
    run(steps, utils(60, 60), observe=observe)
    before, packed, later = seen[15], seen[30], seen[35]
    assert (before["a"].state, before["a"].progress_ratio) == ("suspended", None)
    assert (before["b"].state, before["b"].progress_ratio) == ("running", 1.0)
    a, b = packed["a"], packed["b"]
    assert (a.state, a.state_since, a.started_at, a.packable) == ("packed", 20, 0, True)
    assert (a.progress_ratio, b.progress_ratio) == (0.75, 0.75)
    # a's service as of now (10 s before its suspension, 10 since the pack); b's as of
    # its start, as for any running job.
    assert (a.attained_s, a.attained_as_of) == (20.0, None)
    assert (b.attained_s, b.attained_as_of) == (0.0, 10)
    assert a.shards == b.shards == G0
    # b's view is kept from instant to instant; a's is made again (its service grows).
    assert later["b"] is b
    assert later["a"] is not a and later["a"].attained_s == 25.0
    # Unpacked at 40: a suspended again, not to be packed again; b alone at full speed.
    a, b = seen[45]["a"], seen[45]["b"]
    assert (a.state, a.state_since, a.packable, a.progress_ratio) == ("suspended", 40, False, None)
    assert (a.attained_s, b.progress_ratio) == (30.0, 1.0)


def test_an_unpacked_job_takes_turns_again_and_may_be_packed_in_a_new_attempt() -> None:
    # Packed 20-40 at 0.75: 15 s of work each, 75 left to each. a unpacked at 40; b
    # runs alone to 50 (65 left); a has the GPU 50-125 (its 75 s), b 125-190.
    seen: dict[float, PlacedJob] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        for j in snapshot.placed:
            if j.job_id == "a":
                seen.setdefault(now, j)

    steps: Steps = {
        **PACKED_AT_20,
        40: [suspend("a")],
        50: [suspend("b"), resume("a")],
        60: [],
        125: [resume("b")],
    }
    result = run(steps, utils(60, 60), observe=observe)
    assert by_id(result) == {"a": (0, 125), "b": (10, 190)}
    assert (seen[60].state, seen[60].packable) == ("running", False)  # for this attempt
    s = summarize(result)
    assert s.actions == {"Launch": 2, "Suspend": 2, "Pack": 1, "Unpack": 1, "Resume": 2}
    assert (s.packs, s.suspensions) == (1, 2)
    assert report.as_json(s)["packs"] == 1
    assert "packs" in report.overview([s], "s").splitlines()[0]
    # A new attempt (preempted and launched again) may be packed again.
    again: Steps = {
        **PACKED_AT_20,
        40: [suspend("a")],
        50: [suspend("b"), resume("a")],
        55: [Preempt("a", ""), on("a", G1)],
        60: [],
    }
    seen.clear()
    run(again, utils(60, 60), shape="1x2", observe=observe)
    assert (seen[60].state, seen[60].packable) == ("running", True)


def test_without_packs_the_table_has_no_column() -> None:
    summary = summarize(run({0: [on("a")]}, utils(60, 60)))
    assert summary.packs == 0 and "packs" not in report.overview([summary], "s")
    assert report.as_json(summary)["packs"] == 0


def test_service_and_run_time_count_the_packed_time() -> None:
    so_far: list[float] = []

    def observe(snapshot: Snapshot, now: float) -> None:
        if now == 30:  # what the Gittins history reads when a job finishes
            so_far.extend(sim._service_so_far(now))

    trace = Trace("t.csv", "csv", (job("a", 0, 100), job("b", 0, 100)), 0, False)
    policy = taking_over({**PACKED_AT_20, 30: []}, observe)
    sim = Simulation(trace, ClusterShape(1, 1, None), policy, utils(60, 60))
    sim.run()
    assert sorted(so_far) == [20.0, 20.0]  # a: 10 + 10 packed; b: 20 since its launch
    a, b = sim.jobs
    # a: 10 s before its suspension, 120 packed; b: 130 s from its launch.
    assert (a.attained_gpu_s, a.run_time_s) == (130.0, 130.0)
    assert (b.attained_gpu_s, b.run_time_s) == (130.0, 130.0)
    assert not sim.gpu_packed and not sim.gpu_owner and not sim.holding


# ---- the partner leaves ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("at_40", "options", "a_holder_from", "b_end"),
    [
        # Suspended: a runs alone from 40 and takes the GPU at once (a plan again then).
        ([suspend("b")], {}, 40, None),
        # Stopped: the same; b is cancelled.
        ([Stop("b", "")], {}, 40, None),
        # Preempted with an overhead of 5 s: b holds the GPU, idle, until 45; a runs
        # alone from 40 and takes the GPU when b's preemption is over.
        ([Preempt("b", "")], {"preempt_overhead_s": 5.0}, 45, None),
        # Migrated to g1 (10 s): a alone from 40, holder from 50 when b's move is over;
        # b's 75 s left run on g1 from 50.
        ([Migrate("b", "n0", ("n0-g1",), "relieve")], {"migrate_overhead_s": 10.0}, 50, 125),
    ],
    ids=["suspended", "stopped", "preempted", "migrated"],
)
def test_a_packed_job_whose_partner_leaves_runs_alone_then_holds_the_gpus(
    at_40: list[Action], options: dict[str, float], a_holder_from: float, b_end: float | None
) -> None:
    # Packed 20-40 at 0.75: 75 s of work left to a at 40, run alone: done at 115.
    seen: dict[float, dict[str, PlacedJob]] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        seen[now] = {j.job_id: j for j in snapshot.placed}  # the last plan's at `now`

    steps: Steps = {**PACKED_AT_20, 40: at_40, 45: [], 60: []}
    result = run(steps, utils(60, 60, **options), shape="1x2", observe=observe)
    times = by_id(result)
    assert times["a"] == (0, 115)
    assert times["b"][1] == b_end
    a = seen[60]["a"]
    assert (a.state, a.state_since, a.progress_ratio) == ("running", a_holder_from, 1.0)
    if a_holder_from >= 45:  # alone in the packed slot meanwhile, at full speed
        assert (seen[45]["a"].state, seen[45]["a"].progress_ratio) == ("packed", 1.0)
    assert summarize(result).actions["Resume"] == 1  # the take-over
    busy = [(t, round(v, 9)) for t, v in result.ledger.busy_series]
    # The pair's 90 % until 40; a's 60 % then: b, preempted or migrating, computes
    # nothing while it holds the GPU (before 2026-11-29 a preempted one counted its
    # own until its overhead was over).
    assert busy[2] == (40, 0.6)


def test_a_partner_shrunk_onto_part_of_the_gpus_stays_packed_with_the_job_there() -> None:
    """Two elastic 2-GPU jobs packed on g0 and g1 at 0.75; b shrinks to g0 at 40 (10 s):
    a runs alone meanwhile, then at its slowest GPU's pace, g0's, beside b. Its GPUs
    are not all free, so the policy does not take them over: a stays packed."""
    both = (Shard("n0", ("n0-g0", "n0-g1")),)
    steps: Steps = {
        0: [on("a", both)],
        10: [suspend("a"), on("b", both)],
        20: [pack("a", "b")],
        40: [Resize("b", 1, "shrink", "n0", ("n0-g0",))],
    }
    jobs = [job("a", 0, 80, gpus=2), job("b", 0, 100, gpus=2)]
    options = utils(60, 60, elastic=1.0, resize_overhead_s=10.0)
    result = simulate(jobs, "1x2", taking_over(steps), options)
    # a: 70 s left at 20, 55 at 40, 45 at 50, at 0.75 from then: done at 110. b: 75 s
    # left on 2 GPUs at 40, 150 on one; 45 done at 0.75 by 110, 105 alone: done at 215.
    assert by_id(result) == {"a": (0, 110), "b": (10, 215)}
    assert "Resume" not in summarize(result).actions  # no take-over


@pytest.mark.parametrize(
    ("a_work", "at_40", "a_state"),
    [(25, [], "finished"), (100, [Stop("a", "")], "cancelled")],
    ids=["packed-job-finishes", "packed-job-stopped"],
)
def test_the_partner_runs_alone_again_when_the_packed_job_ends(
    a_work: float, at_40: list[Action], a_state: str
) -> None:
    # Packed 20-40 at 0.75: 15 s of work each; a (25 s) ends at 40, or is stopped then;
    # b's 75 s left run alone: done at 115.
    seen: dict[float, dict[str, PlacedJob]] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        seen[now] = {j.job_id: j for j in snapshot.placed}

    steps: Steps = {**PACKED_AT_20, 30: [], 40: at_40, 45: []}
    result = run(steps, utils(60, 60), work=(a_work, 100), observe=observe)
    assert by_id(result)["b"] == (10, 115)
    assert [j.state for j in result.jobs] == [a_state, "finished"]
    assert seen[30]["b"].progress_ratio == 0.75
    assert list(seen[45]) == ["b"] and seen[45]["b"].progress_ratio == 1.0
    busy = [(t, round(v, 9)) for t, v in result.ledger.busy_series]
    assert busy == [(0, 0.6), (20, 0.9), (40, 0.6), (115, 0.0)]
    assert result.ledger.series == [(0, 1), (115, 0)]


def test_a_packed_job_left_alone_holds_its_gpu_until_the_policy_acts() -> None:
    # No take-over here: b suspended at 40, a runs packed alone (at full speed: its 75 s
    # left end at 115), and its GPU counts as allocated and busy with a's 60 %.
    seen: dict[float, tuple[PlacedJob, int]] = {}

    def observe(snapshot: Snapshot, now: float) -> None:
        for j in snapshot.placed:
            if j.job_id == "a":
                seen[now] = (j, len(free_capacity(snapshot)["n0"].free_gpus))

    steps: Steps = {**PACKED_AT_20, 30: [], 40: [suspend("b")], 50: []}
    jobs = [job("a", 0, 100), job("b", 0, 100)]
    result = simulate(jobs, "1x1", script(steps, observe), utils(60, 60))
    assert by_id(result)["a"] == (0, 115)
    a, free = seen[50]
    assert (a.state, a.progress_ratio, free) == ("packed", 1.0, 1)  # a holds no GPU
    assert seen[30][1] == 0  # b's, while b runs
    assert result.ledger.series == [(0, 1), (115, 0)]
    busy = [(t, round(v, 9)) for t, v in result.ledger.busy_series]
    assert busy == [(0, 0.6), (20, 0.9), (40, 0.6), (115, 0.0)]


# ---- what cannot be applied ----------------------------------------------------------


def test_packs_that_cannot_apply_are_refused_and_counted() -> None:
    # a, c and d take turns with b on g0; e runs on g1.
    jobs = [job(j, 0, 100) for j in "abcde"]
    steps: Steps = {
        0: [on("a"), on("e", G1)],
        10: [suspend("a"), on("b")],
        20: [suspend("b"), on("c")],
        30: [suspend("c"), on("d")],
        40: [
            pack("e", "d"),  # e runs
            pack("a", "b"),  # b is suspended
            pack("a", "e"),  # e holds g1, not a's g0
            pack("a", "d"),  # packed
            pack("c", "d"),  # a is packed beside d already
            pack("b", "a"),  # a is packed (once resumes apply, after the rest)
        ],
        50: [Preempt("a", ""), Migrate("a", "n0", ("n0-g1",), "")],  # a packed job stays
    }
    result = simulate(jobs, "1x2", taking_over(steps), utils(20, 20, 20, 20, 20))
    assert result.ledger.refused == {
        "pack of a running job": 1,
        "pack beside a suspended job": 1,
        "pack beside a job that does not hold exactly its GPUs": 1,
        "pack beside a job another job is packed with": 1,
        "pack beside a packed job": 1,
        "preempt of a packed job": 1,
        "migrate of a packed job": 1,
    }
    assert result.ledger.actions["Pack"] == 1
    assert summarize(result).packs == 1


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ({20: [pack("x", "b")]}, "Resume of unknown job 'x'"),
        ({20: [pack("a", "x")]}, "Resume of job a beside unknown job 'x'"),
        # Its partner still runs there: the GPUs are not free for it to hold.
        (
            {20: [pack("a", "b")], 30: [resume("a")]},
            "Resume of guaranteed job a on GPU n0-g0, which guaranteed job b holds",
        ),
        # b ends at 60 (30 s of work left at 20, at 0.75): a runs packed alone; a launch
        # or a resume there is a policy's mistake (it resumes a as the holder first).
        (
            {20: [pack("a", "b")], 60: [on("d")]},
            "Launch of job d on GPU n0-g0, where job a runs packed",
        ),
        ({20: [pack("a", "b")], 60: [resume("c")]}, "Resume of job c on GPU n0-g0, where job a"),
    ],
    ids=["unknown-job", "unknown-partner", "resume-beside-partner", "launch", "resume-there"],
)
def test_a_policy_mistake_stops_the_replay(steps: Steps, message: str) -> None:
    # c, a and b take turns on g0; d waits.
    base: Steps = {
        0: [on("c")],
        5: [suspend("c"), on("a")],
        10: [suspend("a"), on("b")],
    }
    jobs = [job("a", 0, 100), job("b", 0, 40), job("c", 0, 100), job("d", 0, 100)]
    with pytest.raises(SimError, match=message):
        simulate(jobs, "1x2", script({**base, **steps}), utils(60, 60, 60, 60))


# ---- the gandiva profile with packing ------------------------------------------------


@pytest.mark.parametrize("slowdown", [0.1, 0.6])
def test_gandiva_with_packing_replays_a_trace(slowdown: float) -> None:
    """Bursts of one-GPU jobs on 2x2 GPUs that use 10-40 % of them: they take turns,
    and pairs that fit in a GPU are packed; the replay runs to its end. At a slowdown
    of 0.1 a pack (at most 90 % together) runs each job at 0.9, better than turns; at
    0.6, at 0.4: the policy undoes every pack it looks at again."""
    rng = random.Random(7)
    jobs = [
        job(f"j{i}", 600.0 * (i // 6) + rng.randint(0, 60), rng.randint(300, 3000))
        for i in range(30)
    ]
    spec = dataclasses.replace(BUILTIN["gandiva"], decide=("timeslice", "pack"))
    options = SimOptions(sharing=SharingModel(10, 40), pack_slowdown=slowdown)
    trace = Trace("t.csv", "csv", tuple(jobs), 0, False)
    sim = Simulation(trace, ClusterShape(2, 2, None), build("gandiva", spec), options)
    result = sim.run()
    s = summarize(result)
    assert s.finished == 30
    assert s.packs > 0 and s.actions["Pack"] == s.packs
    # At 0.6 every pack still on when the policy looks again (pack_check_s after it
    # began) is undone; one whose partner ended first is not judged.
    unpacks = s.actions.get("Unpack", 0)
    assert unpacks == 0 if slowdown < 0.5 else s.packs - 2 <= unpacks <= s.packs
    assert s.suspensions > 0
    assert not s.refused_actions
    # Everything held was given back, and the utilisation figure came back to 0.
    assert not (sim.gpu_owner or sim.gpu_packed or sim.holding)
    assert result.ledger.allocated == 0 and abs(result.ledger.busy) < 1e-9
    assert 0 < s.utilization_avg <= s.allocation_avg <= 1
    # A packed job runs: every job's service is its GPU times its run time.
    assert all(j.attained_gpu_s == pytest.approx(j.run_time_s) for j in sim.jobs)
    # Without packing, the same trace takes turns only; packing with little loss
    # finishes the jobs sooner.
    turns_only = dataclasses.replace(BUILTIN["gandiva"], decide=("timeslice",))
    turns = summarize(
        Simulation(trace, ClusterShape(2, 2, None), build("gandiva", turns_only)).run()
    )
    assert turns.packs == 0
    if slowdown < 0.5:
        assert s.jct_avg_s < turns.jct_avg_s


# ---- the command line ----------------------------------------------------------------


def test_the_option_reaches_the_json(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpu\na,0,60,1\n")
    out = tmp_path / "out.json"
    base = ["sim", "--trace", str(trace), "--format", "csv", "--cluster", "1x1"]
    main([*base, "--pack-slowdown", "0.25", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["options"]["pack_slowdown"] == 0.25
    assert data["runs"][0]["packs"] == 0
