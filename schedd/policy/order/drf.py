"""Dominant Resource Fairness across queues (level by level) and across users in a queue.

The group with the smallest weighted dominant share, counting decayed past use, goes
next; within a user's jobs, priority then submission order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.fairness import fair_path, fair_ranker
from schedd.policy.order.groups import serve_tree
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return serve_tree(pending, view, fair_path, fair_ranker(view))
