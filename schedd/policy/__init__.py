"""The pure policy core: `plan(snapshot, now) -> Plan`.

Nothing in this package does I/O, reads a clock or draws unseeded random numbers; the
live scheduler and the simulator call the very same functions.
"""

from __future__ import annotations

from collections.abc import Callable

from schedd.policy import fifo
from schedd.policy.actions import Plan
from schedd.policy.snapshot import Snapshot

PlanFn = Callable[[Snapshot, float], Plan]

PROFILES: dict[str, PlanFn] = {
    "fifo": fifo.plan,
}


def profile(name: str) -> PlanFn:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown policy profile {name!r}; known: {known}") from None
