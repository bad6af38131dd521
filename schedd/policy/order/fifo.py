"""First come, first served: submission order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def order(pending: Sequence[PendingJob], view: View) -> Iterator[PendingJob]:
    return iter(pending)  # the snapshot holds them in submission order
