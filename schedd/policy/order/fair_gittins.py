"""Fair shares across queues and users; inside a group, highest Gittins index first.

As `fair_las`, with the 2D-LAS queues replaced by the index learned from finished jobs
(`order.gittins`): the tenant tree stays fair by DRF, and within a tenant the order
adapts to how the cluster's run times are distributed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.fairness import fair_path, fair_rank
from schedd.policy.order.gittins import rank
from schedd.policy.order.groups import serve_tree
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return serve_tree(
        pending,
        view,
        fair_path,
        fair_rank,
        within=lambda j: (rank(j, view), -j.priority, j.submitted_at, j.job_id),
    )
