"""Serve pending jobs from a tree of groups (queues, sub-queues, users) by fair rank.

Each level compares siblings only (Slurm's fair tree): the root's children are ranked
against each other, then the chosen child's children, down to a user's own jobs. After
each job is handed out the ranks along its path are read again if the plan changed the
view meanwhile, since starting it may have grown them (progressive filling, as DRF
asks); nothing else in the tree changed, so one hand-out costs a few heap operations,
not a re-sort, and a job that only waited costs none.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from schedd.policy.order.priority import key as priority_key
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View

Rank = tuple[Any, ...]
# A job's path of group keys: a function of its queue and user alone (asked once per pair).
PathFn = Callable[[PendingJob], tuple[Hashable, ...]]
RankFn = Callable[[Hashable, int, View], Rank]  # (group key, depth, view)


class _Group:
    __slots__ = ("children", "heap", "jobs", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key  # what `rank` is asked of
        self.children: dict[Hashable, _Group] = {}
        self.heap: list[tuple[Rank, int, _Group]] = []
        self.jobs: deque[PendingJob] = deque()


def serve_tree(
    pending: Sequence[PendingJob],
    view: View,
    path_of: PathFn,
    rank: RankFn,
    within: Callable[[PendingJob], Any] | None = priority_key,
) -> Iterator[PendingJob]:
    """`within` orders a group's own jobs; None: `pending` is in that order already."""
    root = _Group(None)
    leaves: dict[tuple[str, str], deque[PendingJob]] = {}
    for job in pending if within is None else sorted(pending, key=within):
        leaf = leaves.get((job.queue, job.user))
        if leaf is None:
            node = root
            for key in path_of(job):
                child = node.children.get(key)
                if child is None:
                    child = node.children[key] = _Group(key)
                node = child
            leaf = leaves[(job.queue, job.user)] = node.jobs
        leaf.append(job)
    seq = 0

    def fill(node: _Group, depth: int) -> None:
        nonlocal seq
        for key, child in node.children.items():
            fill(child, depth + 1)
            node.heap.append((rank(key, depth, view), seq, child))
            seq += 1
        heapq.heapify(node.heap)

    fill(root, 0)
    while root.heap:
        path: list[_Group] = []
        node = root
        while node.heap:
            path.append(node)
            node = node.heap[0][2]
        generation = view.generation
        yield node.jobs.popleft()
        # While the plan changes nothing, no rank moves: the same group stays on top.
        while node.jobs and view.generation == generation:
            yield node.jobs.popleft()
        changed = view.generation != generation
        # Bottom up: re-rank each group on the path in its parent's heap.
        for depth in range(len(path) - 1, -1, -1):
            parent = path[depth]
            _, order, child = parent.heap[0]
            if not child.heap and not child.jobs:
                heapq.heappop(parent.heap)
            elif changed:
                heapq.heapreplace(parent.heap, (rank(child.key, depth, view), order, child))
            else:
                break  # nothing above changed either
