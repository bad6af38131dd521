"""YARN's capacity scheduler: the queue furthest below its guarantee goes first.

Queues are ranked by used / guaranteed GPUs (a queue with no guarantee after all that
have one), then by fair share; jobs inside a queue in priority, then submission order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

from schedd.policy.fairness import queue_share
from schedd.policy.order.groups import Rank, serve_tree
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def _rank(group: Hashable, depth: int, view: View) -> Rank:
    queue = str(group)
    guarantee = view.queue(queue).guarantee.gpus
    held = view.allocated.get(queue)
    used = held.gpus if held is not None else 0
    ratio = used / guarantee if guarantee > 0 else float("inf")
    return (ratio, queue_share(queue, view), queue)


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return serve_tree(pending, view, lambda j: (j.queue,), _rank)
