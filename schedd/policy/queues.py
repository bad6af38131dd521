"""Queues as virtual clusters: a hierarchy of `org/team` names with guarantees and limits.

A queue's usage counts towards each of its ancestors, so `org`'s max bounds all its teams
together. A job naming a queue that is not configured is treated as a queue with no
guarantee, no max and weight 1 (a cluster with no queues configured has no quotas).
"""

from __future__ import annotations

import functools

from schedd.policy.immutable import immutable
from schedd.policy.resources import NOTHING, Resources


@immutable
class QueueSpec:
    name: str  # "org" or "org/team"
    guarantee: Resources = NOTHING
    # Borrowing limit; None: may borrow any idle capacity. Its CPUs, memory or GPU
    # memory left at 0 are not limited (see Resources.exceeds_with).
    max: Resources | None = None
    weight: float = 1.0
    # A user may hold up to this factor times the queue's guarantee (YARN's
    # user-limit-factor); None: no per-user limit.
    user_limit_factor: float | None = None


# Cached: every plan asks it for every job, and a cluster has few queues.
@functools.lru_cache(maxsize=4096)
def lineage(queue: str) -> tuple[str, ...]:
    """The queue and its ancestors, root first: "a/b/c" -> ("a", "a/b", "a/b/c")."""
    parts = queue.split("/")
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))


def unconfigured(name: str) -> QueueSpec:
    return QueueSpec(name)
