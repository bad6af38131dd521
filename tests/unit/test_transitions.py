"""The transition table, pair by pair: the legal ones are exactly these."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from shared.model import (
    HOLDS_RESOURCES,
    TERMINAL,
    IllegalTransition,
    JobState,
    check_transition,
    sources_of,
)

S = JobState
LEGAL = {
    (S.PENDING, S.ASSIGNED),
    (S.PENDING, S.CANCELLED),
    (S.ASSIGNED, S.RUNNING),
    (S.ASSIGNED, S.PENDING),
    (S.ASSIGNED, S.FAILED),
    (S.ASSIGNED, S.CANCELLING),
    (S.ASSIGNED, S.SUCCEEDED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.CANCELLING),
    (S.ASSIGNED, S.PREEMPTING),
    (S.RUNNING, S.PREEMPTING),
    (S.PREEMPTING, S.PENDING),
    (S.PREEMPTING, S.CANCELLING),
    (S.CANCELLING, S.CANCELLED),
    (S.CANCELLING, S.SUCCEEDED),
    (S.CANCELLING, S.FAILED),
    (S.RUNNING, S.CHECKPOINTED),
    (S.CHECKPOINTED, S.PENDING),
    (S.CHECKPOINTED, S.CANCELLED),
}
ALL_PAIRS = list(itertools.product(JobState, JobState))


@pytest.mark.parametrize(("src", "dst"), sorted(LEGAL))
def test_legal_pair_is_allowed_with_a_meaning(src: JobState, dst: JobState) -> None:
    assert check_transition(src, dst)


@pytest.mark.parametrize(("src", "dst"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_pair_is_refused(src: JobState, dst: JobState) -> None:
    with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
        check_transition(src, dst)


def test_terminal_states_have_no_way_out() -> None:
    for src in TERMINAL:
        assert not [dst for dst in JobState if (src, dst) in LEGAL]


def test_every_state_is_reachable_from_pending() -> None:
    seen, frontier = {S.PENDING}, [S.PENDING]
    while frontier:
        src = frontier.pop()
        for dst in JobState:
            if (src, dst) in LEGAL and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(JobState)


def test_sources_of_lists_what_the_table_allows() -> None:
    for dst in JobState:
        assert set(sources_of(dst)) == {s for s, d in LEGAL if d == dst}


def test_only_placed_states_hold_resources() -> None:
    assert {S.ASSIGNED, S.RUNNING, S.PREEMPTING, S.CANCELLING} == HOLDS_RESOURCES
    assert not HOLDS_RESOURCES & TERMINAL


def test_database_accepts_exactly_the_model_states() -> None:
    """The latest migration that sets the state check lists exactly the model's states."""
    migrations = sorted((Path(__file__).parents[2] / "schedd/store/migrations").glob("*.sql"))
    checks = [
        block.group(1)
        for path in migrations
        if (block := re.search(r"CHECK \(state IN\s*\(([^)]*)\)\)", path.read_text()))
    ]
    assert checks, "no migration sets the state check"
    assert set(re.findall(r"'(\w+)'", checks[-1])) == {s.value for s in JobState}
