"""Packing (Gandiva): jobs taking turns that each use little of their GPUs run at once,
and go back to turns when their measured progress shows packing hurts."""

from __future__ import annotations

import dataclasses

from schedd.policy import build
from schedd.policy.actions import Plan, Resume, Suspend
from schedd.policy.profiles import BUILTIN
from schedd.policy.snapshot import PACKED, SUSPENDED, PlacedJob, Snapshot
from tests.unit.policy_harness import assert_valid, launches, node, pending, run, snapshot
from tests.unit.policy_harness import placed as placed_job

N = node("n", 1)


def job(job_id: str, state: str = "running", util: int | None = 30, **kw: object) -> PlacedJob:
    return dataclasses.replace(
        placed_job(job_id, N, [0], estimate_s=50_000.0, utilization_pct=util),
        state=state,
        state_since=kw.pop("since", 900.0),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def gandiva(snap: Snapshot, now: float) -> Plan:
    """The gandiva profile with packing on."""
    spec = dataclasses.replace(BUILTIN["gandiva"], decide=("timeslice", "pack"))
    plan = build("gandiva", spec).plan(snap, now)
    assert_valid(snap, plan)
    return plan


def acts(plan: Plan) -> list[tuple[str, str, str | None]]:
    return [
        (type(a).__name__, a.job_id, getattr(a, "beside", None))
        for a in plan.actions
        if isinstance(a, Resume | Suspend)
    ]


def test_two_little_used_jobs_taking_turns_run_at_once() -> None:
    snap = snapshot([N], [], [job("a", util=40), job("s", SUSPENDED, util=30)])
    plan = gandiva(snap, now=1000.0)
    assert acts(plan) == [("Resume", "s", "a")]
    assert "about 70% of the GPUs" in plan.actions[0].reason  # type: ignore[union-attr]
    assert plan.recheck_at == 1000.0 + 300.0  # to read their progress then
    # Busier together than the mark, or a figure not known: they keep taking turns.
    busy = snapshot([N], [], [job("a", util=70), job("s", SUSPENDED, util=30)])
    assert acts(gandiva(busy, now=1000.0)) == []
    unknown = snapshot([N], [], [job("a", util=None), job("s", SUSPENDED, util=30)])
    assert acts(gandiva(unknown, now=1000.0)) == []
    # Other profiles neither turn nor pack.
    assert acts(run("default", snap, now=1000.0)) == []
    # Nor is one packed beside a job its user paused: that job runs no step.
    held = snapshot([N], [], [job("a", util=40, paused=True), job("s", SUSPENDED, util=30)])
    assert acts(gandiva(held, now=1000.0)) == []


def test_a_new_pack_keeps_the_sooner_check_of_an_earlier_one() -> None:
    m = node("m", 1)
    earlier = [
        dataclasses.replace(
            placed_job(i, m, [0], estimate_s=50_000.0), state=st, state_since=1100.0
        )
        for i, st in (("b", "running"), ("q", PACKED))
    ]
    snap = snapshot([N, m], [], [job("a", util=40), job("s", SUSPENDED, util=30), *earlier])
    plan = gandiva(snap, now=1200.0)
    assert acts(plan) == [("Resume", "s", "a")]
    assert plan.recheck_at == 1100.0 + 300.0  # q's pack is judged first, not lost


def test_a_pack_whose_progress_is_worse_than_turns_is_undone_and_not_made_again() -> None:
    hurt = [job("a", progress_ratio=0.5), job("p", PACKED, progress_ratio=0.4)]
    plan = gandiva(snapshot([N], [], hurt), now=1500.0)
    assert acts(plan) == [("Suspend", "p", None)]
    assert "ran at 0.40 and 0.50 of their speed alone" in plan.actions[0].reason  # type: ignore[union-attr]
    fine = [job("a", progress_ratio=0.8), job("p", PACKED, progress_ratio=0.7)]
    assert acts(gandiva(snapshot([N], [], fine), now=1500.0)) == []
    # Once undone (the shell records it), the same job is not packed again.
    undone = [job("a"), job("p", SUSPENDED, packable=False)]
    assert acts(gandiva(snapshot([N], [], undone), now=1000.0)) == []


def test_a_packed_job_whose_partner_left_takes_the_gpus_as_its_own() -> None:
    plan = gandiva(snapshot([N], [pending("new")], [job("p", PACKED)]), now=1500.0)
    assert acts(plan) == [("Resume", "p", None)]
    assert plan.waiting["new"].code == "no_capacity"  # the GPU is p's, not free
    # Meanwhile a packed job holds no GPU: another profile sees its GPU as free.
    plan = run("default", snapshot([N], [pending("new")], [job("p", PACKED)]), now=1500.0)
    assert launches(plan)["new"].gpu_uuids == ("n-g0",)


def test_a_packed_job_whose_partner_left_is_their_holder_before_any_turn() -> None:
    """Smaller jobs paused on part of a packed job's GPUs do not take them while its
    partner is gone (they look free: a packed job holds none): the packed job becomes
    their holder, and the turns go on with it (found replaying cluster03 with elastic
    jobs under default-gandiva, where the resumes and the holder's clashed)."""
    n = node("n", 4)
    wide = dataclasses.replace(
        placed_job("p", n, [0, 1, 2, 3], estimate_s=50_000.0), state=PACKED, state_since=900.0
    )
    paused = [
        dataclasses.replace(
            placed_job(f"s{i}", n, [2 * i, 2 * i + 1], estimate_s=50_000.0),
            state=SUSPENDED,
            state_since=800.0,
        )
        for i in (0, 1)
    ]
    for profile in ("gandiva", "default-gandiva"):
        snap = snapshot([n], [], [wide, *paused])
        plan = run(profile, snap, now=5000.0)
        assert acts(plan) == [("Resume", "p", None)], profile


def test_a_packed_job_that_cannot_hold_its_gpus_yet_runs_on_and_blocks_turns() -> None:
    """One of its GPUs is out of placement: it cannot be their holder, and it is not
    suspended for that either (a job suspended on a GPU out of placement never resumes);
    it runs on, and the job paused on its other GPU waits rather than clash with it."""
    n = dataclasses.replace(node("n", 2), out=frozenset({"n-g1"}))
    wide = dataclasses.replace(
        placed_job("p", n, [0, 1], estimate_s=50_000.0), state=PACKED, state_since=100.0
    )
    paused = dataclasses.replace(
        placed_job("s", n, [0], estimate_s=50_000.0), state=SUSPENDED, state_since=150.0
    )
    for profile in ("gandiva", "default-gandiva"):
        assert acts(run(profile, snapshot([n], [], [wide, paused]), now=5000.0)) == []


def test_one_job_packs_beside_a_holder_and_no_turn_goes_there_meanwhile() -> None:
    """With room for three on a GPU set, a packed pair still takes nobody else."""
    crowd = [job("a", util=20), job("p", PACKED, util=20), job("s", SUSPENDED, util=20)]
    spec = dataclasses.replace(BUILTIN["gandiva"], decide=("timeslice", "pack"))
    spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, timeslice_max=3))
    snap = snapshot([N], [pending("new")], crowd)
    plan = build("gandiva", spec).plan(snap, 5000.0)
    assert_valid(snap, plan)
    assert acts(plan) == []  # s neither packs beside a nor takes a's turn
    assert plan.waiting["new"].code == "no_capacity"  # nor does a newcomer take turns


def test_no_pack_where_an_opportunistic_job_shares_the_gpus() -> None:
    sharer = dataclasses.replace(placed_job("o", N, [0], utilization_pct=10), kind="opportunistic")
    snap = snapshot([N], [], [job("a", util=30), job("s", SUSPENDED, util=30), sharer])
    assert acts(gandiva(snap, 1000.0)) == []


def test_no_pack_onto_a_gpu_out_of_placement() -> None:
    """Two little-used jobs take turns on a GPU that has since faulted (`Node.out`): the
    one paused stays paused; the running one keeps the GPU until it ends."""
    out = dataclasses.replace(N, out=frozenset({"n-g0"}))
    snap = snapshot([out], [], [job("a", util=40), job("s", SUSPENDED, util=30)])
    assert acts(gandiva(snap, now=1000.0)) == []
