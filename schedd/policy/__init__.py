"""The pure policy core: `plan(snapshot, now) -> Plan`.

Nothing in this package does I/O, reads a clock or draws unseeded random numbers; the
live scheduler and the simulator call the very same functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from schedd.policy import framework
from schedd.policy.actions import Plan
from schedd.policy.immutable import immutable
from schedd.policy.profiles import BUILTIN, ProfileSpec, stages
from schedd.policy.snapshot import Snapshot

PlanFn = Callable[[Snapshot, float], Plan]


@immutable
class Profile:
    """A named policy: its plan function and what the shell must give it.

    `pending_window` bounds the pending jobs (oldest first) put in each snapshot. A
    policy that only ever starts jobs from the head of the queue needs no more; the
    scheduler plans again at once whenever a cycle started jobs from a full window.
    `tick_s`: plan again this often even without events (policies whose order changes
    with time, as attained service grows); None: events only. `estimates`: where the
    shell takes `estimate_s` from: "history" (the user's past jobs of the same name) or
    "oracle" (the true run time; only a simulator knows it).
    """

    name: str
    plan: PlanFn
    pending_window: int
    tick_s: float | None = None
    estimates: str = "history"
    spec: ProfileSpec | None = None


def build(name: str, spec: ProfileSpec) -> Profile:
    """A profile from its spec; raises `ProfileError` naming the bad field."""
    label = f"{name}: {spec.order} order, {spec.place} placement"
    return Profile(
        name=name,
        plan=functools.partial(framework.plan, stages(spec, label)),
        pending_window=spec.pending_window,
        tick_s=spec.tick_s,
        estimates=spec.estimates,
        spec=spec,
    )


PROFILES: dict[str, Profile] = {name: build(name, spec) for name, spec in BUILTIN.items()}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown policy profile {name!r}; known: {known}") from None
