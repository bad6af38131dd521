"""`Plan.recheck_at` may be left to be found when first read: found once, at most."""

from __future__ import annotations

import pytest

from schedd.policy.actions import Plan


def test_a_deferred_recheck_is_found_once_when_first_read() -> None:
    calls: list[int] = []

    def find() -> float:
        calls.append(1)
        return 42.0

    plan = Plan()
    plan.defer_recheck(find)
    assert "recheck_at=<deferred>" in repr(plan)  # a repr does not run the policy
    assert calls == []
    assert plan.recheck_at == 42.0 and plan.recheck_at == 42.0
    assert len(calls) == 1


def test_setting_the_recheck_drops_a_deferred_one() -> None:
    plan = Plan(recheck_at=5.0)
    plan.defer_recheck(lambda: 9.0)
    plan.recheck_at = None
    assert plan.recheck_at is None


def test_with_recheck_found_finds_it_now() -> None:
    calls: list[int] = []
    plan = Plan()
    plan.defer_recheck(lambda: calls.append(1) or 3.0)
    assert plan.with_recheck_found() is plan and calls == [1]
    assert plan.recheck_at == 3.0 and calls == [1]


def test_a_recheck_that_failed_fails_again_when_read_again() -> None:
    def find() -> float:
        raise RuntimeError("no view")

    plan = Plan()
    plan.defer_recheck(find)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            _ = plan.recheck_at
