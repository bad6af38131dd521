"""Where an opportunistic job goes (AntMan): GPUs that stayed little used, least used first.

A GPU qualifies when no other opportunistic job is on it, its guaranteed holder (if
any) has run `share_after_s` or is known to use little, and its utilisation stayed
below `share_below_pct`: the higher of what the GPU itself reported (the shell gives
the highest over its window) and what its guaranteed holder is known to use. A free
GPU qualifies the same way; GPUs reserved for a blocked gang do too, since the gang
would throttle the job, not wait for it. A node whose agent runs no coordinator takes
none (nothing would throttle it there). The job takes the node whose qualifying GPUs
are least used in sum, its whole request on that one node: a gang of opportunistic
jobs across nodes would run at the pace of its most throttled GPU. A job that needs
GPU memory (what its spec asks, else the resource estimator's prediction of its peak)
takes only GPUs with that much free.

Every profile places opportunistic jobs this way (the framework calls it for them):
the kind is the user's word that the job may be slowed, and the agent slows it.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator

from schedd.policy.placement import NoFit, Placement, enough_cpus
from schedd.policy.snapshot import Gpu, Node, PendingJob, PlacedJob, Shard, holds_gpus
from schedd.policy.view import View


def holders_use(view: View) -> dict[str, int]:
    """GPU uuid -> what its guaranteed holder is known to use (percent), once per cycle."""
    key = ("holders_use",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = {
            uuid: job.utilization_pct
            for job in view.snapshot.placed
            if job.utilization_pct is not None and holds_gpus(job)
            for uuid in job.gpu_uuids
        }
    return known  # type: ignore[return-value]


def _young_holders(view: View, known_too: bool = False) -> Iterator[tuple[PlacedJob, float]]:
    """Guaranteed jobs that started less than `share_after_s` ago (live, the GPU's window
    has not seen them run long) with no figure of their own use (`known_too`: with one
    or not), each with the time it comes of age."""
    after = view.settings.share_after_s
    for job in view.snapshot.placed:
        if holds_gpus(job) and (known_too or job.utilization_pct is None):
            of_age = view.started(job) + after
            if of_age > view.now:
                yield job, of_age


def gpu_memory_needed(job: PendingJob) -> int | None:
    """The GPU memory a job needs on each GPU it shares: what its spec asks, else what
    the resource estimator predicts of its peak, else nothing known."""
    asked = job.request.gpu_memory_mib
    return asked if asked is not None else job.predicted_gpu_memory_mib


def _unmeasured(view: View, memory: bool) -> set[str]:
    """GPUs whose guaranteed holder's use is not known yet: it starts in this very plan,
    or it is a young holder. For a job that asks for GPU memory (`memory`), every young
    holder's: a figure of its utilisation says nothing of the memory its window has
    not seen."""
    fresh = {u for shards, _, _ in view.launched for s in shards for u in s.gpu_uuids}
    fresh.update(u for job, _ in _young_holders(view, memory) for u in job.gpu_uuids)
    return fresh


def recheck_at(view: View) -> float | None:
    """When the next young holder's GPU comes of age for sharing (a busy sample ageing
    out of the GPU's window is the live scheduler's to watch)."""
    return min((of_age for _, of_age in _young_holders(view)), default=None)


def utilization(gpu: Gpu, view: View) -> int:
    return max(gpu.utilization_pct, holders_use(view).get(gpu.uuid, 0))


def place(job: PendingJob, view: View) -> Placement | NoFit:
    request = job.request
    if request.node_id is None and request.gpu_memory_mib is None:
        index = view.memo.get(("share_index",))
        if not isinstance(index, _ShareIndex):
            index = view.memo[("share_index",)] = _ShareIndex(view)
        found = index.best(job)
        if found is None:
            return index.no_fit(job)  # none with memory unchecked: none with it checked
        node_id, gpus = found
        predicted = job.predicted_gpu_memory_mib
        # The best node with memory unchecked is the best with it checked where its
        # GPUs have the memory: no other node scores lower. Else look at every node.
        if predicted is None or all(g.memory_mib - g.memory_used_mib >= predicted for g in gpus):
            return Placement((Shard(node_id, tuple(g.uuid for g in gpus)),))
    return _scan(job, view)  # pinned, asking for memory, or short of what it is predicted


class _ShareIndex:
    """One plan's shareable GPUs by node, so that a backlog of opportunistic jobs does
    not scan every node per job. A node's list (its GPUs a job asking for no GPU memory
    may take, least used first) is kept while its free GPUs and its sharers are the
    same objects: the view replaces both on a change, and fresh GPUs are GPUs the plan
    launched there (which changed the free ones) or young holders' (fixed for the
    plan). For each GPU count a heap orders the nodes by what their least-used GPUs
    sum to. Within a plan a node's list only loses GPUs, so a score in the heap is at
    most the node's score now: a stale top is scored again and put back, and the
    first top that is current and has the CPUs and memory is the node `_scan` would
    choose (ties by node id in both)."""

    __slots__ = ("heaps", "launched_on", "limit", "lists", "nodes", "seen", "view", "young")

    def __init__(self, view: View) -> None:
        self.view = view
        self.nodes = {n.node_id: n for n in view.snapshot.nodes}
        self.limit = view.settings.share_below_pct
        self.young = {u for job, _ in _young_holders(view) for u in job.gpu_uuids}
        self.launched_on: dict[str, set[str]] = {}
        self.seen = 0  # entries of view.launched counted into launched_on
        self.lists: dict[str, tuple[object, object, list[tuple[int, int, Gpu]]]] = {}
        self.heaps: dict[int, list[tuple[int, str]]] = {}

    def usable(self, node: Node) -> list[tuple[int, int, Gpu]]:
        view = self.view
        free = view.capacity[node.node_id].free_gpus
        sharers = view.shared.get(node.node_id)
        known = self.lists.get(node.node_id)
        if known is not None and known[0] is free and known[1] is sharers:
            return known[2]
        for shards, _, _ in view.launched[self.seen :]:
            for shard in shards:
                self.launched_on.setdefault(shard.node_id, set()).update(shard.gpu_uuids)
        self.seen = len(view.launched)
        taken = (sharers or frozenset()) | node.out
        fresh = self.launched_on.get(node.node_id, set())
        if known is not None:  # it only loses GPUs: those shared or launched on since
            usable = [e for e in known[2] if e[2].uuid not in taken and e[2].uuid not in fresh]
        else:
            usable = sorted(
                (use, g.index, g)
                for g in node.gpus
                if g.uuid not in taken
                and g.uuid not in fresh
                and g.uuid not in self.young
                and (use := utilization(g, view)) < self.limit
            )
        self.lists[node.node_id] = (free, sharers, usable)
        return usable

    def best(self, job: PendingJob) -> tuple[str, list[Gpu]] | None:
        request = job.request
        count = request.gpus
        heap = self.heaps.get(count)
        if heap is None:
            heap = self.heaps[count] = []
            for node in self.view.snapshot.nodes:
                usable = self.usable(node) if node.coordinated else []
                if len(usable) >= count:
                    heap.append((sum(use for use, _, _ in usable[:count]), node.node_id))
            heapq.heapify(heap)
        aside: list[tuple[int, str]] = []
        found = None
        while heap:
            score, node_id = heap[0]
            usable = self.usable(self.nodes[node_id])
            if len(usable) < count:
                heapq.heappop(heap)  # for good: its list only shrinks in this plan
                continue
            now = sum(use for use, _, _ in usable[:count])
            if now != score:
                heapq.heapreplace(heap, (now, node_id))
                continue
            cpus, memory = self.view.room(node_id, job)
            if not enough_cpus(cpus, request.cpus) or memory < request.memory_mib:
                aside.append(heapq.heappop(heap))  # another job may fit there
                continue
            found = node_id, sorted((g for _, _, g in usable[:count]), key=lambda g: g.index)
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def no_fit(self, job: PendingJob) -> NoFit:
        """Why no node takes the job: what `_scan` says, from the kept lists."""
        view, request = self.view, job.request
        few = _too_few(self.limit)
        filtered: dict[str, int] = {}  # by first failed check, in the order first met
        most = 0
        for node in view.snapshot.nodes:
            cpus, memory = view.room(node.node_id, job)
            if not node.coordinated:
                why = "without a coordinator to throttle it"
            elif not enough_cpus(cpus, request.cpus):
                why = "with too few free CPUs"
            elif memory < request.memory_mib:
                why = "with too little free memory"
            else:
                usable = len(self.usable(node))
                most = max(most, usable)
                if usable >= request.gpus:
                    continue
                why = few
            filtered[why] = filtered.get(why, 0) + 1
        return NoFit(filtered, most)


def _too_few(limit: float) -> str:
    return f"with too few GPUs used below {limit:g}% and not shared"


def _scan(job: PendingJob, view: View) -> Placement | NoFit:
    request = job.request
    limit = view.settings.share_below_pct
    few = _too_few(limit)
    filtered: Counter[str] = Counter()
    best: tuple[tuple[int, str], str, list[Gpu]] | None = None
    most = 0
    needed = gpu_memory_needed(job)
    # A prediction is no ask: a young holder's GPU stays open to the job (its free
    # memory is checked as it stands); a spec's figure is a requirement.
    fresh = _unmeasured(view, request.gpu_memory_mib is not None)
    for node in view.snapshot.nodes:
        node_id = node.node_id
        if request.node_id is not None and node_id != request.node_id:
            filtered[f"not node {request.node_id}, where the job is to run"] += 1
            continue
        if not node.coordinated:
            # Beside a guaranteed job it would run unthrottled; and a GPU it held alone
            # would be free for a guaranteed job, which would then share it so.
            filtered["without a coordinator to throttle it"] += 1
            continue
        cpus, memory = view.room(node_id, job)
        if not enough_cpus(cpus, request.cpus):
            filtered["with too few free CPUs"] += 1
            continue
        if memory < request.memory_mib:
            filtered["with too little free memory"] += 1
            continue
        taken = view.shared.get(node_id, frozenset()) | node.out
        usable = sorted(
            (use, g.index, g)
            for g in node.gpus
            if g.uuid not in taken
            and g.uuid not in fresh
            and (use := utilization(g, view)) < limit
            and (needed is None or g.memory_mib - g.memory_used_mib >= needed)
        )
        most = max(most, len(usable))
        if len(usable) < request.gpus:
            filtered[few] += 1
            continue
        chosen = usable[: request.gpus]
        score = (sum(use for use, _, _ in chosen), node_id)
        if best is None or score < best[0]:
            best = (score, node_id, [g for _, _, g in chosen])
    if best is None:
        return NoFit(dict(filtered), most)
    _, node_id, gpus = best
    return Placement((Shard(node_id, tuple(g.uuid for g in sorted(gpus, key=lambda g: g.index))),))
