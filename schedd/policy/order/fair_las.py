"""Fair shares across queues and users; inside a group, least attained service first.

The default profile's order: tenants are kept fair by DRF with decayed history, and
within a tenant short jobs pass long ones without anyone knowing run times (2D-LAS).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.fairness import fair_path, fair_ranker
from schedd.policy.order.groups import serve_tree
from schedd.policy.order.las import level
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return serve_tree(
        pending,
        view,
        fair_path,
        fair_ranker(view),
        within=lambda j: (level(j, view), -j.priority, j.submitted_at, j.job_id),
    )
