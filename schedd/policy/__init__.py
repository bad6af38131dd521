"""The pure policy core: `plan(snapshot, now) -> Plan`.

Nothing in this package does I/O, reads a clock or draws unseeded random numbers; the
live scheduler and the simulator call the very same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schedd.policy import fifo
from schedd.policy.actions import Plan
from schedd.policy.snapshot import Snapshot

PlanFn = Callable[[Snapshot, float], Plan]


@dataclass(frozen=True, slots=True)
class Profile:
    """A named policy: its plan function and how much of the pending queue it reads.

    `pending_window` bounds the pending jobs (oldest first) put in each snapshot. A
    policy that only ever starts jobs from the head of the queue needs no more; the
    scheduler plans again at once whenever a cycle started jobs from a full window.
    """

    name: str
    plan: PlanFn
    pending_window: int


PROFILES: dict[str, Profile] = {
    "fifo": Profile("fifo", fifo.plan, pending_window=128),
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown policy profile {name!r}; known: {known}") from None
