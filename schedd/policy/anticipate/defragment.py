"""Migration to defragment (Gandiva): a job that waits for GPUs on one node, although
the cluster has that many free, gets them by moving running jobs off the node closest
to having them, if what it gains is worth what the moves cost.

After the cycle's decisions, for the first `migrate_jobs` jobs waiting for capacity: the
nodes that could run the job are tried, those with the most free GPUs first (at most
16: `migration.short_nodes`); on each, the running jobs that may move
(`migration.movable`) go: the smallest one large enough that has somewhere to go, else
the largest first until the GPUs missing there are covered, each to the node it fits
best elsewhere. The cheapest such set wins if the
job's GPUs x its expected wait (until enough GPUs free up by the running jobs'
estimates; `default_estimate_s` if none can be foreseen) exceed the moved GPUs x
`migrate_cost_s`. The movers hold their new GPUs from now; the waiting job starts when
they have left. While jobs wait, a running job too young to move is looked at again
when it comes of age (`recheck_at`).
"""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan
from schedd.policy.placement import has_room
from schedd.policy.snapshot import PendingJob, PlacedJob, Shard
from schedd.policy.view import View

Moves = list[tuple[PlacedJob, tuple[Shard, ...]]]


def anticipate(view: View, plan: Plan) -> list[Action]:
    actions: list[Action] = []
    promised = migration.promised(view)
    for job in migration.waiting_for_room(view, plan):
        need = job.request.gpus
        if view.free_gpu_count() < need:
            continue  # no amount of moving gives it that many
        found = _cheapest(job, view, promised)
        if found is None:
            continue
        node_id, moves = found
        moved = sum(m.request.gpus for m, _ in moves)
        cost = moved * view.settings.migrate_cost_s
        wait = migration.expected_wait(job, view)
        if need * wait <= cost:
            continue
        reason = (
            f"to free {need} GPU(s) on node {node_id} for job {job.job_id}, which would"
            f" wait about {wait / 60:.0f} min otherwise"
        )
        actions += [migration.move(m, shards, view, reason) for m, shards in moves]
        promised.add(node_id)
    return actions


def _cheapest(job: PendingJob, view: View, promised: set[str]) -> tuple[str, Moves] | None:
    """(node, moves): the fewest GPUs moved to make the job fit on one node (not one
    already promised to another job)."""
    best: tuple[int, str, Moves] | None = None
    for node_id, missing in migration.short_nodes(job, view, promised):
        cap = view.capacity[node_id]
        moves = _moves_off(node_id, missing, view, promised)
        if moves is None:
            continue
        gone = [m.request for m, _ in moves]
        cpus = cap.cpus + sum(r.cpus for r in gone)
        memory = cap.memory_mib + sum(r.memory_mib for r in gone)
        if not has_room(cpus, memory, job.request):
            continue
        moved = sum(r.gpus for r in gone)
        if best is None or (moved, node_id) < best[:2]:
            best = (moved, node_id, moves)
    return None if best is None else (best[1], best[2])


def _moves_off(node_id: str, missing: int, view: View, promised: set[str]) -> Moves | None:
    """Movers off the node that free at least `missing` GPUs, each with its target (not
    on a node being freed): one job if one large enough can go somewhere (the smallest
    such), else the largest first."""
    here = [
        m
        for m in migration.placed_on(view).get(node_id, [])
        if len(m.shards) == 1 and migration.movable(m, view)
    ]
    avoid = frozenset({node_id, *promised})
    for single in sorted((m for m in here if m.request.gpus >= missing), key=_size_then_id):
        shards = migration.target(single, view, avoid)
        if shards is not None:
            return [(single, shards)]
    taken = migration.Taken()
    moves: Moves = []
    freed = 0
    for mover in sorted(here, key=_size_then_id, reverse=True):
        shards = migration.target(mover, view, avoid, taken)
        if shards is None:
            continue
        migration.take(taken, mover, shards)
        moves.append((mover, shards))
        freed += mover.request.gpus
        if freed >= missing:
            return moves
    return None


def _size_then_id(job: PlacedJob) -> tuple[int, str]:
    return (job.request.gpus, job.job_id)


def recheck_at(view: View, plan: Plan) -> float | None:
    """While a job waits for capacity with as many GPUs free as it needs: when a job on
    one node that was too young to move comes of age."""
    free = view.free_gpu_count()
    if not any(j.request.gpus <= free for j in migration.waiting_for_room(view, plan)):
        return None
    return migration.comes_of_age(view, lambda j: len(j.shards) == 1)
