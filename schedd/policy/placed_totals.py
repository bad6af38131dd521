"""What the placed jobs of a snapshot hold, per node and per (queue, user), and which jobs
each tenant queue has, kept between plans.

Every plan starts from each node's free capacity and each queue's and user's holdings.
Counting them walks every shard of every placed job: on a busy simulated cluster that was
most of the time of a plan. A shell that keeps its `PlacedJob` objects from one snapshot
to the next (the simulator does) changes only a few of them between plans, so the totals
of the last snapshot are kept and brought up to date by the jobs that came and went,
recounting only the nodes and (queue, user) pairs they touch. A snapshot of all-new
objects (the live scheduler reads them from the store each cycle) is counted afresh.

The result is the same as a full recount (tests/unit/test_placed_totals.py replays random
sequences against one). Keeping it is a memo, not state a decision depends on: no I/O,
and a plan returns what it would without it. Not thread-safe: plan() runs on one thread.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from operator import is_

from schedd.policy.kept import forgettable
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import (
    MIGRATING,
    OPPORTUNISTIC,
    PACKED,
    FreeCapacity,
    Node,
    PlacedJob,
    Request,
    Snapshot,
    held_parts,
    holds_gpus,
    usable,
)

UserKey = tuple[str, str]  # (leaf queue, user)


@dataclass(slots=True)
class _Part:
    """One shard of a placed job: what it holds on its node."""

    gpu_uuids: tuple[str, ...]
    request: Request  # the shard's share of the job's CPUs and memory
    job_gpus: int  # the whole job's GPU count, for affinity by size
    owns_gpus: bool  # false for an opportunistic, suspended or packed job
    shares_gpus: bool  # opportunistic or packed: it takes each GPU's one sharing place


@dataclass(slots=True)
class PlacedTotals:
    nodes: tuple[Node, ...] = ()
    node_by_id: dict[str, Node] = field(default_factory=dict)
    # Held so that the ids below stay unique: an id is only reused once its object is gone.
    placed: tuple[PlacedJob, ...] = ()
    members: dict[int, PlacedJob] = field(default_factory=dict)  # id(job) -> job
    on_node: dict[str, dict[int, _Part]] = field(default_factory=dict)
    # Shared with every View built on these totals, never changed in place: a View
    # copies a node's entry before its plan changes it (`View.writable`).
    free: dict[str, FreeCapacity] = field(default_factory=dict)
    sizes: dict[str, dict[int, int]] = field(default_factory=dict)  # node -> job GPUs -> jobs
    # node -> GPUs an opportunistic or packed job shares (shared like `free`, never changed
    # in place)
    shared: dict[str, frozenset[str]] = field(default_factory=dict)
    by_user: dict[UserKey, dict[int, Request]] = field(default_factory=dict)  # stoppable only
    held: dict[UserKey, Resources] = field(default_factory=dict)
    leaving: dict[int, str] = field(default_factory=dict)  # id(job) -> job id, not stoppable
    unstoppable: int = 0  # jobs that hold GPUs and are not stoppable (leaving or moving)
    # Each tenant queue's placed jobs: those kept from the last snapshot in its order,
    # then those new in this one's. A list is replaced, never changed in place, and a
    # queue whose jobs stayed the same keeps its list object (what `make_room.gittins`
    # keeps per queue survives changes in other queues).
    by_queue: dict[str, list[PlacedJob]] = field(default_factory=dict)
    total: Resources = NOTHING

    # ---- what a View takes: new dicts of shared entries, copied on write --------------

    def free_capacity(self) -> dict[str, FreeCapacity]:
        return dict(self.free)

    def gpu_sizes(self) -> dict[str, dict[int, int]]:
        return dict(self.sizes)

    def shared_gpus(self) -> dict[str, frozenset[str]]:
        return dict(self.shared)

    def leaving_ids(self) -> set[str]:
        return set(self.leaving.values())

    # ---- keeping it up to date ------------------------------------------------------

    def update(self, nodes: tuple[Node, ...], placed: tuple[PlacedJob, ...]) -> None:
        if placed is self.placed and nodes is self.nodes:
            return
        current = dict(zip(map(id, placed), placed, strict=True))
        before = self.by_queue
        if nodes is not self.nodes:
            self._reset(nodes)
            gone: Collection[int] = ()
        else:
            gone = self.members.keys() - current.keys()
            if 2 * (len(gone) + len(current) - (len(self.members) - len(gone))) > len(current):
                self._reset(nodes)  # mostly new objects: a fresh count is cheaper
                gone = ()
        touched_nodes: set[str] = set()
        touched_users: set[UserKey] = set()
        joining: dict[str, list[PlacedJob]] = {self.members[i].queue: [] for i in gone}
        for i in gone:
            self._drop(i, touched_nodes, touched_users)
        new = len(current) - len(self.members)  # the members left: those staying
        if new:
            # In the order of the snapshot, as a fresh count takes them (each node's parts
            # are summed in that order); new objects come last, mostly.
            added = []
            for i, job in reversed(current.items()):
                if i not in self.members:
                    added.append((i, job))
                    if len(added) == new:
                        break
            for i, job in reversed(added):
                self._add(i, job, touched_nodes, touched_users)
                joining.setdefault(job.queue, []).append(job)
        if joining:
            by_queue = dict(self.by_queue)
            for queue, coming in joining.items():
                staying = [j for j in by_queue.get(queue, ()) if id(j) not in gone]
                if staying or coming:
                    by_queue[queue] = staying + coming
                else:
                    del by_queue[queue]
            if before is not self.by_queue:  # counted afresh: lists that did not change stay
                for queue, jobs in by_queue.items():
                    old = before.get(queue)
                    if old is not None and len(old) == len(jobs) and all(map(is_, old, jobs)):
                        by_queue[queue] = old
            self.by_queue = by_queue
        self.members = current
        self.placed = placed
        for node_id in touched_nodes:
            self._recount_node(node_id)
        for key in touched_users:
            self._recount_user(key)

    def _reset(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self.node_by_id = {n.node_id: n for n in nodes}
        self.members = {}
        self.on_node = {}
        self.sizes = {}
        self.shared = {}
        self.by_user = {}
        self.held = {}
        self.leaving = {}
        self.unstoppable = 0
        self.by_queue = {}
        self.free = {n.node_id: FreeCapacity(n, usable(n), n.cpus, n.memory_mib) for n in nodes}
        self.total = Resources(
            sum(len(n.gpus) for n in nodes),
            sum(n.cpus for n in nodes),
            sum(n.memory_mib for n in nodes),
            sum(g.memory_mib for n in nodes for g in n.gpus),
        )

    def _add(self, i: int, job: PlacedJob, nodes: set[str], users: set[UserKey]) -> None:
        self.members[i] = job
        for shard, part in held_parts(job):
            on = self.on_node.setdefault(shard.node_id, {})
            owns = holds_gpus(job)
            shares = job.kind == OPPORTUNISTIC or job.state == PACKED  # no third job there
            uuids, before = shard.gpu_uuids, on.get(i)
            if before is not None:  # a move within the node: one part for both
                uuids = before.gpu_uuids + uuids
                part = Request(
                    before.request.gpus + part.gpus,
                    before.request.cpus + part.cpus,
                    before.request.memory_mib + part.memory_mib,
                )
            on[i] = _Part(uuids, part, job.request.gpus, owns, shares)
            nodes.add(shard.node_id)
        if not holds_gpus(job):
            return  # no share of its queue's, and nothing a guaranteed job waits for
        if not job.stoppable:
            self.unstoppable += 1
        if job.stoppable or job.state == MIGRATING:  # a move goes on running after it
            key = (job.queue, job.user)
            self.by_user.setdefault(key, {})[i] = charged(job)
            users.add(key)
        else:
            # Already being stopped: its GPUs are still taken, but it no longer counts
            # for its queue, or reclaim would take more from a queue already giving back.
            self.leaving[i] = job.job_id

    def _drop(self, i: int, nodes: set[str], users: set[UserKey]) -> None:
        job = self.members.pop(i)
        for shard in (*job.shards, *job.moving_to):
            self.on_node[shard.node_id].pop(i, None)
            nodes.add(shard.node_id)
        key = (job.queue, job.user)
        if not holds_gpus(job):
            return
        if not job.stoppable:
            self.unstoppable -= 1
        if self.leaving.pop(i, None) is None:
            del self.by_user[key][i]
            users.add(key)

    def _recount_node(self, node_id: str) -> None:
        parts = self.on_node.get(node_id, {})
        sizes: dict[int, int] = {}
        for part in parts.values():
            if part.owns_gpus:
                sizes[part.job_gpus] = sizes.get(part.job_gpus, 0) + 1
        if sizes:
            self.sizes[node_id] = sizes
        else:
            self.sizes.pop(node_id, None)
        if not parts:
            self.on_node.pop(node_id, None)
        node = self.node_by_id.get(node_id)
        if node is None:
            return  # a job on a node that is away: it holds nothing the plan could use
        used: set[str] = set()
        shared: set[str] = set()
        cpus, memory_mib = 0.0, 0
        for part in parts.values():
            if part.owns_gpus:
                used.update(part.gpu_uuids)
            elif part.shares_gpus:
                shared.update(part.gpu_uuids)
            cpus += part.request.cpus
            memory_mib += part.request.memory_mib
        free = [g for g in usable(node) if g.uuid not in used]
        if shared:
            self.shared[node_id] = frozenset(shared)
        else:
            self.shared.pop(node_id, None)
        self.free[node_id] = FreeCapacity(
            node, free, node.cpus - cpus, node.memory_mib - memory_mib
        )

    def _recount_user(self, key: UserKey) -> None:
        requests = self.by_user.get(key, {})
        if not requests:
            self.by_user.pop(key, None)
            self.held.pop(key, None)
            return
        gpus, cpus, memory_mib, gpu_memory_mib = 0, 0.0, 0, 0
        for r in requests.values():
            gpus += r.gpus
            cpus += r.cpus
            memory_mib += r.memory_mib
            if r.gpu_memory_mib is not None:
                gpu_memory_mib += r.gpus * r.gpu_memory_mib
        self.held[key] = Resources(gpus, cpus, memory_mib, gpu_memory_mib)


def charged(job: PlacedJob) -> Request:
    """What the job's queue and user hold for it: its request, or, while it saves a
    checkpoint to grow, the count it resumes with (the GPUs held for it there; the GPU
    memory it asks on each of them), as admission counted the grow."""
    if job.state != MIGRATING:
        return job.request
    target = sum(len(s.gpu_uuids) for s in job.moving_to)
    if target <= job.request.gpus:
        return job.request  # a move, or a shrink: it holds what it held
    return replace(job.request, gpus=target)


_kept = PlacedTotals()
forgettable(lambda: _kept.update((), ()))  # counted afresh from nothing at the next plan


def placed_totals(snapshot: Snapshot) -> PlacedTotals:
    """The totals for this snapshot; the returned object changes at the next call. For
    the planning thread alone: the totals are kept from one plan to the next."""
    _kept.update(snapshot.nodes, snapshot.placed)
    return _kept


def counted_afresh(snapshot: Snapshot) -> PlacedTotals:
    """The totals for this snapshot, counted apart from the plans' (`placed_totals`):
    for a reader on another thread than the plan's (the queue report, while a large plan
    runs in a worker thread), which must not change them under it."""
    totals = PlacedTotals()
    totals.update(snapshot.nodes, snapshot.placed)
    return totals
