"""Best fit: the node left fullest after the job, so that large holes stay open."""

from __future__ import annotations

from collections import Counter

from schedd.policy.placement import (
    NoFit,
    Placement,
    candidates,
    fit_on,
    needs_spreading,
    no_fit,
    spread,
)
from schedd.policy.snapshot import PendingJob, Shard
from schedd.policy.view import View


def place(job: PendingJob, view: View) -> Placement | NoFit:
    if needs_spreading(job, view):
        gang = spread(view, job, view.capacity)
        if gang is not None:
            return gang
        return no_fit(view, job, Counter({"together with too few free GPUs": len(view.capacity)}))
    filtered: Counter[str] = Counter()
    for node_id in candidates(view, job.request.gpus):
        fit = fit_on(view, node_id, job)
        if isinstance(fit, str):
            filtered[fit] += 1
            continue
        return Placement((Shard(node_id, fit),))
    return no_fit(view, job, filtered)
