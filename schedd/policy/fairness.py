"""Shares for fair ordering: current allocation plus decayed past use, over weight.

Past use arrives as decayed GPU-seconds; dividing by the GPU-seconds the whole cluster
delivers over one decay horizon (half-life / ln 2) turns it into a share comparable with
the dominant share of what a group holds now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

from schedd.policy.queues import lineage
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """What `value` of past use weighs after `elapsed_s` (shared by store and simulator)."""
    if half_life_s <= 0:
        return 0.0
    return float(value * 0.5 ** (elapsed_s / half_life_s))


def _history_share(gpu_seconds: float, view: View) -> float:
    horizon = view.settings.half_life_s / math.log(2)
    capacity = view.total.gpus * horizon
    return gpu_seconds / capacity if capacity > 0 else 0.0


def _past_term(usage: dict[Any, float], group: Hashable, view: View) -> float:
    """The weighted past-use part of a group's share: fixed for the whole plan, while the
    part from what it holds now moves with every job the plan starts."""
    terms = _past_terms(view)
    known = terms.get(group)
    if known is None:
        past = _history_share(usage.get(group, 0.0), view)
        known = terms[group] = view.settings.history_weight * past
    return known


def _past_terms(view: View) -> dict[Hashable, float]:
    terms = view.memo.get(_PAST_TERMS)
    if terms is None:
        terms = view.memo[_PAST_TERMS] = {}
    return terms  # type: ignore[return-value]


# The memo's key of the past terms by group: a queue by its name, a user by (queue, user).
_PAST_TERMS = ("past_share",)


def queue_share(queue: str, view: View) -> float:
    """The queue's weighted share, as the fair tree ranks it (`fair_ranker`)."""
    return fair_ranker(view)(queue, 0, view)[0]


def fair_path(job: PendingJob) -> tuple[Hashable, ...]:
    """The job's place in the fair tree: each queue of its lineage, then its user."""
    return (*lineage(job.queue), (job.queue, job.user))


def fair_ranker(view: View) -> Callable[[Hashable, int, View], tuple[float, str]]:
    """A group's weighted share among its siblings (a queue, or a user in a queue: its
    share within the queue), as the fair tree ranks it after every job the plan starts.
    What stays fixed in the plan is kept in the closure once found (each group's past
    term and weight); what the plan holds now is read from the view's allocation dicts,
    which the view updates in place (`View._count`), never replacing them."""
    total = view.total
    allocated, user_allocated = view.allocated, view.user_allocated
    terms = _past_terms(view)
    weights: dict[str, float] = {}

    def rank(group: Hashable, depth: int, view: View) -> tuple[float, str]:
        past = terms.get(group)
        if isinstance(group, tuple):
            held = user_allocated.get(group)
            now = held.dominant_share(total) if held is not None else 0.0
            if past is None:
                past = _past_term(view.snapshot.usage.users, group, view)
            return (now + past, group[1])
        assert isinstance(group, str)
        held = allocated.get(group)
        now = held.dominant_share(total) if held is not None else 0.0
        if past is None:
            past = _past_term(view.snapshot.usage.queues, group, view)
        weight = weights.get(group)
        if weight is None:
            weight = weights[group] = max(view.queue(group).weight, 1e-9)
        return ((now + past) / weight, group)

    return rank
