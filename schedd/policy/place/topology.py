"""Topology-aware placement: one node, else one rack, else one domain; affinity; best fit.

A job that fits on a node goes on the fullest node that takes it, preferring, among the
nodes equally full, one already running jobs of the same GPU count (Gandiva's affinity:
such nodes free up in shapes that suit each other). A gang larger than any node goes to
the rack, else the domain, with the fewest free GPUs that can hold it (labels `rack` and
`domain` of the nodes), over as few nodes as possible.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import chain, islice

from schedd.policy.placement import (
    NoFit,
    Placement,
    fit_on,
    gang_room,
    needs_spreading,
    no_fit,
    spread,
)
from schedd.policy.snapshot import PendingJob, Shard
from schedd.policy.view import View

# Nodes of one fullness compared for affinity; bounds the work on a big, idle cluster.
AFFINITY_SCAN = 32


def place(job: PendingJob, view: View) -> Placement | NoFit:
    if needs_spreading(job, view):
        return _gang(job, view)
    filtered: Counter[str] | None = None  # made at the first node that does not fit
    gpus = job.request.gpus
    sizes = view.gpu_sizes
    for bucket in view.by_free[gpus:]:
        if not bucket:
            continue
        # Affinity is a dict lookup and a fit check is not: rank a slice of the bucket by
        # affinity (ties in bucket order), then check fits in that order.
        scan = list(islice(bucket, AFFINITY_SCAN))
        affinity = [on.get(gpus, 0) if (on := sizes.get(n)) else 0 for n in scan]
        ranked = scan  # all alike (an idle cluster's): in bucket order
        if any(affinity):  # a stable sort: ties in bucket order
            ranked = [scan[i] for i in sorted(range(len(scan)), key=lambda i: -affinity[i])]
        # The rest lazily: the first node tried mostly takes the job, and the bucket of
        # an idle cluster holds every node (nothing changes it until the job returns).
        for node_id in chain(ranked, islice(bucket, AFFINITY_SCAN, None)):
            fit = fit_on(view, node_id, job)
            if isinstance(fit, str):
                if filtered is None:
                    filtered = Counter()
                filtered[fit] += 1
                continue
            return Placement((Shard(node_id, fit),))
    return no_fit(view, job, Counter() if filtered is None else filtered)


def _gang(job: PendingJob, view: View) -> Placement | NoFit:
    for label in ("rack", "domain"):
        groups: dict[str, list[str]] = defaultdict(list)
        for node in view.snapshot.nodes:
            if label in node.labels:
                groups[node.labels[label]].append(node.node_id)
        free = {name: sum(gang_room(view, n, job) for n in nodes) for name, nodes in groups.items()}
        enough = sorted((f, name) for name, f in free.items() if f >= job.request.gpus)
        for _, name in enough:
            gang = spread(view, job, groups[name])
            if gang is not None:
                return gang
    gang = spread(view, job, view.capacity)
    if gang is not None:
        return gang
    return no_fit(view, job, Counter({"together with too few free GPUs": len(view.capacity)}))
