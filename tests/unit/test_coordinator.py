"""AntMan's local coordinator, driven through a simulated GPU and a fake clock."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.coordinator import (
    CoordinatorError,
    CoordinatorSettings,
    Decision,
    GpuCoordinator,
)
from tests.unit.simulated_gpu import GUARANTEED, SimulatedGpu

TOTAL = 81920  # MiB, an 80 GiB GPU
OT = "ot.1"
LIMIT = 1.05 + 1e-9  # the default slowdown, with room for float rounding
HEADROOM = 1024  # the default


def cap(guaranteed_peak: int, jobs: int = 1) -> int:
    """What the defaults give each opportunistic job: an equal part, in 64 MiB steps."""
    each = (TOTAL - guaranteed_peak - HEADROOM) // jobs
    return each - each % 64


def gpu(
    interference: float = 0.1, noise: float = 0.0, seed: int = 0, **settings_: int | float
) -> SimulatedGpu:
    coordinator = GpuCoordinator("GPU-0", TOTAL, CoordinatorSettings(**settings_))  # type: ignore[arg-type]
    return SimulatedGpu(coordinator, interference=interference, noise=noise, seed=seed)


def sharing(
    interference: float = 0.1, noise: float = 0.0, seed: int = 0, **kw: int | float
) -> SimulatedGpu:
    """A guaranteed job with one opportunistic job beside it."""
    sim = gpu(interference, noise, seed, **kw)
    sim.join(GUARANTEED, "guaranteed")
    sim.join(OT, "opportunistic")
    return sim


def mean_slowdown(sim: SimulatedGpu, steps: int) -> float:
    return statistics.mean(s.slowdown for s in sim.recent(steps))


def shares(sim: SimulatedGpu, steps: int) -> list[int]:
    return [s.total_share for s in sim.recent(steps)]


# ---- compute: AIMD on the opportunistic share ------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_share_converges_with_the_guaranteed_job_under_the_limit(seed: int) -> None:
    # 2 % noise per step; at interference 0.1 a share of 50 costs exactly the 5 % allowed.
    sim = sharing(interference=0.1, noise=0.02, seed=seed)
    sim.run(600)
    assert mean_slowdown(sim, 200) <= LIMIT
    recent = shares(sim, 200)
    assert statistics.mean(recent) >= 25  # well above the floor of 0
    assert min(recent) >= 10  # never stuck at the floor
    assert max(recent) >= 35


def test_noiseless_share_settles_where_the_interference_allows() -> None:
    # The share that would cost 5 % is 41.7, 16.7 and 5.6: it settles just below.
    for interference, settled in [(0.12, 41), (0.3, 16), (0.9, 5)]:
        sim = sharing(interference=interference)
        sim.run(600)
        assert shares(sim, 200) == [settled] * 200, interference
        assert max(s.slowdown for s in sim.recent(200)) <= LIMIT


def test_without_interference_the_share_rises_to_100_and_stays() -> None:
    sim = sharing(interference=0.0, noise=0.02, seed=3)
    sim.run(800)
    assert shares(sim, 200) == [100] * 200
    assert sim.applied[OT] == (100, cap(8000))


def test_share_follows_the_interference_both_ways() -> None:
    sim = sharing(interference=0.12)
    sim.run(600)
    sim.interference = 0.6  # the opportunistic job turned heavier: 41 now costs 24.6 %
    cut = sim.run(40)
    assert cut and (cut[0].previous_share, cut[0].share) == (41, 20)
    sim.run(400)
    assert shares(sim, 100) == [8] * 100  # 4.8 %
    sim.interference = 0.12
    sim.run(600)
    assert shares(sim, 100) == [41] * 100


def test_a_cut_is_multiplicative_and_says_why() -> None:
    sim = sharing(interference=0.1, initial_share=80)
    learned = [d for d in sim.run(60) if d.share != d.previous_share]
    assert [(d.previous_share, d.share) for d in learned] == [(0, 80)]
    cut = sim.run(20)  # one window at share 80: 1.08x
    assert [(d.previous_share, d.share) for d in cut] == [(80, 40)]
    assert cut[0].reason == (
        f"guaranteed job {GUARANTEED} at 1.080x its solo step time (limit 1.05x): share 80 -> 40"
    )


def test_an_increase_stops_short_of_the_limit() -> None:
    # At 38 the slowdown is 4.56 %: +5 would cross 5 % (at 41.7), so it gets only +3.
    sim = sharing(interference=0.12, initial_share=38)
    sim.run(52 + 20)  # learned at step 52, one window after it
    assert (sim.decisions[-1].previous_share, sim.decisions[-1].share) == (38, 41)


# ---- schedd's limits: a bound on what the coordinator gives --------------------------


def bound(sim: SimulatedGpu, share: int, cap_mib: int | None) -> list[Decision]:
    return sim._apply(sim.coordinator.set_bound(OT, share, cap_mib, sim.clock.now))


def test_a_bound_caps_the_share_and_the_memory_the_coordinator_gives() -> None:
    sim = sharing(interference=0.0)  # nothing holds the share back but the bound
    sim.run(800)
    assert sim.applied[OT] == (100, cap(8000))
    lowered = bound(sim, 30, 4096)
    assert [(d.share, d.memory_cap_mib) for d in lowered] == [(30, 4096)]
    assert lowered[0].reason.startswith(f"schedd bounds {OT} at share 30, memory cap 4096 MiB")
    sim.run(300)
    assert shares(sim, 100) == [30] * 100  # AIMD raises it no further
    assert sim.applied[OT] == (30, 4096)
    bound(sim, 100, None)  # lifted: it climbs again from where it is, by AIMD's steps
    climbed = [d.share for d in sim.run(800)]
    assert climbed[:2] == [35, 40] and sim.applied[OT] == (100, cap(8000))


def test_a_bound_holds_one_job_while_its_neighbour_climbs() -> None:
    sim = sharing(interference=0.0)
    sim.join("ot.2", "opportunistic")
    bound(sim, 30, None)
    sim.run(1000)
    assert (sim.applied[OT][0], sim.applied["ot.2"][0]) == (30, 100)


def test_a_bound_above_what_the_room_allows_changes_nothing() -> None:
    sim = sharing(interference=0.12)
    sim.run(600)
    assert sim.applied[OT] == (41, cap(8000))
    assert bound(sim, 60, cap(8000) + 64) == []
    sim.run(300)
    assert shares(sim, 100) == [41] * 100


def test_a_cut_never_leaves_the_share_above_the_bound() -> None:
    sim = sharing(interference=0.1, min_share=20, initial_share=20)
    sim.run(300)
    bound(sim, 10, None)
    sim.interference = 1.0  # 10 now costs 10 %: cuts, but not up to the floor of 20
    sim.run(300)
    assert max(shares(sim, 200)) <= 10


def test_alone_on_its_gpu_a_bounded_job_gets_the_bound_not_the_whole_gpu() -> None:
    sim = gpu(interference=0.3)  # beside the guaranteed job it settles at 16
    sim.join(OT, "opportunistic")
    assert [(d.share, d.memory_cap_mib) for d in bound(sim, 50, 2048)] == [(50, 2048)]
    sim.join(GUARANTEED, "guaranteed")
    sim.run(600)
    assert sim.applied[OT] == (16, 2048)
    left = sim.leave(GUARANTEED)
    assert [(d.share, d.memory_cap_mib) for d in left] == [(50, 2048)]


def test_a_bound_is_checked_and_a_stranger_ignored() -> None:
    sim = sharing()
    with pytest.raises(CoordinatorError, match="a share of 0-100"):
        sim.coordinator.set_bound(OT, 101, None, 0.0)
    with pytest.raises(CoordinatorError, match="memory cap of at least 0 MiB"):
        sim.coordinator.set_bound(OT, 50, -1, 0.0)
    assert sim.coordinator.set_bound("nobody.1", 50, None, 0.0) == []
    assert sim.coordinator.set_bound(GUARANTEED, 50, None, 0.0) == []


# ---- learning the solo step time -------------------------------------------------------


def test_opportunistic_jobs_are_paused_while_the_solo_time_is_learned() -> None:
    sim = gpu(warmup_steps=3, settle_steps=2, solo_samples=10)
    sim.join(GUARANTEED, "guaranteed")
    joined = sim.join(OT, "opportunistic")
    assert [(d.share, d.memory_cap_mib) for d in joined] == [(0, cap(0))]
    assert f"paused while {GUARANTEED}'s solo step time is learned" in joined[0].reason
    for step in range(1, 13):
        assert all(d.share == 0 for d in sim.step()), step
    assert sim.coordinator.solo_step_s is None
    learned = sim.step()  # step 13: 3 warm-up steps, then 10 solo ones
    assert [(d.previous_share, d.share) for d in learned] == [(0, 10)]
    assert sim.coordinator.solo_step_s == pytest.approx(0.1)


def test_a_job_joining_a_guaranteed_job_that_ran_alone_starts_at_once() -> None:
    sim = gpu()
    sim.join(GUARANTEED, "guaranteed")
    sim.run(100)
    assert sim.coordinator.solo_step_s == pytest.approx(0.1)
    joined = sim.join(OT, "opportunistic")
    assert [(d.share, d.memory_cap_mib) for d in joined] == [(10, cap(8000))]


def test_relearns_when_the_guaranteed_job_gets_much_faster() -> None:
    sim = sharing(interference=0.12)
    sim.run(600)
    sim.solo_s = 0.07  # e.g. a shorter sequence length from here on
    paused = sim.run(40)
    assert [(d.previous_share, d.share) for d in paused] == [(41, 0)]
    assert "faster than solo, re-learning" in paused[0].reason
    sim.run(60)
    assert sim.coordinator.solo_step_s == pytest.approx(0.07)
    assert sim.applied[OT][0] == 41  # back to the share it had
    sim.run(200)
    assert max(s.slowdown for s in sim.recent(100)) <= LIMIT


@pytest.mark.parametrize("floor", [0, 5])
def test_relearns_when_the_guaranteed_job_gets_much_slower(floor: int) -> None:
    sim = sharing(interference=0.12, min_share=floor, initial_share=max(10, floor))
    sim.run(600)
    sim.solo_s = 0.2  # twice as slow on its own: no share can meet the old solo time
    decisions = sim.run(600)
    # At the floor of 0 the paused steps are solo steps that re-learn it; above 0 the
    # coordinator pauses the job to re-learn it, as cutting further changes nothing.
    assert any(d.share == 0 for d in decisions)
    if floor:
        assert any("at the floor; re-learning" in d.reason for d in decisions)
    assert sim.coordinator.solo_step_s == pytest.approx(0.2)
    assert shares(sim, 100) == [41] * 100  # and the share is back where it belongs


# ---- memory --------------------------------------------------------------------------


def test_a_memory_surge_caps_the_opportunistic_job_in_that_same_step() -> None:
    sim = sharing(interference=0.12)
    sim.run(300)
    share = sim.applied[OT][0]
    assert sim.applied[OT] == (share, cap(8000))
    sim.guaranteed_peak_mib = 40000
    surge = sim.step()
    assert [(d.job_key, d.share, d.memory_cap_mib) for d in surge] == [(OT, share, cap(40000))]
    assert "memory peak rose to 40000 MiB (caps assumed 8000)" in surge[0].reason


def test_caps_come_back_only_after_a_window_below_the_peak() -> None:
    sim = sharing(interference=0.0, window=20)
    sim.run(100)
    sim.guaranteed_peak_mib = 40000
    sim.step()
    sim.guaranteed_peak_mib = 8000  # its peak statistics were reset
    for _ in range(19):
        assert all(d.memory_cap_mib == cap(40000) for d in sim.step())
    back = sim.step()
    assert [d.memory_cap_mib for d in back] == [cap(8000)]


def test_caps_move_in_steps_not_at_every_mib() -> None:
    sim = sharing(interference=0.0, cap_step_mib=256)
    sim.run(100)
    caps = set()
    for _ in range(100):
        sim.guaranteed_peak_mib += 3  # creeping up
        sim.step()
        caps.add(sim.applied[OT][1])
    assert len(caps) == 2  # 300 MiB of creep crossed one 256 MiB step, not 100 caps
    assert all(c is not None and c % 256 == 0 for c in caps)


def test_no_memory_left_pauses_the_job_until_there_is() -> None:
    sim = sharing(interference=0.12, min_cap_mib=1024)
    sim.run(600)
    sim.guaranteed_peak_mib = TOTAL - 1024 - 512  # 512 MiB would be left: below 1024
    paused = sim.step()
    assert [(d.share, d.memory_cap_mib) for d in paused] == [(0, 512)]
    assert "paused" in paused[0].reason
    sim.guaranteed_peak_mib = TOTAL - 1024 - 10_000
    assert sim.run(19) == []
    back = sim.step()
    assert [(d.share, d.memory_cap_mib) for d in back] == [(41, 9984)]
    assert "room for opportunistic jobs again" in back[0].reason


def test_caps_never_go_negative() -> None:
    sim = sharing(interference=0.1)
    sim.guaranteed_peak_mib = TOTAL + 5000  # more than the GPU has, as reported
    sim.step()
    assert sim.applied[OT] == (0, 0)


def test_expected_peak_holds_until_the_job_shows_less() -> None:
    sim = gpu(window=20)
    sim.join(OT, "opportunistic")
    joined = sim.join(GUARANTEED, "guaranteed", expected_peak_mib=30000)
    assert [(d.share, d.memory_cap_mib) for d in joined] == [(0, cap(30000))]
    sim.run(19)
    assert sim.applied[OT][1] == cap(30000)
    sim.step()
    assert sim.applied[OT][1] == cap(8000)


# ---- several jobs, joining and leaving -------------------------------------------------


def test_two_opportunistic_jobs_split_the_memory_and_the_slowdown() -> None:
    sim = sharing(interference=0.12)
    sim.join("ot.2", "opportunistic")
    sim.step()  # the guaranteed job's first report: 8000 MiB
    assert {k: c for k, (_, c) in sim.applied.items()} == {OT: cap(8000, 2), "ot.2": cap(8000, 2)}
    sim.run(800)
    assert max(s.slowdown for s in sim.recent(200)) <= LIMIT
    assert sim.applied[OT][0] + sim.applied["ot.2"][0] >= 36  # together near the 41 allowed
    assert min(sim.applied[OT][0], sim.applied["ot.2"][0]) > 0
    left = sim.leave("ot.2")
    assert [(d.job_key, d.memory_cap_mib) for d in left] == [(OT, cap(8000))]
    assert "opportunistic job ot.2 left" in left[0].reason


def test_without_a_guaranteed_job_opportunistic_jobs_run_free() -> None:
    sim = gpu()
    assert sim.join(OT, "opportunistic") == []  # share 100, no cap: the shim's defaults
    assert sim.join("ot.2", "opportunistic") == []
    sim.join(GUARANTEED, "guaranteed")
    sim.run(300)
    assert all(cap is not None for _, cap in sim.applied.values())
    left = sim.leave(GUARANTEED)
    assert {(d.job_key, d.share, d.memory_cap_mib) for d in left} == {
        (OT, 100, None),
        ("ot.2", 100, None),
    }
    assert sim.coordinator.step(GUARANTEED, 0.1, 8000, 0.0) == []
    assert sim.coordinator.state().solo_step_s is None


def test_a_new_guaranteed_job_is_learned_afresh() -> None:
    sim = sharing(interference=0.12)
    sim.run(300)
    sim.leave(GUARANTEED)
    sim.solo_s = 0.3
    joined = sim.join("g.2", "guaranteed")
    assert [(d.share) for d in joined] == [0]
    sim.run(60)
    assert sim.coordinator.solo_step_s == pytest.approx(0.3)
    assert sim.coordinator.state().guaranteed == "g.2"


def test_a_restarted_agent_does_not_resend_what_the_job_applies() -> None:
    coordinator = GpuCoordinator("GPU-0", TOTAL)
    coordinator.job_joined(GUARANTEED, "guaranteed", 0.0)
    joined = coordinator.job_joined(
        OT, "opportunistic", 0.0, applied_share=0, applied_cap_mib=cap(0)
    )
    assert joined == []


def test_misuse_is_refused_and_strays_are_ignored() -> None:
    coordinator = GpuCoordinator("GPU-0", TOTAL)
    coordinator.job_joined(GUARANTEED, "guaranteed", 0.0)
    with pytest.raises(CoordinatorError, match="already has guaranteed job"):
        coordinator.job_joined("g.2", "guaranteed", 0.0)
    with pytest.raises(CoordinatorError, match="already joined"):
        coordinator.job_joined(GUARANTEED, "opportunistic", 0.0)
    with pytest.raises(CoordinatorError, match="kind"):
        coordinator.job_joined("x.1", "best-effort", 0.0)  # type: ignore[arg-type]
    assert coordinator.step("unknown.1", 0.1, 100, 0.0) == []
    assert coordinator.job_left("unknown.1", 0.0) == []


# ---- settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("slowdown", 0),
        ("slowdown", -0.1),
        ("slowdown", float("nan")),
        ("decrease", 1.0),
        ("decrease", 0),
        ("increase", 0),
        ("increase", 2.5),
        ("min_share", 101),
        ("initial_share", 3),  # below min_share=5 below
        ("window", 0),
        ("solo_samples", True),
        ("warmup_steps", -1),
        ("relearn_drop", 1),
        ("headroom_mib", -1),
        ("min_cap_mib", 0),
        ("cap_step_mib", "64"),
    ],
)
def test_settings_are_checked_by_name(field: str, value: object) -> None:
    extra: dict[str, object] = {"min_share": 5} if field == "initial_share" else {}
    with pytest.raises(ValueError, match=f"CoordinatorSettings.{field} must"):
        CoordinatorSettings(**{**extra, field: value})  # type: ignore[arg-type]


def test_total_memory_must_be_positive() -> None:
    with pytest.raises(ValueError, match="total_memory_mib"):
        GpuCoordinator("GPU-0", 0)


# ---- properties ----------------------------------------------------------------------

_KEYS = ["g.1", "g.2", "o.1", "o.2", "o.3"]
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(_KEYS), st.none() | st.integers(0, 100_000)),
        st.tuples(st.just("leave"), st.sampled_from(_KEYS), st.none()),
        st.tuples(
            st.just("step"),
            st.floats(0.0, 2.0),
            st.none() | st.integers(0, 100_000),
        ),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    min_share=st.integers(0, 20),
    window=st.integers(1, 4),
    solo_samples=st.integers(1, 4),
    headroom=st.integers(0, 4096),
    total=st.integers(1, 40_000),
)
def test_decisions_stay_in_bounds(
    ops: list[tuple[str, object, object]],
    min_share: int,
    window: int,
    solo_samples: int,
    headroom: int,
    total: int,
) -> None:
    s = CoordinatorSettings(
        min_share=min_share,
        initial_share=max(10, min_share),
        window=window,
        solo_samples=solo_samples,
        warmup_steps=0,
        headroom_mib=headroom,
    )
    coordinator = GpuCoordinator("GPU-0", total, s)
    applied: dict[str, tuple[int, int | None]] = {}
    guaranteed: str | None = None
    now = 0.0

    def check(decisions: list[Decision]) -> None:
        for d in decisions:
            assert (d.previous_share, d.previous_memory_cap_mib) == applied[d.job_key]
            assert (d.share, d.memory_cap_mib) != applied[d.job_key]
            assert d.share == 0 or min_share <= d.share <= 100
            assert d.memory_cap_mib is None or d.memory_cap_mib >= 0
            applied[d.job_key] = (d.share, d.memory_cap_mib)

    for op, a, b in ops:
        now += 1.0
        if op == "join" and isinstance(a, str):
            kind = "guaranteed" if a.startswith("g") else "opportunistic"
            if a in applied or a == guaranteed or (kind == "guaranteed" and guaranteed):
                continue
            if kind == "guaranteed":
                guaranteed = a
            else:
                applied[a] = (100, None)
            check(coordinator.job_joined(a, kind, now, expected_peak_mib=b))  # type: ignore[arg-type]
        elif op == "leave" and isinstance(a, str):
            guaranteed = None if a == guaranteed else guaranteed
            applied.pop(a, None)
            check(coordinator.job_left(a, now))
        elif op == "step" and guaranteed is not None:
            assert isinstance(a, float)
            peak = b if isinstance(b, int) else None
            check(coordinator.step(guaranteed, a, peak, now))
            state = coordinator.state()
            assert state.guaranteed_peak_mib is not None
            if peak is not None:  # the caps protect the peak just reported, at once
                assert state.guaranteed_peak_mib >= peak
        state = coordinator.state()
        assert state.opportunistic == applied
        if guaranteed is None:
            assert all(v == (100, None) for v in applied.values())
            continue
        caps = [cap for _, cap in applied.values()]
        assert all(cap is not None for cap in caps)
        peak_mib = state.guaranteed_peak_mib or 0
        if total - peak_mib - headroom >= 0:
            assert sum(c or 0 for c in caps) + peak_mib + headroom <= total
        for share, cap in applied.values():
            if cap is not None and cap < s.min_cap_mib:
                assert share == 0
