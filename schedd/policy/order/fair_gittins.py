"""Fair shares across queues and users; inside a group, highest Gittins index first.

As `fair_las`, with the 2D-LAS queues replaced by the index learned from finished jobs
(`order.gittins`): the tenant tree stays fair by DRF, and within a tenant the order
adapts to how the cluster's run times are distributed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.fairness import fair_path, fair_ranker
from schedd.policy.kept import Kept
from schedd.policy.order.gittins import pending_rank, table
from schedd.policy.order.groups import serve_tree
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View

_sorted = Kept[list[PendingJob]]()


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    # A pending job's index is fixed (its service does not grow while it waits), so the
    # order within groups holds while the pending jobs and the table are the same.
    learned = table(view)
    # Without a table the order is 2D-LAS, whose levels come from the settings.
    within = _sorted.get(pending, learned, view.settings)
    if within is None:
        ranked = pending_rank(view)
        # Keys made in one pass and sorted by position: a key function per comparison
        # run would call `ranked` through another call for every job.
        keys = [(ranked(j), -j.priority, j.submitted_at, j.job_id) for j in pending]
        by_key = sorted(range(len(pending)), key=keys.__getitem__)
        within = _sorted.put([pending[i] for i in by_key], pending, learned, view.settings)
    return serve_tree(within, view, fair_path, fair_ranker(view), within=None)
