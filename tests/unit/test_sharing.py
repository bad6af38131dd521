"""GPU sharing (AntMan) in the placement model: where an opportunistic job goes, and
what it leaves to guaranteed jobs."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy.actions import Plan, SetKind
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC, Gpu, Node, PendingJob
from tests.unit.policy_harness import (
    converted,
    launches,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)

PROFILES = [
    "default",
    "fifo",
    "tiresias",
    "drf",
    "capacity",
    "chronus",
    "liquid",
    "antman",
    "default-deadlines",
]


def ot(job_id: str, gpus: int = 1, **kw: object) -> object:
    return pending(job_id, gpus, kind=OPPORTUNISTIC, **kw)  # type: ignore[arg-type]


def with_use(n: Node, **pct: int) -> Node:
    """The node with GPU `g<i>` reporting `pct[f"g{i}"]` percent (its window's highest)."""
    gpus = tuple(dataclasses.replace(g, utilization_pct=pct.get(f"g{g.index}", 0)) for g in n.gpus)
    return dataclasses.replace(n, gpus=gpus)


def gpus_of(plan: object, job_id: str) -> tuple[str, ...]:
    return launches(plan)[job_id].gpu_uuids  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", PROFILES)
def test_an_opportunistic_job_goes_to_the_least_used_gpu_below_the_mark(profile: str) -> None:
    n = node("n", 3)
    running = [
        placed("busy", n, [0], utilization_pct=90),
        placed("light", n, [1], utilization_pct=20),
        placed("mid", n, [2], utilization_pct=40),
    ]
    plan = run(profile, snapshot([n], [ot("o")], running))
    assert gpus_of(plan, "o") == ("n-g1",)
    # Nothing below the mark: it waits, and says why.
    plan = run(profile, snapshot([n], [ot("o")], running), share_below_pct=15.0)
    assert plan.waiting["o"].code == "no_shareable_gpu"
    assert "below 15%" in plan.waiting["o"].reason


@pytest.mark.parametrize("profile", ["default", "fifo"])
def test_no_opportunistic_job_goes_to_a_node_whose_agent_runs_no_coordinator(
    profile: str,
) -> None:
    """Its idle GPUs are the least used, but nothing would throttle the job there."""
    bare = dataclasses.replace(node("bare", 1), coordinated=False)
    steered = node("steered", 1)
    running = [placed("light", steered, [0], utilization_pct=20)]
    plan = run(profile, snapshot([bare, steered], [ot("o")], running))
    assert gpus_of(plan, "o") == ("steered-g0",)
    plan = run(profile, snapshot([bare], [ot("o")]))
    assert plan.waiting["o"].code == "no_shareable_gpu"
    assert "1 node without a coordinator to throttle it" in plan.waiting["o"].reason
    # A guaranteed job goes there as anywhere.
    assert launches(run(profile, snapshot([bare], [pending("g")])))["g"].gpu_uuids == ("bare-g0",)


def test_the_gpus_own_window_counts_as_well_as_its_holders_use() -> None:
    """A GPU that peaked at 70% over the window is not little used, whatever its job
    is said to use; an idle GPU is the least used of all; a GPU whose job has not run
    `share_after_s` (300 s) and says nothing of its own use is not shared yet."""
    n = with_use(node("n", 3), g0=70, g1=30)
    running = [placed("a", n, [0], utilization_pct=10), placed("b", n, [1], started_at=0.0)]
    plan = run("default", snapshot([n], [ot("o")], running), now=600.0)
    assert gpus_of(plan, "o") == ("n-g2",)  # free and idle
    full = [*running, placed("c", n, [2], utilization_pct=45)]
    assert gpus_of(run("default", snapshot([n], [ot("o")], full), now=600.0), "o") == ("n-g1",)
    plan = run("default", snapshot([n], [ot("o")], full), now=200.0)
    assert gpus_of(plan, "o") == ("n-g2",)  # b's GPU: measured for 200 s only


def test_one_opportunistic_job_per_gpu_and_a_gang_on_one_node() -> None:
    a, b = node("a", 2), node("b", 2)
    running = [
        placed("ra", a, [0, 1], utilization_pct=10),
        placed("oa", a, [0], kind=OPPORTUNISTIC),
        placed("rb", b, [0, 1], utilization_pct=30),
    ]
    plan = run("default", snapshot([a, b], [ot("pair", 2)], running))
    assert set(gpus_of(plan, "pair")) == {"b-g0", "b-g1"}  # a's g0 is shared already
    plan = run("default", snapshot([a, b], [ot("one", 1, at=1.0), ot("two", 2, at=2.0)], running))
    assert gpus_of(plan, "one") == ("a-g1",)
    assert set(gpus_of(plan, "two")) == {"b-g0", "b-g1"}
    crowded = [*running, placed("ob", b, [1], kind=OPPORTUNISTIC)]
    plan = run("default", snapshot([a, b], [ot("pair", 2)], crowded))
    assert plan.waiting["pair"].code == "no_shareable_gpu"


def test_gpu_memory_left_by_the_holder_bounds_a_sharer() -> None:
    n = node("n", 2, gpu_memory_mib=40_000)
    used = Gpu("n-g0", 0, "A100", 40_000, 10, 30_000)
    n = dataclasses.replace(n, gpus=(used, n.gpus[1]))
    running = [placed("a", n, [0]), placed("b", n, [1], utilization_pct=40)]
    plan = run("default", snapshot([n], [ot("o", gpu_memory_mib=20_000)], running), now=600.0)
    assert gpus_of(plan, "o") == ("n-g1",)  # g0 is less used but has 10 GB left


def test_a_sharer_without_a_memory_figure_is_bounded_by_its_predicted_peak() -> None:
    """A spec that asks no GPU memory: the estimator's predicted peak stands in for it,
    and a spec's own figure wins over a prediction."""
    n = node("n", 2, gpu_memory_mib=40_000)
    used = Gpu("n-g0", 0, "A100", 40_000, 10, 30_000)
    n = dataclasses.replace(n, gpus=(used, n.gpus[1]))
    running = [placed("a", n, [0]), placed("b", n, [1], utilization_pct=40)]

    def planned(job: object, predicted: int | None = None) -> Plan:
        assert isinstance(job, PendingJob)
        job = dataclasses.replace(job, predicted_gpu_memory_mib=predicted)
        return run("default", snapshot([n], [job], running), now=600.0)

    assert gpus_of(planned(ot("o")), "o") == ("n-g0",)  # nothing known: the least used
    assert gpus_of(planned(ot("o"), 20_000), "o") == ("n-g1",)  # g0 has 10 GB left
    assert gpus_of(planned(ot("o", gpu_memory_mib=5_000), 20_000), "o") == ("n-g0",)
    too_big = planned(ot("o"), 45_000)
    # A prediction is no ask: a young holder known to use little is open to it.
    young = [placed("y", n, [1], started_at=500.0, utilization_pct=10), running[0]]
    predicted = dataclasses.replace(ot("o"), predicted_gpu_memory_mib=20_000)  # type: ignore[type-var]
    assert gpus_of(run("default", snapshot([n], [predicted], young), now=600.0), "o") == ("n-g1",)
    assert too_big.waiting["o"].code == "no_shareable_gpu"


def test_a_job_refused_for_its_predicted_memory_holds_no_twin_back() -> None:
    """A plan remembers a request that found no GPU to share; the GPU memory needed, a
    prediction included, is part of what it remembers."""
    n = node("n", 2, gpu_memory_mib=40_000)
    running = [placed("a", n, [0], utilization_pct=10), placed("b", n, [1], utilization_pct=10)]
    big = dataclasses.replace(ot("big", at=0.0), predicted_gpu_memory_mib=45_000)  # type: ignore[type-var]
    small = dataclasses.replace(ot("small", at=1.0), predicted_gpu_memory_mib=5_000)  # type: ignore[type-var]
    plan = run("default", snapshot([n], [big, small, ot("none", at=2.0)], running), now=600.0)
    assert set(launches(plan)) == {"small", "none"}
    assert plan.waiting["big"].code == "no_shareable_gpu"


def test_a_young_holder_known_to_use_little_is_shared_but_not_by_a_job_asking_memory() -> None:
    """Its utilisation is known (live: the estimator's), its memory is not yet."""
    n = node("n", 1, gpu_memory_mib=40_000)
    young = [placed("y", n, [0], started_at=500.0, utilization_pct=10)]
    plan = run("default", snapshot([n], [ot("o")], young), now=600.0)
    assert gpus_of(plan, "o") == ("n-g0",)
    plan = run("default", snapshot([n], [ot("o", gpu_memory_mib=1_000)], young), now=600.0)
    assert plan.waiting["o"].code == "no_shareable_gpu"
    plan = run("default", snapshot([n], [ot("o", gpu_memory_mib=1_000)], young), now=900.0)
    assert gpus_of(plan, "o") == ("n-g0",)  # of age: its window has seen it


def test_a_guaranteed_job_takes_gpus_only_opportunistic_jobs_hold_without_preempting() -> None:
    n = node("n", 2)
    running = [placed("g", n, [0]), placed("o", n, [1], kind=OPPORTUNISTIC, started_at=-9e3)]
    plan = run("default", snapshot([n], [pending("new")], running), now=10_000.0)
    assert gpus_of(plan, "new") == ("n-g1",)
    assert not preempted(plan)


def test_guaranteed_jobs_take_unshared_gpus_first() -> None:
    n = node("n", 4)
    running = [placed("o", n, [0], kind=OPPORTUNISTIC), placed("p", n, [2], kind=OPPORTUNISTIC)]
    plan = run("default", snapshot([n], [pending("one"), pending("three", 3, at=1.0)], running))
    assert gpus_of(plan, "one") == ("n-g1",)
    assert set(gpus_of(plan, "three")) == {"n-g0", "n-g2", "n-g3"}


def test_an_opportunistic_job_holds_no_share_and_is_no_victim() -> None:
    """Queue q is at its max: a guaranteed job waits, an opportunistic one starts. Its
    GPUs count for nobody's quota, and reclaim never stops it (that frees nothing)."""
    n = node("n", 2)
    capped = QueueSpec("q", max=Resources(gpus=1))
    running = [placed("g", n, [0], queue="q", utilization_pct=10)]
    jobs = [pending("more", queue="q", at=1.0), ot("extra", queue="q", at=2.0)]
    plan = run("drf", snapshot([n], jobs, running, queues=(capped,)))
    assert plan.waiting["more"].code == "queue_max"
    assert "extra" in launches(plan)
    owner = QueueSpec("owner", guarantee=Resources(gpus=2))
    borrowed = [placed("o", n, [0, 1], queue="q", kind=OPPORTUNISTIC, started_at=-9e3)]
    plan = run("drf", snapshot([n], [pending("mine", 2, queue="owner")], borrowed, queues=(owner,)))
    assert set(gpus_of(plan, "mine")) == {"n-g0", "n-g1"}
    assert not preempted(plan)


def test_an_opportunistic_job_that_cannot_start_holds_nobody_back_under_fifo() -> None:
    n, m = node("n", 1), with_use(node("m", 1), g0=95)  # m's GPU is busy with something else
    running = [placed("g", n, [0], utilization_pct=95)]
    plan = run("fifo", snapshot([n, m], [ot("o", at=1.0), pending("next", at=2.0)], running))
    assert plan.waiting["o"].code == "no_shareable_gpu"
    assert gpus_of(plan, "next") == ("m-g0",)


def test_a_gpu_a_guaranteed_job_takes_in_the_same_plan_is_not_shared_yet() -> None:
    """How busy a job that just started keeps its GPU is unknown until it runs."""
    n = node("n", 1)
    plan = run("fifo", snapshot([n], [pending("g", at=1.0), ot("o", at=2.0)]))
    assert gpus_of(plan, "g") == ("n-g0",)
    assert plan.waiting["o"].code == "no_shareable_gpu"


def kinds(plan: Plan) -> dict[str, str]:
    return {a.job_id: a.kind for a in plan.actions if isinstance(a, SetKind)}


MARK = 1800.0  # the antman profile's opportunistic_after_s


def test_a_job_waiting_past_the_mark_turns_opportunistic_unless_it_opts_out() -> None:
    """Nor does a job with a deadline: slowed beside a guaranteed job, it could miss it."""
    n = node("n", 1)
    running = [placed("g", n, [0], started_at=0.0, utilization_pct=30)]
    waiting = [
        pending("old", at=0.0),
        pending("young", at=MARK),
        dataclasses.replace(pending("stays", at=0.0), stay_guaranteed=True),
        dataclasses.replace(pending("due", at=0.0), deadline=10 * MARK),
        dataclasses.replace(pending("due later", at=MARK / 2), deadline=10 * MARK),
    ]
    plan = run("antman", snapshot([n], waiting, running), now=MARK + 60)
    assert kinds(plan) == {"old": OPPORTUNISTIC}
    assert "waited 31 min" in next(a for a in plan.actions if isinstance(a, SetKind)).reason
    assert plan.recheck_at == 2 * MARK  # when "young" reaches the mark, not "due later"
    # Once opportunistic, the next plan shares the little-used GPU with it.
    converted = [dataclasses.replace(waiting[0], kind=OPPORTUNISTIC), *waiting[1:]]
    plan = run("antman", snapshot([n], converted, running), now=MARK + 60)
    assert gpus_of(plan, "old") == ("n-g0",)
    assert not kinds(plan)


def test_a_job_held_back_by_its_quota_turns_opportunistic_but_not_one_too_large() -> None:
    """An opportunistic job counts against no max: the surplus of a capped queue shares."""
    n = node("n", 2)
    capped = QueueSpec("q", max=Resources(gpus=1))
    running = [placed("g", n, [0], queue="q", utilization_pct=30)]
    jobs = [pending("p", queue="q"), pending("huge", 3, queue="q")]
    plan = run("antman", snapshot([n], jobs, running, queues=(capped,)), MARK)
    assert plan.waiting["p"].code == "queue_max"
    assert plan.waiting["huge"].code == "too_large"
    assert kinds(plan) == {"p": OPPORTUNISTIC}


def test_a_running_opportunistic_job_is_upgraded_once_its_gpus_are_its_own() -> None:
    n = node("n", 2)
    alone = placed("o", n, [1], kind=OPPORTUNISTIC)
    plan = run("antman", snapshot([n], [], [placed("g", n, [0]), alone]))
    assert kinds(plan) == {"o": GUARANTEED}
    # Sharing with a guaranteed job, it stays as it is.
    shared = placed("o", n, [0], kind=OPPORTUNISTIC)
    assert not kinds(run("antman", snapshot([n], [], [placed("g", n, [0]), shared])))
    # A guaranteed job that starts on its GPU in this plan keeps it opportunistic.
    plan = run("antman", snapshot([n], [pending("g2", 2)], [alone]))
    assert gpus_of(plan, "g2") == ("n-g0", "n-g1")
    assert not kinds(plan)


def test_an_upgrade_waits_for_its_queues_max_counting_upgrades_in_the_same_plan() -> None:
    n = node("n", 3)
    capped = QueueSpec("q", max=Resources(gpus=2))
    jobs = [
        placed("g", n, [0], queue="q"),
        placed("o1", n, [1], queue="q", kind=OPPORTUNISTIC),
        placed("o2", n, [2], queue="q", kind=OPPORTUNISTIC),
    ]
    plan = run("antman", snapshot([n], [], jobs, queues=(capped,)))
    assert kinds(plan) == {"o1": GUARANTEED}


def test_a_gang_larger_than_a_node_stays_guaranteed_and_is_never_shared() -> None:
    a, b = node("a", 2), node("b", 2)
    running = [placed("g", a, [0], started_at=0.0, utilization_pct=10)]
    waiting = [pending("gang", 4, at=0.0), ot("wide", 3, at=0.0)]
    plan = run("antman", snapshot([a, b], waiting, running, multi_node=True), now=MARK + 60)
    assert plan.waiting["gang"].code == "no_capacity"
    assert plan.waiting["wide"].code == "too_large"
    assert "runs on one node" in plan.waiting["wide"].reason
    assert not kinds(plan)


def test_a_job_made_opportunistic_gets_its_guarantee_back_by_room_or_reclaim() -> None:
    owner = QueueSpec("owner", guarantee=Resources(gpus=4))
    n = node("n", 4)
    borrowed = [placed("b", n, [0, 1, 2, 3], queue="other", started_at=0.0, utilization_pct=90)]
    mine = converted(pending("mine", 4, queue="owner", at=0.0))
    # The borrower is too young to preempt: mine waits, as what it is now.
    plan = run("antman", snapshot([n], [mine], borrowed, queues=(owner,)), now=200.0)
    assert plan.waiting["mine"].code == "no_shareable_gpu"
    assert not kinds(plan) and not preempted(plan)
    # Of age: its queue reclaims for it, as for any guaranteed job, and it is one again.
    plan = run("antman", snapshot([n], [mine], borrowed, queues=(owner,)), now=MARK + 600)
    assert preempted(plan) == {"b"}
    assert kinds(plan) == {"mine": GUARANTEED}
    assert plan.waiting["mine"].code == "preempting"
    # Room for it: it starts guaranteed (the kind first, then the launch).
    plan = run("antman", snapshot([n], [mine]), now=MARK + 600)
    assert [type(a).__name__ for a in plan.actions] == ["SetKind", "Launch"]
    assert kinds(plan) == {"mine": GUARANTEED}


@pytest.mark.parametrize("profile", ["default", "antman"])
def test_a_job_made_opportunistic_shares_though_its_guaranteed_twin_waits(profile: str) -> None:
    """Twins (queue, user, request) wait alike as guaranteed, which the plan answers at
    once for the second; the one made opportunistic still goes on to share."""
    n = node("n", 2)
    full = [placed("a", n, [0], utilization_pct=20), placed("b", n, [1], utilization_pct=30)]
    twin = pending("twin", 1, at=MARK + 10)
    mine = converted(pending("mine", 1, at=MARK + 20))
    plan = run(profile, snapshot([n], [twin, mine], full), now=MARK + 100)
    assert plan.waiting["twin"].code == "no_capacity"
    assert gpus_of(plan, "mine") == ("n-g0",)
    assert not kinds(plan)


def test_no_upgrade_takes_gpus_a_preemption_of_the_same_plan_counts_on() -> None:
    """mine needs 2 GPUs: the borrower's and the one only o holds (free for it). While
    it waits for the borrower to stop, o is not upgraded onto that GPU."""
    owner = QueueSpec("owner", guarantee=Resources(gpus=2))
    n = node("n", 2)
    jobs = [
        placed("b", n, [0], queue="other", started_at=0.0),
        placed("o", n, [1], queue="other", kind=OPPORTUNISTIC, started_at=0.0),
    ]
    plan = run(
        "antman", snapshot([n], [pending("mine", 2, queue="owner")], jobs, queues=(owner,)), MARK
    )
    assert preempted(plan) == {"b"} and plan.waiting["mine"].code == "preempting"
    assert not kinds(plan)
    # Without the waiting job, o would have been upgraded.
    assert kinds(run("antman", snapshot([n], [], jobs[1:]), MARK)) == {"o": GUARANTEED}


def test_opportunistic_jobs_use_gpus_reserved_for_a_blocked_gang_until_it_starts() -> None:
    """The gang holds the 4 free GPUs for when busy ends; a guaranteed job too long to
    backfill waits, an opportunistic one takes a reserved GPU (the gang will throttle it
    when it starts, not wait for it)."""
    n = node("n", 8)
    busy = placed("busy", n, [0, 1, 2, 3], started_at=0.0, estimate_s=1000.0, utilization_pct=90)
    jobs = [
        pending("gang", 8, at=1.0),
        pending("long", 1, at=2.0, estimate_s=5000.0),
        ot("guest", 1, at=3.0, estimate_s=5000.0),
    ]
    plan = run("backfill", snapshot([n], jobs, [busy]), now=100.0, reserve_after_s=0.0)
    assert plan.waiting["gang"].code == "reserved"
    assert "reserved for job gang" in plan.waiting["long"].reason
    assert gpus_of(plan, "guest") == ("n-g4",)


def test_a_sharer_kept_off_a_young_holders_gpu_is_planned_again_when_it_comes_of_age() -> None:
    n = node("n", 1)
    young = [placed("g", n, [0], started_at=100.0)]  # no figure of its own use
    plan = run("fifo", snapshot([n], [ot("o")], young), now=200.0)
    assert plan.waiting["o"].code == "no_shareable_gpu"
    assert plan.recheck_at == 400.0  # started at 100, share_after_s 300
    # Known to use little, it is shared at once, and nothing is left to recheck.
    known = [placed("g", n, [0], started_at=100.0, utilization_pct=20)]
    plan = run("fifo", snapshot([n], [ot("o")], known), now=200.0)
    assert gpus_of(plan, "o") == ("n-g0",) and plan.recheck_at is None


def test_under_fifo_an_opportunistic_job_is_not_held_behind_a_blocked_head() -> None:
    n = node("n", 2)
    running = [placed("g", n, [0], utilization_pct=10)]
    plan = run("fifo", snapshot([n], [pending("gang", 2, at=1.0), ot("o", at=2.0)], running))
    assert plan.waiting["gang"].code == "no_capacity"
    assert gpus_of(plan, "o") == ("n-g1",)  # the free GPU, least used
