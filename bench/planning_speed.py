"""Planning speed: one full cycle of a profile on a large, busy, hand-built snapshot.

1,000 nodes x 8 GPUs in 50 racks, 10,000 pending jobs of mixed sizes across 20 queues
(each with a guarantee), with the cluster empty or half full. Prints, per profile, the
time of one `plan()` call (median of a few runs) and the placements per second it made.
Every pending job has waited past `opportunistic_after_s`, so a profile with AntMan's
kinds over time makes the waiting ones opportunistic in that plan; for those a second
row ("+ backlog opportunistic") times the plan of the cycle after, with the kinds
applied: the steady state of a backlog, each such job tried as guaranteed and then on
shareable GPUs. Pure CPU, no I/O: the figure is the policy's own cost, as the live
scheduler pays it (each run plans new objects, as it reads them from the store, with
the cyclic garbage collector paused as schedd pauses it: `schedd.collector`). The
young collection a plan leaves behind (of what it returns) is timed apart, right after.

    .venv/bin/python bench/planning_speed.py [--profiles default,fifo] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedd import policy
from schedd.collector import collector_paused
from schedd.policy.actions import Launch, Plan, Preempt, SetKind
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import (
    OPPORTUNISTIC,
    Gpu,
    Node,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    interned,
)

SIZES = [1] * 60 + [2] * 15 + [4] * 15 + [8] * 10  # GPUs per job, weighted as in real traces


def build(nodes: int, gpus: int, pending: int, queues: int, busy: float, seed: int) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(
        Node(
            f"n{i:04d}",
            tuple(Gpu(f"n{i:04d}-g{g}", g, "H100", 81920) for g in range(gpus)),
            cpus=128,
            memory_mib=1_000_000,
            labels={"rack": f"r{i // 20:02d}", "domain": f"d{i // 200}"},
        )
        for i in range(nodes)
    )
    names = [f"org{q % 4}/team{q}" for q in range(queues)]
    share = nodes * gpus // queues
    queue_specs = tuple(
        QueueSpec(n, guarantee=Resources(gpus=share), max=Resources(gpus=share * 3)) for n in names
    )
    placed = []
    for i, node in enumerate(node_list[: int(nodes * busy)]):
        q = names[i % queues]
        placed.append(
            PlacedJob(
                f"run-{i}",
                f"user{i % 7}",
                q,
                (Shard(node.node_id, tuple(g.uuid for g in node.gpus)),),
                interned(Request(gpus, 8, 64_000)),
                "running",
                started_at=0.0,
                attained_s=3600.0 * gpus,
            )
        )
    jobs = tuple(
        PendingJob(
            f"job-{j}",
            f"user{rng.randrange(50)}",
            names[rng.randrange(queues)],
            0,
            "guaranteed",
            interned(Request(size := rng.choice(SIZES), size * 4.0, size * 32_000)),
            submitted_at=float(j),
            estimate_s=rng.choice([600.0, 3600.0, 36_000.0]),
        )
        for j in range(pending)
    )
    return Snapshot(node_list, tuple(placed), jobs, queues=queue_specs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=",".join(policy.PROFILES))
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(
        f"planning speed: {args.nodes} nodes x {args.gpus} GPUs, {args.pending} pending jobs"
        f" in {args.queues} queues; python {sys.version.split()[0]}; median of {args.runs} runs"
    )
    print(
        f"{'profile':<10} {'cluster':<36} {'window':>6} {'cycle ms':>9} {'gc after':>9}"
        f" {'launches':>9} {'preempts':>9} {'placements/s':>13}"
    )
    for name in args.profiles.split(","):
        prof = policy.profile(name)
        for busy in (0.0, 0.5):
            snap = build(args.nodes, args.gpus, args.pending, args.queues, busy, seed=1)
            window = Snapshot(
                snap.nodes, snap.placed, snap.pending[: prof.pending_window], queues=snap.queues
            )
            plan = timed(prof, window, name, f"{busy:.0%} busy", args.runs)
            turned = {
                a.job_id for a in plan.actions if isinstance(a, SetKind) and a.kind == OPPORTUNISTIC
            }
            if turned:
                backlog = tuple(
                    dataclasses.replace(j, kind=OPPORTUNISTIC) if j.job_id in turned else j
                    for j in window.pending
                )
                window = Snapshot(window.nodes, window.placed, backlog, queues=window.queues)
                timed(prof, window, "", f"+ backlog opportunistic ({len(turned):,})", args.runs)


def timed(prof: policy.Profile, window: Snapshot, name: str, label: str, runs: int) -> Plan:
    """Plan the window `runs` times and print the median's row; the last plan."""
    times = []
    after = []
    plan = None
    for _ in range(runs):
        # New objects each run, as the live scheduler reads them from the store each
        # cycle: what the policy keeps between plans of the same objects (the
        # simulator's case) must not flatter a cycle here.
        fresh = Snapshot(
            tuple(dataclasses.replace(n) for n in window.nodes),
            tuple(dataclasses.replace(j) for j in window.placed),
            tuple(dataclasses.replace(j) for j in window.pending),
            queues=window.queues,
        )
        plan = None  # the last run's plan and its objects go before this one starts
        gc.collect()
        t0 = time.perf_counter()
        with collector_paused():
            plan = prof.plan(fresh, 100_000.0).with_recheck_found()  # as schedd's cycle
            t1 = time.perf_counter()
        gc.collect(0)  # where the collector back on has not started it already
        after.append(time.perf_counter() - t1)
        times.append(t1 - t0)
    assert plan is not None
    launches = sum(isinstance(a, Launch) for a in plan.actions)
    preempts = sum(isinstance(a, Preempt) for a in plan.actions)
    t = statistics.median(times)
    print(
        f"{name:<10} {label:<36} {len(window.pending):>6} {t * 1000:>9.1f}"
        f" {statistics.median(after) * 1000:>9.1f} {launches:>9} {preempts:>9}"
        f" {launches / t:>13,.0f}"
    )
    return plan


if __name__ == "__main__":
    main()
