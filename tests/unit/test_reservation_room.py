"""A reservation keeps the CPUs and memory its job counts on, not only its GPUs: a job
that would still run at the reservation's start may not take them."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import build
from schedd.policy.actions import Reserve
from schedd.policy.profiles import BUILTIN
from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC
from tests.unit.policy_harness import assert_valid, launches, node, pending, placed, snapshot

# `backfill`, reserving from the first plan (it waits a day by default).
SPEC = dataclasses.replace(
    BUILTIN["backfill"],
    settings=dataclasses.replace(BUILTIN["backfill"].settings, reserve_after_s=0.0),
)


@pytest.mark.parametrize(("gpus", "kind"), [(0, GUARANTEED), (1, OPPORTUNISTIC)])
@pytest.mark.parametrize(("estimate_s", "starts"), [(1_000_000.0, False), (600.0, True)])
def test_a_job_past_the_reservations_start_leaves_it_the_cpus_it_counts_on(
    gpus: int, kind: str, estimate_s: float, starts: bool
) -> None:
    """big needs all 8 GPUs and 32 CPUs of n1, where r1 holds 4 GPUs until 20,000 s:
    it reserves n1. A job of 40 CPUs (CPUs alone, or opportunistic beside the free
    GPUs) that would run past 20,000 s leaves 24 CPUs, too few: it waits. One that ends
    before starts at once."""
    n1 = node("n1", gpus=8, cpus=64)
    running = [placed("r1", n1, [0, 1, 2, 3], cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("other", gpus, cpus=40, at=1.0, estimate_s=estimate_s, kind=kind),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.job_id for a in plan.actions if isinstance(a, Reserve)] == ["big"]
    assert ("other" in launches(plan)) == starts
    if not starts and kind == GUARANTEED:
        assert "reserved for job big" in plan.waiting["other"].reason
