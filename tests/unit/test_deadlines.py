"""Chronus: deadline admission by MILP, guaranteed jobs first, their preemptions, and
consolidated placement, on hand-built snapshots."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy import deadline_admission
from schedd.policy.actions import AdmitDeadline, Plan
from schedd.policy.deadline_admission import DeadlineJob, decide
from schedd.policy.gittins import ServiceHistory
from schedd.policy.place.consolidate import rounded
from tests.unit.policy_harness import (
    HEAVY_TAIL,
    launches,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)

H = 3600.0


def slo(job: DeadlineJob | None = None, **kw: object) -> DeadlineJob:
    fields: dict[str, object] = {
        "job_id": "j",
        "gpus": 1,
        "remaining_s": H,
        "deadline": 2 * H,
        "committed": False,
    }
    fields.update(kw)
    return DeadlineJob(**fields)  # type: ignore[arg-type]


# ---- the admission program --------------------------------------------------


@pytest.mark.parametrize(
    ("job", "capacity", "words"),
    [
        (slo(remaining_s=None), 8, "no run-time estimate"),
        (slo(gpus=16), 8, "asks for 16 GPUs; the cluster has 8"),
        (slo(remaining_s=3 * H), 8, "cannot finish in time even alone: needs 180 min"),
    ],
)
def test_a_job_that_could_never_make_it_is_refused_with_the_reason(
    job: DeadlineJob, capacity: int, words: str
) -> None:
    decision = decide([job], capacity, 0.0, 1.0)["j"]
    assert not decision.admitted
    assert words in decision.reason


def test_the_program_admits_more_jobs_than_earliest_deadline_first_would() -> None:
    # One 8-GPU hour due first fills the cluster up to the second deadline; taking it
    # leaves room for nothing else, leaving it out admits the two later jobs instead.
    jobs = [
        slo(job_id="big", gpus=8, remaining_s=H, deadline=1.0 * H),
        slo(job_id="x", gpus=4, remaining_s=H, deadline=1.0 * H + 1),
        slo(job_id="y", gpus=4, remaining_s=H, deadline=1.0 * H + 2),
    ]
    decisions = decide(jobs, 8, 0.0, 1.0)
    assert {j for j, d in decisions.items() if d.admitted} == {"x", "y"}
    assert "guaranteed jobs leave 0.0 GPU-h" in decisions["big"].reason


def test_a_guarantee_given_outweighs_every_newcomer() -> None:
    jobs = [
        slo(job_id="kept", gpus=8, remaining_s=H, deadline=H, committed=True),
        slo(job_id="a", gpus=4, remaining_s=H, deadline=H + 1),
        slo(job_id="b", gpus=4, remaining_s=H, deadline=H + 2),
    ]
    decisions = decide(jobs, 8, 0.0, 1.0)
    assert decisions["kept"].admitted
    assert not decisions["a"].admitted and not decisions["b"].admitted


def test_a_guarantee_the_cluster_can_no_longer_keep_is_withdrawn() -> None:
    jobs = [slo(job_id="kept", gpus=8, remaining_s=H, deadline=H, committed=True)]
    decision = decide(jobs, 4, 0.0, 1.0)["kept"]  # half the cluster went away
    assert not decision.admitted
    assert decision.reason == "guarantee withdrawn: asks for 8 GPUs; the cluster has 4"


def test_refused_jobs_asked_again_fill_what_the_guarantees_leave_earliest_first() -> None:
    kept = [slo(job_id="kept", gpus=4, remaining_s=H, deadline=2 * H, committed=True)]
    # By 2 h: 0.9 x 8 GPUs x 2 h = 14.4 GPU-h, 4 kept; 8 more fit once, not twice.
    late = slo(job_id="late", gpus=8, remaining_s=H, deadline=2 * H + 60)
    early = slo(job_id="early", gpus=8, remaining_s=H, deadline=2 * H)
    answers = deadline_admission.decide_again(kept, [early, late], 8, 0.0, 0.9)
    assert {j: d.admitted for j, d in answers.items()} == {"early": True, "late": False}
    assert answers["early"].reason.startswith("guaranteed: 8.0 GPU-h fit")


@pytest.mark.parametrize(("efficiency", "late_too"), [(0.9, False), (1.0, True)])
def test_refused_jobs_asked_again_fit_the_cluster_at_its_efficiency(
    efficiency: float, late_too: bool
) -> None:
    # By 2 h: 8 + 7.9 GPU-h against 14.4 at 0.9, 16 at 1.0.
    early = slo(job_id="early", gpus=8, remaining_s=H, deadline=2 * H)
    late = slo(job_id="late", gpus=8, remaining_s=H, deadline=2 * H + 60)
    answers = deadline_admission.decide_again([], [early, late], 8, 0.0, efficiency)
    assert {j: d.admitted for j, d in answers.items()} == {"early": True, "late": late_too}


@pytest.mark.parametrize(
    ("job", "words"),
    [
        (slo(remaining_s=2 * H, deadline=H), "cannot finish in time even alone"),
        (slo(gpus=16), "asks for 16 GPUs; the cluster has 8"),
        (slo(remaining_s=0.0), "past its run-time estimate"),
    ],
)
def test_a_refused_job_that_cannot_make_it_is_not_guaranteed_when_asked_again(
    job: DeadlineJob, words: str
) -> None:
    answer = deadline_admission.decide_again([], [job], 8, 0.0, 0.9)["j"]
    assert not answer.admitted and words in answer.reason


def test_efficiency_keeps_room_for_fragmentation() -> None:
    job = slo(gpus=8, remaining_s=H, deadline=H)
    assert decide([job], 8, 0.0, 1.0)["j"].admitted
    assert not decide([job], 8, 0.0, 0.9)["j"].admitted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 8), st.floats(60.0, 4 * H), st.floats(1.0, 4.0), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_the_admitted_jobs_fit_every_deadlines_demand_bound(
    specs: list[tuple[int, float, float, bool]],
) -> None:
    """Whatever it admits, the GPU-seconds due by each admitted deadline fit in what 16
    GPUs deliver by then at 0.9 (EDF's demand bound), and it admits some job whenever
    one alone would fit."""
    jobs = [
        slo(job_id=str(i), gpus=g, remaining_s=r, deadline=r * stretch, committed=c)
        for i, (g, r, stretch, c) in enumerate(specs)
    ]
    answer = decide(jobs, 16, 0.0, 0.9)
    admitted = [j for j in jobs if answer[j.job_id].admitted]
    for bound in {j.deadline for j in admitted}:
        due = sum(
            j.gpus * max(0.0, (j.remaining_s or 0.0) - max(0.0, j.deadline - bound))
            for j in admitted
        )
        assert due <= 0.9 * 16 * bound * (1 + 1e-6)
    if any(j.gpus * (j.remaining_s or 0.0) <= 0.9 * 16 * j.deadline for j in jobs):
        assert admitted


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 8),
            st.floats(0.0, 2 * H),
            st.floats(0.0, 2 * H),
            st.booleans(),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(8, 48),
)
def test_the_answer_found_at_once_is_the_programs(
    specs: list[tuple[int, float, float, bool]], capacity: int
) -> None:
    """Where every job fits (`_all_fit`), the answers are those of the job-by-job path.
    Each job could make it alone (its deadline is its run time and some slack away), so
    whether all fit together is the demand bound's call, either way."""
    jobs = [
        slo(job_id=str(i), gpus=g, remaining_s=r, deadline=r + slack, committed=c)
        for i, (g, r, slack, c) in enumerate(specs)
    ]
    at_once = deadline_admission._all_fit(jobs, capacity, 0.0, 0.9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deadline_admission, "_all_fit", lambda *_: None)
        program = decide(jobs, capacity, 0.0, 0.9)
    if at_once is None:  # the bound fails at some checkpoint: the program refuses someone
        assert not all(d.admitted for d in program.values())
        return
    assert {j: d.admitted for j, d in at_once.items()} == {
        j: d.admitted for j, d in program.items()
    }
    newcomers = {j.job_id for j in jobs if not j.committed}
    assert all(at_once[j] == program[j] for j in newcomers)  # the same words too


def test_a_job_that_could_not_make_it_alone_is_left_to_the_program() -> None:
    late, unknown = slo(job_id="late", remaining_s=3 * H), slo(job_id="n", remaining_s=None)
    jobs = [slo(job_id="ok"), late, unknown]
    assert deadline_admission._all_fit(jobs, 8, 0.0, 1.0) is None
    assert deadline_admission._all_fit(jobs[:1], 8, 0.0, 1.0) is not None


# ---- the chronus profile --------------------------------------------------------


def with_deadline(job: object, deadline: float, admitted: bool | None = None) -> object:
    return dataclasses.replace(job, deadline=deadline, deadline_admitted=admitted)  # type: ignore[type-var]


def decisions(plan: Plan) -> dict[str, bool]:
    return {a.job_id: a.admitted for a in plan.actions if isinstance(a, AdmitDeadline)}


@pytest.mark.parametrize("profile", ["chronus", "default-deadlines"])
def test_a_new_deadline_is_decided_once_and_the_answer_goes_out_as_an_action(
    profile: str,
) -> None:
    n = node("a", 8)
    ok = with_deadline(pending("ok", 4, estimate_s=H), 2 * H)
    late = with_deadline(pending("late", 1, estimate_s=3 * H), 2 * H)
    plan = run(profile, snapshot([n], [ok, late]))  # type: ignore[list-item]
    assert decisions(plan) == {"ok": True, "late": False}
    decided = [with_deadline(ok, 2 * H, True), with_deadline(late, 2 * H, False)]
    assert decisions(run(profile, snapshot([n], decided))) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", ["chronus", "default-deadlines"])
@pytest.mark.parametrize("held", [True, False], ids=["still-held", "room-came"])
def test_a_refused_deadline_is_decided_again_at_the_next_arrival(profile: str, held: bool) -> None:
    n = node("a", 8)
    refused = with_deadline(pending("refused", 8, estimate_s=H), 2 * H, False)
    newcomer = with_deadline(pending("new", 1, estimate_s=H), 6 * H)
    # A guarantee of 8 GPUs for 1.5 h before 2 h leaves too little for `refused`;
    # once it has gone (ended early, or cancelled) the room is there.
    holder = with_deadline(pending("holder", 8, estimate_s=1.5 * H), 2 * H, True)
    jobs = [holder, refused, newcomer] if held else [refused, newcomer]
    plan = run(profile, snapshot([n], jobs))  # type: ignore[arg-type]
    assert decisions(plan) == ({"new": True} if held else {"new": True, "refused": True})
    guaranteed = next(a for a in plan.actions if isinstance(a, AdmitDeadline) and a.admitted)
    assert "guaranteed" in guaranteed.reason


def test_a_refused_deadline_running_as_best_effort_is_decided_again_too() -> None:
    n = node("a", 8)
    running = placed("refused", n, list(range(8)), started_at=0.0, estimate_s=H)
    running = with_deadline(running, 2 * H, False)
    newcomer = with_deadline(pending("new", 1, estimate_s=H), 6 * H)
    plan = run("chronus", snapshot([n], [newcomer], [running]), now=600.0)  # type: ignore[list-item]
    assert decisions(plan) == {"new": True, "refused": True}


def tiny_newcomer() -> object:
    return with_deadline(pending("new", 1, estimate_s=60.0), 6 * H)


def test_newcomers_are_decided_before_refused_jobs_asked_again() -> None:
    n = node("a", 8)
    # 8 GPU-h each by 2 h against 0.9 x 8 x 2 = 14.4: one fits, the newcomer.
    refused = with_deadline(pending("refused", 8, estimate_s=H), 2 * H, False)
    newcomer = with_deadline(pending("new", 8, estimate_s=H), 2 * H)
    plan = run("chronus", snapshot([n], [refused, newcomer]))  # type: ignore[list-item]
    assert decisions(plan) == {"new": True}


def test_refused_jobs_asked_again_go_earliest_deadline_first() -> None:
    n = node("a", 8)
    later = with_deadline(pending("later", 8, estimate_s=H), 2 * H + 60, False)
    sooner = with_deadline(pending("sooner", 8, estimate_s=H), 2 * H, False)
    jobs = [later, sooner, tiny_newcomer()]
    plan = run("chronus", snapshot([n], jobs))  # type: ignore[arg-type]
    assert decisions(plan) == {"new": True, "sooner": True}


def test_refused_jobs_are_asked_again_only_within_the_cycles_budget() -> None:
    n = node("a", 8)
    refused = with_deadline(pending("refused", 8, estimate_s=H), 2 * H, False)
    plan = run("chronus", snapshot([n], [refused, tiny_newcomer()]), deadline_decisions=1)  # type: ignore[list-item]
    assert decisions(plan) == {"new": True}


def test_a_refused_job_out_of_reach_takes_no_place_in_the_budget() -> None:
    n = node("a", 8)
    hopeless = with_deadline(pending("hopeless", 1, estimate_s=2 * H), H, False)
    refused = with_deadline(pending("refused", 8, estimate_s=H), 2 * H, False)
    jobs = [hopeless, refused, tiny_newcomer()]
    plan = run("chronus", snapshot([n], jobs), deadline_decisions=2)  # type: ignore[arg-type]
    assert decisions(plan) == {"new": True, "refused": True}


def test_two_newcomers_that_do_not_both_fit_are_decided_once_each() -> None:
    n = node("a", 8)
    a = with_deadline(pending("a", 8, estimate_s=H), 2 * H)
    b = with_deadline(pending("b", 8, estimate_s=H), 2 * H)
    plan = run("chronus", snapshot([n], [a, b]))  # type: ignore[list-item]
    answers = [x for x in plan.actions if isinstance(x, AdmitDeadline)]
    assert sorted(x.admitted for x in answers) == [False, True]


def test_a_refused_job_past_its_estimate_is_not_guaranteed_again() -> None:
    n = node("a", 8)
    over = placed("over", n, list(range(8)), started_at=0.0, estimate_s=H, attained_s=12 * H)
    over = with_deadline(over, 3 * H, False)
    plan = run("chronus", snapshot([n], [tiny_newcomer()], [over]), now=1.5 * H)  # type: ignore[list-item]
    assert decisions(plan) == {"new": True}


def test_a_job_guaranteed_again_and_urgent_preempts_in_the_same_plan() -> None:
    n = node("a", 8)
    now = H
    best_effort = placed("be", n, list(range(8)), started_at=0.0, estimate_s=10 * H)
    # 30 minutes of slack: urgent once guaranteed; 8 GPU-h fit 0.9 x 8 x 1.5 h.
    refused = with_deadline(pending("r", 8, estimate_s=H), now + 1.5 * H, False)
    newcomer = with_deadline(pending("new", 1, estimate_s=60.0), now + 6 * H)
    plan = run("chronus", snapshot([n], [refused, newcomer], [best_effort]), now=now)  # type: ignore[list-item]
    assert decisions(plan) == {"new": True, "r": True}
    assert preempted(plan) == {"be"}


@pytest.mark.parametrize(
    ("before", "decided"),
    [(None, True), (1199.0, True), (1200.0, False), (1700.0, False)],
    ids=["first-plan", "lease-before", "lease-began-here", "same-lease"],
)
def test_a_refused_deadline_is_decided_again_at_the_first_plan_of_a_lease(
    before: float | None, decided: bool
) -> None:
    """No arrival: the plan at 1,800 s decides again only if the plan before it was made
    in an earlier 20-minute lease (or none was made since the shell started)."""
    n = node("a", 8)
    refused = with_deadline(pending("refused", 8, estimate_s=H), 3 * H, False)
    snap = dataclasses.replace(snapshot([n], [refused]), planned_before=before)  # type: ignore[list-item]
    plan = run("chronus", snap, now=1800.0)
    assert decisions(plan) == ({"refused": True} if decided else {})


def test_the_plan_a_lease_asks_for_decides_whatever_a_float_division_rounds_to() -> None:
    """Leases of 3.3 s: the third begins at 3 x 3.3 = 9.899999999999999 s, which divided
    by 3.3 floors to 2, not 3. The plan asked for then is still the lease's first."""
    n = node("a", 8)
    refused = with_deadline(pending("refused", 8, estimate_s=H), 3 * H, False)
    snap = dataclasses.replace(snapshot([n], [refused]), planned_before=8.0)  # type: ignore[list-item]
    asked = run("chronus", snap, now=8.0, deadline_lease_s=3.3).recheck_at
    assert asked is not None and asked == 3 * 3.3
    at_lease = run("chronus", snap, now=asked, deadline_lease_s=3.3)
    assert decisions(at_lease) == {"refused": True}
    # The plan made at the boundary asks for the next lease, not for its own instant,
    # and a plan later in the same lease decides nothing.
    assert at_lease.recheck_at == 4 * 3.3
    later = dataclasses.replace(snap, planned_before=asked)
    assert decisions(run("chronus", later, now=asked + 0.5, deadline_lease_s=3.3)) == {}


@pytest.mark.parametrize("profile", ["chronus", "default-deadlines"])
def test_a_lease_withdraws_a_guarantee_the_cluster_can_no_longer_keep(profile: str) -> None:
    """`late`, guaranteed, has waited so long that 1.5 h of work no longer fits before
    its deadline 55 minutes away: the lease's decision says so, with no arrival."""
    n = node("a", 8)
    busy = placed("busy", n, list(range(8)), started_at=0.0, estimate_s=10 * H)
    late = with_deadline(pending("late", 8, estimate_s=1.5 * H), 2 * H, True)
    ok = with_deadline(pending("ok", 1, estimate_s=600.0), 5 * H, True)
    snap = snapshot([n], [late, ok], [busy])  # type: ignore[list-item]
    now = H + 300.0  # in the lease of 3,600 to 4,800 s
    same_lease = run(profile, dataclasses.replace(snap, planned_before=H + 100.0), now=now)
    assert decisions(same_lease) == {}
    plan = run(profile, dataclasses.replace(snap, planned_before=H - 100.0), now=now)
    assert decisions(plan) == {"late": False}
    withdrawn = next(a for a in plan.actions if isinstance(a, AdmitDeadline))
    assert "cannot finish in time" in withdrawn.reason


@pytest.mark.parametrize(
    ("jobs", "recheck"), [(["slo"], 2400.0), (["other"], None)], ids=["deadline", "none"]
)
def test_a_plan_asks_to_be_made_again_at_the_next_lease_while_a_job_has_a_deadline(
    jobs: list[str], recheck: float | None
) -> None:
    n = node("a", 8)
    made = {
        "slo": with_deadline(placed("slo", n, [0], started_at=0.0, estimate_s=H), 5 * H, False),
        "other": placed("other", n, [0], started_at=0.0, estimate_s=H),
    }
    snap = snapshot([n], [], [made[j] for j in jobs])  # type: ignore[misc]
    assert run("chronus", snap, now=1800.0).recheck_at == recheck


def test_urgent_guarantees_go_first_then_shortest_remaining_time() -> None:
    n = node("a", 2)
    # 30 minutes of slack, under two 20-minute leases: it may not wait behind anyone.
    urgent = with_deadline(pending("urgent", 1, estimate_s=5 * H, at=3.0), 5.5 * H, True)
    # Hours of slack: it takes its turn by remaining time, like everyone else.
    relaxed = with_deadline(pending("relaxed", 1, estimate_s=2 * H, at=4.0), 10 * H, True)
    short = pending("short", 1, estimate_s=600.0, at=2.0)
    longer = pending("longer", 1, estimate_s=H, at=1.0)
    jobs = [longer, short, urgent, relaxed]
    plan = run("chronus", snapshot([n], jobs))  # type: ignore[arg-type]
    assert set(launches(plan)) == {"urgent", "short"}
    assert plan.waiting["longer"].code == plan.waiting["relaxed"].code == "no_capacity"


def test_a_guaranteed_job_preempts_a_job_without_a_guarantee_past_its_lease() -> None:
    n = node("a", 4)
    running = [
        placed("be-old", n, [0, 1], started_at=0.0, estimate_s=10 * H),
        placed("be-young", n, [2], started_at=5000.0, estimate_s=10 * H),
        with_deadline(
            placed("slo-running", n, [3], started_at=0.0, estimate_s=10 * H), 20 * H, True
        ),
    ]
    job = with_deadline(pending("slo", 2, estimate_s=H), 3 * H, True)
    plan = run("chronus", snapshot([n], [job], running), now=5400.0)  # type: ignore[arg-type,list-item]
    # be-young is inside its 20-minute lease; the guaranteed job is never a victim.
    assert preempted(plan) == {"be-old"}
    assert plan.waiting["slo"].code == "preempting"


def test_guaranteed_jobs_with_slack_to_spare_make_way_for_one_without() -> None:
    n = node("a", 4)
    relaxed = [
        with_deadline(placed(f"r{i}", n, [i], started_at=0.0, estimate_s=H), 30 * H, True)
        for i in range(3)
    ]
    tight = with_deadline(placed("t", n, [3], started_at=0.0, estimate_s=2 * H), 3 * H, True)
    job = with_deadline(pending("gang", 4, estimate_s=H), 2 * H, True)
    plan = run("chronus", snapshot([n], [job], [*relaxed, tight]), now=1800.0)  # type: ignore[list-item]
    # The gang needs the whole node, and `t` cannot wait an hour: nobody is preempted.
    assert preempted(plan) == set()
    plan = run(
        "chronus",
        snapshot([n, node("b", 4)], [job], [*relaxed, tight]),  # type: ignore[list-item]
        now=1800.0,
    )
    assert launches(plan)["gang"].shards[0].node_id == "b"  # room elsewhere: no victims
    two = [pending("gang2", 3, estimate_s=H)]
    plan = run(
        "chronus",
        snapshot([n], [with_deadline(two[0], 2 * H, True)], [*relaxed, tight]),  # type: ignore[list-item]
        now=1800.0,
    )
    assert preempted(plan) == {"r0", "r1", "r2"}  # 3 GPUs from jobs that can wait


def test_a_guarantee_that_is_not_urgent_yet_waits_and_says_when_it_will_be() -> None:
    n = node("a", 1)
    running = [placed("be", n, [0], started_at=0.0, estimate_s=10 * H)]
    job = with_deadline(pending("slo", 1, estimate_s=H), 5000.0 + 4 * H, True)
    snap = snapshot([n], [job], running)  # type: ignore[list-item]
    plan = run("chronus", snap, now=5000.0, deadline_lease_s=24 * H)  # no lease ends first
    # Three hours of slack: no preemption yet, but a plan again when it falls to 40 min.
    assert preempted(plan) == set()
    assert plan.recheck_at == 5000.0 + 3 * H - 2400.0
    plan = run("chronus", snapshot([n], [job], running), now=plan.recheck_at)  # type: ignore[list-item]
    assert preempted(plan) == {"be"}


def test_a_refused_deadline_waits_like_a_best_effort_job() -> None:
    n = node("a", 2)
    running = [placed("be", n, [0, 1], started_at=0.0, estimate_s=10 * H)]
    job = with_deadline(pending("refused", 2, estimate_s=H), 3 * H, False)
    snap = snapshot([n], [job], running)  # type: ignore[list-item]
    # Not decided again (the plan before was in this lease): it stays refused.
    plan = run("chronus", dataclasses.replace(snap, planned_before=5000.0), now=5400.0)
    assert preempted(plan) == set()
    assert plan.waiting["refused"].code == "no_capacity"


# ---- the default-deadlines profile ------------------------------------------------


@pytest.mark.parametrize("history", [HEAVY_TAIL, None], ids=["gittins", "no-history"])
@pytest.mark.parametrize(("slack_s", "spared"), [(600.0, True), (10 * H, False)])
def test_default_deadlines_spares_a_runner_whose_guaranteed_deadline_is_urgent(
    slack_s: float, spared: bool, history: ServiceHistory | None
) -> None:
    """A newcomer's Gittins index is above a long runner's: the default preempts it.
    With deadlines, a runner whose guaranteed deadline is 10 minutes of slack away is
    spared; one with hours to spare is not. Before any history is learned the
    preemption is 2D-LAS's (the runner is past the first threshold), and spares alike."""
    n = node("a", 1)
    now = 10_000.0
    runner = placed("long", n, [0], started_at=0.0, attained_s=5_000.0, estimate_s=6_000.0)
    runner = with_deadline(runner, now + 1_000.0 + slack_s, True)  # 1,000 s of work left
    snap = snapshot([n], [pending("new", 1, estimate_s=60.0)], [runner], service_history=history)  # type: ignore[list-item]
    assert preempted(run("default", snap, now=now)) == {"long"}
    plan = run("default-deadlines", snap, now=now)
    assert preempted(plan) == (set() if spared else {"long"})


@pytest.mark.parametrize(("gpus", "block"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16)])
def test_gpu_counts_round_up_to_1_2_4_or_8n(gpus: int, block: int) -> None:
    assert rounded(gpus) == block


def test_consolidation_keeps_a_job_inside_one_aligned_block() -> None:
    n = node("a", 8)
    held = [placed("x", n, [1, 2, 3, 4])]  # free: 0, 5, 6, 7
    plan = run("chronus", snapshot([n], [pending("j", 2, estimate_s=H)], held))
    (shard,) = launches(plan)["j"].shards
    assert shard.gpu_uuids == ("a-g6", "a-g7")  # not 0 and 5, across two pairs
    best_fit = launches(run("sjf", snapshot([n], [pending("j", 2, estimate_s=H)], held)))
    assert best_fit["j"].shards[0].gpu_uuids == ("a-g0", "a-g5")


def test_a_gang_larger_than_a_node_leaves_whole_nodes_whole() -> None:
    """12 GPUs over nodes of 8: best fit takes the two empty nodes (4 left on one);
    the local search takes an empty node and the one with exactly 4 free."""
    a, b, c = node("a", 8), node("b", 8), node("c", 8)
    held = [placed("x", c, [0, 1, 2, 3])]
    snap = snapshot([a, b, c], [pending("j", 12, estimate_s=H)], held, multi_node=True)
    chosen = {s.node_id: len(s.gpu_uuids) for s in launches(run("chronus", snap))["j"].shards}
    assert chosen == {"a": 8, "c": 4}
    spread = {s.node_id: len(s.gpu_uuids) for s in launches(run("sjf", snap))["j"].shards}
    assert spread == {"a": 8, "b": 4}


def test_a_gang_larger_than_a_node_spans_as_few_racks_as_it_can() -> None:
    """Three empty nodes, two in rack r1: a 16-GPU gang takes the two in r1, where best
    fit, by name, takes a and b across two racks. Never more nodes for fewer racks."""
    a, b, c = node("a", 8, rack="r1"), node("b", 8, rack="r2"), node("c", 8, rack="r1")
    snap = snapshot([a, b, c], [pending("j", 16, estimate_s=H)], multi_node=True)
    assert {s.node_id for s in launches(run("chronus", snap))["j"].shards} == {"a", "c"}
    assert {s.node_id for s in launches(run("sjf", snap))["j"].shards} == {"a", "b"}
    # Fewer racks come before fewer GPUs left behind: 12 GPUs take a and c (4 left on
    # c) rather than a and d, whose 4 GPUs it would fill, in another rack.
    d = node("d", 4, rack="r3")
    snap = snapshot([a, b, c, d], [pending("j", 12, estimate_s=H)], multi_node=True)
    chosen = {s.node_id: len(s.gpu_uuids) for s in launches(run("chronus", snap))["j"].shards}
    assert chosen == {"a": 8, "c": 4}
