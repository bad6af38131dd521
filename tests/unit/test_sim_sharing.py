"""GPU sharing in the replay (sim/sharing.py), on traces worked out by hand.

Every job keeps its GPUs 30 % busy (a utilisation range of 30-30): an opportunistic job
next to a guaranteed one runs at 0.7 of its speed, the guaranteed one at 0.95."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import Profile
from schedd.policy.actions import Action, Launch, Plan, Preempt, SetKind
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import Request, Shard, Snapshot
from schedd.sim.engine import SimOptions
from schedd.sim.jobs import SimJob
from schedd.sim.metrics import summarize
from schedd.sim.sharing import SharingError, SharingModel, parse_util_range
from tests.unit.test_sim_engine import by_id, first_fit, job, simulate

MARK = 1800.0  # antman's opportunistic_after_s
THIRTY = SimOptions(sharing=SharingModel(30, 30))


def test_a_job_waiting_past_the_mark_shares_then_runs_alone_and_is_upgraded() -> None:
    """g runs alone until o turns opportunistic at the mark and shares its GPU; g then
    runs at 0.95 and o at 0.7 until g ends; o finishes alone at full speed, upgraded."""
    result = simulate([job("g", 0, 4000), job("o", 0, 3000)], "1x1", "antman", THIRTY)
    g_end = MARK + (4000 - MARK) / 0.95
    o_done_by_then = (g_end - MARK) * 0.7
    times = by_id(result)
    assert times["g"] == (0.0, pytest.approx(g_end))
    assert times["o"] == (MARK, pytest.approx(g_end + 3000 - o_done_by_then))
    s = summarize(result)
    assert s.actions["SetKind opportunistic"] == 1
    assert s.actions["SetKind guaranteed"] == 1
    # Compute utilisation: 30 % alone, 30 + 30 x 0.7 = 51 % shared, then 30 % again.
    o_end = times["o"][1]
    assert o_end is not None
    busy = 0.3 * MARK + 0.51 * (g_end - MARK) + 0.3 * (o_end - g_end)
    assert s.utilization_avg == pytest.approx(busy / o_end)
    assert s.allocation_avg == pytest.approx(1.0)


def test_a_busy_gpu_is_not_shared() -> None:
    """At 60 % (above antman's mark of 50 %) o waits for g to end, opportunistic."""
    busy = SimOptions(sharing=SharingModel(60, 60))
    times = by_id(simulate([job("g", 0, 4000), job("o", 0, 1000)], "1x1", "antman", busy))
    assert times["o"] == (4000.0, 5000.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Chosen(SharingModel):
    """Utilisation given per job, in trace order."""

    given: tuple[int, ...] = ()

    def utilization(self, seq: int) -> int:
        return self.given[seq]


def test_a_guaranteed_job_lands_on_a_shared_gpu_and_slows_its_sharer() -> None:
    """Queue team may hold 1 GPU, which k holds: o turns opportunistic at the mark and
    shares the less used GPU, g's (20 % against k's 45 %: o runs at 0.8), and stays so
    after g ends (no upgrade beyond the max). h then takes that GPU, which counts as
    free for it, and o slows to 0.7."""
    capped = QueueSpec("team", max=Resources(gpus=1))
    options = SimOptions(sharing=Chosen(given=(45, 20, 30, 30)), queues=(capped,))
    jobs = [
        job("k", 0, 10_000, queue="team"),
        job("g", 0, 2000, queue="x"),
        job("o", 1, 5000, queue="team"),
        job("h", 2500, 1000, queue="x"),
    ]
    result = simulate(jobs, "1x2", "antman", options)
    times = by_id(result)
    g_end = MARK + 1 + (2000 - MARK - 1) / 0.95
    h_end = 2500 + 1000 / 0.95
    assert times["g"][1] == pytest.approx(g_end)
    assert times["h"] == (2500.0, pytest.approx(h_end))
    done = (g_end - MARK - 1) * 0.8 + (2500 - g_end) + (h_end - 2500) * 0.7
    assert times["o"] == (MARK + 1, pytest.approx(h_end + 5000 - done))
    assert times["k"] == (0.0, 10_000.0)  # never shared
    assert "SetKind guaranteed" not in summarize(result).actions


def test_profiles_without_sharing_replay_as_before() -> None:
    """No opportunistic jobs: the sharing model changes no time, only the utilisation."""
    jobs = [job("a", 0, 100, 2), job("b", 10, 50), job("c", 20, 30, 4)]
    plain = by_id(simulate(jobs, "1x4", "fifo"))
    assert plain == by_id(simulate(jobs, "1x4", "fifo", THIRTY))
    assert plain == {"a": (0.0, 100.0), "b": (10.0, 60.0), "c": (100.0, 130.0)}


@pytest.mark.parametrize(
    ("text", "message"),
    [("30", "LOW-HIGH"), ("a-b", "LOW-HIGH"), ("60-20", "0 <= LOW <= HIGH <= 100")],
)
def test_bad_utilisation_ranges_are_named(text: str, message: str) -> None:
    with pytest.raises(SharingError, match=message):
        SharingModel(*parse_util_range(text))


def test_the_assumed_utilisation_is_seeded_per_job() -> None:
    model = SharingModel(10, 100)
    drawn = [model.utilization(i) for i in range(200)]
    assert drawn == [SharingModel(10, 100).utilization(i) for i in range(200)]
    assert min(drawn) >= 10 and max(drawn) <= 100 and len(set(drawn)) > 20
    assert drawn != [SharingModel(10, 100, seed=1).utilization(i) for i in range(200)]


def shared_then_preempted(preempt_at: float) -> Profile:
    """g runs on the one GPU; o, made opportunistic, shares it from 0 s; o is preempted
    at `preempt_at` and launched again (alone or not) from 1,600 s."""
    gpu = (Shard("n0", ("n0-g0",)),)

    def plan(snapshot: Snapshot, now: float) -> Plan:
        waiting = {p.job_id: p for p in snapshot.pending}
        running = {p.job_id for p in snapshot.placed}
        actions: list[Action] = []
        if "g" in waiting:
            actions.append(Launch("g", gpu, ""))
        o = waiting.get("o")
        if o is not None and o.kind == "guaranteed":
            actions.append(SetKind("o", "opportunistic", ""))
        elif o is not None and (now == 0 or now >= 1600):
            actions.append(Launch("o", gpu, ""))
        if now == preempt_at and "o" in running:
            actions.append(Preempt("o", ""))
        return Plan(actions)

    return Profile("scripted", plan, pending_window=10, tick_s=100.0)


def test_a_preemption_falls_back_to_the_checkpoint_at_the_speed_of_its_time() -> None:
    """o shares g's GPU at 0.7 and checkpoints at 1,000 s (700 s of work done); g ends at
    1,400 s and o goes on at full speed; preempted at 1,500 s, o keeps the checkpoint's
    2,300 s left (not the work since at today's speed), and ends 2,300 s after its
    relaunch at 1,600 s."""
    options = dataclasses.replace(THIRTY, checkpoint_interval_s=1000.0)
    policy = shared_then_preempted(1500.0)
    result = simulate([job("g", 0, 1330), job("o", 0, 3000)], "1x1", policy, options)
    times = by_id(result)
    assert times["g"] == (0.0, pytest.approx(1400.0))
    assert times["o"] == (0.0, pytest.approx(1600.0 + 3000 - 0.7 * 1000))
    # Lost to sharing while they shared (0 to 1,400 s): 0.05 of g's time, 0.3 of o's.
    lost = {j.job_id: j.slowed_by_sharing_s for j in result.jobs}
    assert lost == {"g": pytest.approx(1400 * 0.05), "o": pytest.approx(1400 * 0.3)}


def test_the_time_lost_to_sharing_counts_up_to_a_preemption() -> None:
    """o is preempted at 1,000 s while it shares g's GPU (its speed never changed
    before): the 1,000 s at 0.7 count 300 s lost; it runs alone after, losing none."""
    policy = shared_then_preempted(1000.0)
    result = simulate([job("g", 0, 1330), job("o", 0, 3000)], "1x1", policy, THIRTY)
    lost = {j.job_id: (j.slowed_by_sharing_s, j.slowed_by_locality_s) for j in result.jobs}
    assert lost == {"g": (pytest.approx(1000 * 0.05), 0.0), "o": (pytest.approx(300.0), 0.0)}
    s = summarize(result)
    assert s.slowed_by_sharing_s == pytest.approx(350.0) and s.slowed_by_locality_s == 0.0
    assert s.best_effort_slowed_by_sharing_s == pytest.approx(350.0)  # no deadlines here


def test_the_lost_time_splits_into_spread_and_the_gpus_other_jobs() -> None:
    """At locality 0.5, sharing 0.8 and packing 0.9 (speed 0.36), 100 s lose 50 s to the
    spread and 0.5 x (1 - 0.72) x 100 = 14 s to the GPUs' other jobs: 64 s in all."""
    sim_job = SimJob(0, job("j", 0, 1000), Request(1, 1.0, 1), 1000.0, 1)
    sim_job.locality_speed, sim_job.share_speed, sim_job.pack_speed = 0.5, 0.8, 0.9
    sim_job.progress_at = 400.0
    sim_job.count_slowdown(500.0)
    assert sim_job.slowed_by_locality_s == pytest.approx(50.0)
    assert sim_job.slowed_by_sharing_s == pytest.approx(14.0)


def test_best_effort_lost_time_leaves_out_jobs_with_deadlines() -> None:
    policy = shared_then_preempted(1000.0)
    trace = [job("g", 0, 1330, deadline=10_000.0), job("o", 0, 3000)]
    s = summarize(simulate(trace, "1x1", policy, THIRTY))
    assert s.slowed_by_sharing_s == pytest.approx(350.0)
    assert s.best_effort_slowed_by_sharing_s == pytest.approx(300.0)  # o's alone


def test_a_gpu_is_idle_while_its_job_is_being_preempted() -> None:
    """`long` (30 %) runs 0-5 and is preempted for `short`: it holds the GPU, idle, for
    the 2 s overhead; `short` runs 7-12, `long` again from 12 on what its checkpoint
    at 3 s kept (17 s more): the GPU is 30 % busy for 5 + 5 + 17 s of 29."""
    done: list[str] = []

    def preempt_long_for_short(snapshot: Snapshot, now: float) -> Plan:
        running = {j.job_id for j in snapshot.placed}
        if "long" in running and any(j.job_id == "short" for j in snapshot.pending):
            if not done:
                done.append("long")
                return Plan([Preempt("long", "for short")])
            return Plan()
        short_first = sorted(snapshot.pending, key=lambda j: j.job_id != "short")
        return first_fit(dataclasses.replace(snapshot, pending=tuple(short_first)), now)

    options = SimOptions(
        sharing=SharingModel(30, 30), preempt_overhead_s=2.0, checkpoint_interval_s=3.0
    )
    result = simulate(
        [job("long", 0, 20), job("short", 5, 5)],
        "1x1",
        Profile("scripted", preempt_long_for_short, pending_window=10),
        options,
    )
    assert by_id(result) == {"long": (0, 29.0), "short": (7.0, 12.0)}
    assert summarize(result).utilization_avg == pytest.approx(0.3 * (5 + 5 + 17) / 29)


@pytest.mark.parametrize("overhead", [0.0, 300.0])
def test_a_sharer_being_preempted_no_longer_slows_the_guaranteed_job(overhead: float) -> None:
    """o shares g's GPU until it is preempted at 500 s: g has done 475 s of its 1,330 at
    0.95, and runs the rest at full speed, ending at 1,355 s whether o holds the GPU for
    a preemption's overhead meanwhile or not."""
    options = dataclasses.replace(THIRTY, preempt_overhead_s=overhead)
    policy = shared_then_preempted(500.0)
    result = simulate([job("g", 0, 1330), job("o", 0, 3000)], "1x1", policy, options)
    assert by_id(result)["g"] == (0, pytest.approx(1355.0))
