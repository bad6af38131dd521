"""Liquid's network-aware best fit, with a burst of arrivals packed together.

A gang is scored as communication cost plus load: the cost of its spread (each node
beyond the first, each rack beyond the first, each domain beyond the first, from the
`rack` and `domain` labels, weighted by `network_cost_*`) plus the share of the GPUs
of the nodes it touches left idle (best fit). Candidates are the fewest-node spread
inside each rack, inside each domain, and over the whole cluster; the cheapest wins.

A job that fits on one node costs nothing to communicate and goes by best fit, except
in a burst: when at least `batch_min_jobs` jobs arrived within `batch_window_s`, the
grouping GA (`grouping_ga`) seats them together, seeded with first fit, and each of them
goes where it seated it while that node still takes it (the plan may have filled it
with jobs ordered before), else by best fit.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

from schedd.policy.place.grouping_ga import Bin, Budget, pack
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
        return _gang(job, view)
    seated = _burst(view).get(job.job_id)
    if seated is not None:
        fit = fit_on(view, seated, job)
        if not isinstance(fit, str):
            return Placement((Shard(seated, fit),))
    return _best_fit_by_level(job, view)


def _racks(view: View) -> dict[str, tuple[str, str]]:
    """Each node's (domain, rack), from its labels: once per plan."""
    key = ("liquid_racks",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = {
            node_id: (cap.node.labels.get("domain", ""), cap.node.labels.get("rack", ""))
            for node_id, cap in view.capacity.items()
        }
    return known  # type: ignore[return-value]


def _rack_of(node_id: str, view: View) -> tuple[str, str]:
    return _racks(view)[node_id]


def _free_by_rack(view: View) -> dict[tuple[str, str], int]:
    # Counted at each call, not kept: a victim search changes capacity for a moment
    # without a new generation, and a count kept from then would outlive it.
    racks = _racks(view)
    free: dict[tuple[str, str], int] = defaultdict(int)
    for node_id, cap in view.capacity.items():
        free[racks[node_id]] += len(cap.free_gpus)
    return free


def _best_fit_by_level(job: PendingJob, view: View) -> Placement | NoFit:
    """Best fit at each level: the fullest rack with a node that takes the job, and in
    it the fullest such node; racks left whole are where the next gang fits in one.
    The candidates are tried in that order, the first that takes the job winning: the
    order costs a count per node, a fit check far more."""
    by_rack = _free_by_rack(view)
    racks, capacity = _racks(view), view.capacity
    order = [
        (by_rack[racks[node_id]], len(capacity[node_id].free_gpus), node_id)
        for node_id in candidates(view, job.request.gpus)
    ]
    heapq.heapify(order)
    filtered: Counter[str] = Counter()
    while order:
        node_id = heapq.heappop(order)[2]
        fit = fit_on(view, node_id, job)
        if not isinstance(fit, str):
            return Placement((Shard(node_id, fit),))
        filtered[fit] += 1
    return no_fit(view, job, filtered)


def spread_cost(shards: tuple[Shard, ...], view: View) -> float:
    """What a job's spread costs to communicate: 0 on one node."""
    s = view.settings
    racks = {_rack_of(shard.node_id, view) for shard in shards}
    domains = {domain for domain, _ in racks}
    return (
        s.network_cost_node * (len(shards) - 1)
        + s.network_cost_rack * (len(racks) - 1)
        + s.network_cost_domain * (len(domains) - 1)
    )


def _idle_share(shards: tuple[Shard, ...], view: View) -> float:
    """The share of the touched nodes' GPUs still free after the job: best fit's load."""
    size = sum(len(view.capacity[s.node_id].node.gpus) for s in shards)
    left = sum(len(view.capacity[s.node_id].free_gpus) - len(s.gpu_uuids) for s in shards)
    return left / size if size else 0.0


def _gang(job: PendingJob, view: View) -> Placement | NoFit:
    # Racks named within their domain, as `spread_cost` counts them.
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for node in view.snapshot.nodes:
        domain = node.labels.get("domain", "")
        if "rack" in node.labels:
            groups[("rack", domain, node.labels["rack"])].append(node.node_id)
        if "domain" in node.labels:
            groups[("domain", domain)].append(node.node_id)
    candidates = [spread(view, job, ids) for ids in groups.values()]
    candidates.append(spread(view, job, view.capacity))
    scored = [
        (spread_cost(c.shards, view) + _idle_share(c.shards, view), c.shards, c)
        for c in candidates
        if c is not None
    ]
    if not scored:
        return no_fit(view, job, Counter({"together with too few free GPUs": len(view.capacity)}))
    return min(scored, key=lambda t: (t[0], [s.node_id for s in t[1]]))[2]


def _burst(view: View) -> dict[str, str]:
    """Job id -> node for the burst of arrivals, packed once per cycle."""
    key = ("liquid_burst",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = _pack_burst(view)
    return known  # type: ignore[return-value]


def _pack_burst(view: View) -> dict[str, str]:
    s = view.settings
    since = view.now - s.batch_window_s
    burst = [
        j
        for j in view.snapshot.pending
        if j.submitted_at >= since
        and j.request.gpus > 0
        and j.request.node_id is None
        and not needs_spreading(j, view)
    ][: s.batch_max_jobs]
    if not burst or len(burst) < s.batch_min_jobs:
        return {}
    smallest = min(j.request.gpus for j in burst)
    bins = [
        Bin(node.node_id, len(node.gpus), free)
        for node in view.snapshot.nodes
        if (free := len(view.capacity[node.node_id].free_gpus)) >= smallest
    ]
    if not bins:
        return {}
    # The GA needs only room for the burst: the fullest nodes (of the fullest racks, as
    # one job alone would be placed), as many as the burst's
    # GPUs could fill twice over (the rest of a big idle cluster offers no better
    # choice), and never more than four per job, which bounds its work.
    by_rack = _free_by_rack(view)
    bins.sort(key=lambda b: (by_rack[_rack_of(b.node_id, view)], b.free, b.node_id))
    demand, room, kept = sum(j.request.gpus for j in burst), 0, []
    for b in bins[: 4 * len(burst)]:
        if room >= 2 * demand:
            break
        kept.append(b)
        room += b.free
    items = [(j.job_id, j.request.gpus) for j in burst]
    budget = Budget(s.batch_generations, s.batch_population)
    return pack(items, kept, seed=int(view.now) ^ len(items), budget=budget)
