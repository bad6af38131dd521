"""Properties of every profile over random clusters and queues (hypothesis).

Plans never give a GPU twice or over-fill a node, gangs start whole, preemption never
takes a queue below its guarantee; over time a reserved gang runs and shares follow
weights. The last two drive a tiny replay loop: plan, start what the plan launched,
stop its victims, jump to the next end.
"""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedd import policy
from schedd.policy import framework
from schedd.policy.actions import Launch, Plan, Preempt
from schedd.policy.gittins import ServiceHistory
from schedd.policy.profiles import BUILTIN, ProfileSpec, stages
from schedd.policy.queues import QueueSpec, lineage
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    MIGRATING,
    PACKED,
    SUSPENDED,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    holds_gpus,
)
from schedd.sim.usage import UsageBook
from tests.unit.policy_harness import (
    assert_valid,
    converted,
    draw_free_gpus,
    node,
    pending,
    placed,
)

QUEUE_NAMES = ["a", "b", "org/x", "org/y"]
CPUS = [0.0, 0.0, 4.0]  # guaranteed CPUs (0: none)


@st.composite
def clusters(draw: st.DrawFn, most_waiting: int = 15, mixed_one_in: int = 4) -> Snapshot:
    # Where CPUs are scarce, each running job holds 2 per GPU (and its suspended or
    # packed copy as much again) and a waiting one asks for 1 to 8 per GPU: CPUs, not
    # GPUs alone, decide where jobs fit and what a job that preempts must hold.
    scarce = draw(st.booleans())
    sizes = [draw(st.integers(1, 8)) for _ in range(draw(st.integers(1, 5)))]
    nodes = [
        node(
            f"n{i}",
            g,
            cpus=6 * g + 2 if scarce else 64,
            gpu_memory_mib=draw(st.sampled_from([81_920, 16_384])),
            rack=f"r{i % 2}",
        )
        for i, g in enumerate(sizes)
    ]
    # Some nodes mix GPU sizes (the lower half small): a job asking for 40,000 MiB may
    # use only part of such a node, to launch, grow or move onto. Running jobs take a
    # mixed node's large GPUs first, so that what is left free there, lowest index
    # first, is small: a grow or a move that took free GPUs without asking their size
    # would take small ones.
    mixed = [draw(st.integers(1, mixed_one_in)) == 1 for _ in nodes]
    nodes = [
        dataclasses.replace(
            n,
            gpus=tuple(
                dataclasses.replace(g, memory_mib=16_384) if 2 * g.index < len(n.gpus) else g
                for g in n.gpus
            ),
        )
        if mix
        else n
        for n, mix in zip(nodes, mixed, strict=True)
    ]
    queues = tuple(
        QueueSpec(
            q,
            # Some guarantee CPUs too: reclaim keeps every queue at them as well.
            guarantee=Resources(gpus=draw(st.integers(0, 6)), cpus=draw(st.sampled_from(CPUS))),
            max=draw(st.none() | st.builds(Resources, gpus=st.integers(4, 20))),
            weight=draw(st.sampled_from([1.0, 2.0])),
            user_limit_factor=draw(st.none() | st.just(1.5)),
        )
        for q in QUEUE_NAMES
    )
    # The parent of org/x and org/y, guaranteed at least what they are together (as the
    # config requires), and maybe more of its own.
    teams = sum(q.guarantee.gpus for q in queues if q.name.startswith("org/"))
    queues += (QueueSpec("org", guarantee=Resources(gpus=teams + draw(st.integers(0, 6)))),)
    free = [sorted(range(len(n.gpus)), key=lambda i, n=n: -n.gpus[i].memory_mib) for n in nodes]
    running = []
    for j in range(draw(st.integers(0, 10))):
        if (drawn := draw_free_gpus(draw, free)) is None:
            continue
        k, take = drawn
        running.append(
            placed(
                f"r{j}",
                nodes[k],
                take,
                2 * len(take) if scarce else 1,
                # A job on big GPUs may ask for their memory: it can move or grow only
                # onto GPUs as big.
                gpu_memory_mib=draw(st.sampled_from([None, 40_000]))
                if all(nodes[k].gpus[i].memory_mib >= 40_000 for i in take)
                else None,
                queue=draw(st.sampled_from(QUEUE_NAMES)),
                user=draw(st.sampled_from(["u1", "u2"])),
                started_at=draw(st.sampled_from([0.0, 9_000.0])),
                attained_s=draw(st.sampled_from([0.0, 100_000.0])),
                estimate_s=draw(st.none() | st.just(2_000.0)),
                state=draw(st.sampled_from(["running", "running", "assigned", "preempting"])),
            )
        )
    # Time-sliced jobs (Gandiva): paused beside a running job on its GPUs, or alone on
    # GPUs their partner left.
    for job in list(running):
        if job.state == "running" and draw(st.integers(0, 3)) == 0:
            since = draw(st.sampled_from([0.0, 9_500.0]))
            running.append(
                dataclasses.replace(
                    job, job_id=f"{job.job_id}s", state=SUSPENDED, state_since=since
                )
            )
    for k, n in enumerate(nodes):
        if free[k] and draw(st.integers(0, 3)) == 0:
            running.append(placed(f"alone{k}", n, free[k][:1], state=SUSPENDED))
            free[k] = free[k][1:]
    # Packed (Gandiva's packing): running beside the job that holds its GPUs, each with
    # a utilisation and a progress rate.
    for i, job in enumerate(list(running)):
        if job.state == "running" and draw(st.integers(0, 4)) == 0:
            util = draw(st.sampled_from([None, 20, 60]))
            rate = draw(st.sampled_from([None, 0.3, 0.9]))
            running[i] = dataclasses.replace(job, utilization_pct=util, progress_ratio=rate)
            running.append(
                dataclasses.replace(
                    job, job_id=f"{job.job_id}p", state=PACKED, utilization_pct=util,
                    progress_ratio=rate, state_since=9_000.0,
                )
            )  # fmt: skip
    # Moving (Gandiva's migration): a running job that holds free GPUs of another node too.
    for i, job in enumerate(running):
        k = draw(st.integers(0, len(nodes) - 1))
        want = job.request.gpus
        if job.state == "running" and len(free[k]) >= want and draw(st.integers(0, 4)) == 0:
            target = Shard(nodes[k].node_id, tuple(nodes[k].gpus[g].uuid for g in free[k][:want]))
            free[k] = free[k][want:]
            running[i] = dataclasses.replace(job, state=MIGRATING, moving_to=(target,))
    waiting = [
        pending(
            f"p{j}",
            gpus := draw(st.integers(0, 12)),
            max(gpus, 1) * draw(st.integers(1, 8)) if scarce else 1,
            gpu_memory_mib=draw(st.sampled_from([None, None, 40_000])),
            at=float(j),
            queue=draw(st.sampled_from(QUEUE_NAMES)),
            user=draw(st.sampled_from(["u1", "u2", "u3"])),
            priority=draw(st.integers(0, 2)),
            estimate_s=draw(st.none() | st.sampled_from([60.0, 5_000.0])),
            attained_s=draw(st.sampled_from([0.0, 50_000.0])),
        )
        for j in range(draw(st.integers(0, most_waiting)))
    ]
    # Elastic jobs (Gandiva's grow/shrink), waiting and running, may use half to all.
    waiting = [
        dataclasses.replace(j, gpu_range=(max(1, j.request.gpus // 2), j.request.gpus))
        if j.request.gpus > 1 and draw(st.integers(0, 2)) == 0
        else j
        for j in waiting
    ]
    running = [
        dataclasses.replace(j, gpu_range=(1, j.request.gpus + draw(st.integers(0, 2))))
        if j.state == "running" and draw(st.integers(0, 2)) == 0
        else j
        for j in running
    ]
    return Snapshot(
        tuple(nodes), tuple(running), tuple(waiting), queues=queues, multi_node=draw(st.booleans())
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), name=st.sampled_from(sorted(policy.PROFILES)))
def test_every_plan_is_valid_and_gangs_are_whole(snap: Snapshot, name: str) -> None:
    plan = policy.profile(name).plan(snap, 10_000.0)
    assert_valid(snap, plan)  # no GPU twice, nodes within CPUs/memory, all GPUs of a gang


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snap=clusters(most_waiting=2, mixed_one_in=1),
    name=st.sampled_from(["gandiva", "default-gandiva"]),
)
def test_moves_grows_and_shrinks_keep_plans_valid(snap: Snapshot, name: str) -> None:
    """With few jobs waiting, Gandiva's moves, grows and shrinks come into play (jobs
    grow only when none waits): each onto GPUs free and large enough, nodes within
    their CPUs and memory. Every node mixes GPU sizes here."""
    plan = policy.profile(name).plan(snap, 10_000.0)
    assert_valid(snap, plan)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), now=st.sampled_from([100.0, 10_000.0]))
def test_time_slicing_never_gives_a_gpu_twice(snap: Snapshot, now: float) -> None:
    """Turns and oversubscription: after the plan's suspends and resumes, every GPU has
    one guaranteed job running at most; only running jobs are paused, only paused ones
    resumed."""
    spec = dataclasses.replace(BUILTIN["gandiva"], decide=("timeslice", "pack"))
    plan = policy.build("gandiva", spec).plan(snap, now)
    assert_valid(snap, plan)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), name=st.sampled_from(["drf", "capacity", "default", "backfill"]))
def test_reclaim_never_takes_a_queue_below_its_guarantee(snap: Snapshot, name: str) -> None:
    """At every level (a team, and the org above it), in GPUs and in CPUs where some
    are guaranteed."""
    plan = policy.profile(name).plan(snap, 10_000.0)
    victims = {a.job_id for a in plan.actions if isinstance(a, Preempt)}
    guarantees = {q.name: q.guarantee for q in snap.queues}
    before: dict[str, Resources] = {}
    after: dict[str, Resources] = {}

    def count(held: dict[str, Resources], queue: str, request: Request) -> None:
        for level in lineage(queue):
            held[level] = held.get(level, Resources()) + request.resources()

    for job in snap.placed:
        if not holds_gpus(job):
            continue
        count(before, job.queue, job.request)
        if job.job_id not in victims:
            count(after, job.queue, job.request)
    # A job preempted for a job of its own queue (the Gittins index, 2D-LAS) leaves its
    # GPUs to that queue: the plan has them change hands inside it.
    # One preempted for a job of a sibling team gives back to their org (a level both
    # count in) what the claimant will take there, up to what its victims free.
    queue_of = {j.job_id: j.queue for j in (*snap.placed, *snap.pending)}
    by_id = {j.job_id: j for j in snap.placed}
    for job_id, wait in plan.waiting.items():
        if wait.code == "preempting" and "to make room: " in wait.reason:
            names = wait.reason.split("to make room: ", 1)[1].split(", ")
            others = []
            for victim in names:
                if victim in victims and queue_of[victim] == queue_of[job_id]:
                    count(after, by_id[victim].queue, by_id[victim].request)
                elif victim in victims:
                    others.append(by_id[victim])
            claimant = next(j for j in snap.pending if j.job_id == job_id).request
            for level in lineage(queue_of[job_id]):
                freed = [v.request for v in others if level in lineage(v.queue)]
                if freed:
                    gpus = min(claimant.gpus, sum(r.gpus for r in freed))
                    cpus = min(claimant.cpus, sum(r.cpus for r in freed))
                    after[level] = after.get(level, Resources()) + Resources(gpus, cpus)
    # What the same plan starts for the queue counts too: it holds that after the plan.
    launched = {a.job_id for a in plan.actions if isinstance(a, Launch)}
    for pending_job in snap.pending:
        if pending_job.job_id in launched:
            count(after, pending_job.queue, pending_job.request)
    for job in snap.placed:
        if job.job_id in victims and "reclaims" in _reason(plan, job.job_id):
            for level in lineage(job.queue):
                g = guarantees.get(level, Resources())
                was, now = before.get(level, Resources()), after.get(level, Resources())
                assert now.gpus >= min(g.gpus, was.gpus), (job.job_id, level)
                assert now.cpus + 1e-9 >= min(g.cpus, was.cpus), (job.job_id, level, "cpus")


# Profiles that answer a waiting job's twins from its wait (`Stages.waits_alike`), and
# some whose order is not by the rank their make-room plugin finds victims by.
TWIN_PROFILES = [(n, s) for n, s in BUILTIN.items() if stages(s, n).waits_alike] + [
    (f"{o}+{'+'.join(m)}", ProfileSpec(o, "topology", ("quota", "user_limit"), m))
    for o in ("drf", "capacity", "fifo", "priority")
    for m in (("gittins",), ("las",), ("reclaim", "gittins"), ("reclaim", "las"))
]
HISTORIES = [None, ServiceHistory.of([600.0] * 180 + [500_000.0] * 20)]


SERVICE = [0.0, 700.0, 50_000.0, 600_000.0]


def _same(job: PendingJob) -> PendingJob:
    return job


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    """A full cluster and many waiting jobs alike: twins, some ranked above runners."""
    nodes = [node(f"n{i}", draw(st.integers(1, 4))) for i in range(draw(st.integers(1, 2)))]
    running = []
    for n in nodes:
        gpus = list(range(len(n.gpus)))
        while gpus:
            take = gpus[: draw(st.integers(1, len(gpus)))]
            gpus = gpus[len(take) :]
            running.append(
                placed(
                    f"r{len(running)}",
                    n,
                    take,
                    queue=draw(st.sampled_from(["a", "b"])),
                    started_at=0.0,
                    attained_s=draw(st.sampled_from(SERVICE)),
                )
            )
    waiting = [
        # Some made opportunistic while they waited: tried as guaranteed first, by users
        # alike or not (`_WaitsAlike.no_room`).
        (converted if draw(st.booleans()) else _same)(
            pending(
                f"p{j}",
                draw(st.integers(1, 2)),
                at=float(j),
                queue=draw(st.sampled_from(["a", "b"])),
                user=draw(st.sampled_from(["u1", "u2"])),
                attained_s=draw(st.sampled_from(SERVICE)),
            )
        )
        for j in range(draw(st.integers(2, 12)))
    ]
    queues = (
        QueueSpec(
            "a",
            guarantee=Resources(gpus=draw(st.integers(0, 4))),
            max=draw(st.none() | st.builds(Resources, gpus=st.integers(2, 6))),
        ),
    )
    history = draw(st.sampled_from(HISTORIES))
    return Snapshot(tuple(nodes), tuple(running), tuple(waiting), queues, service_history=history)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=crowded(), named=st.sampled_from(TWIN_PROFILES))
def test_twins_answered_from_an_earlier_wait_change_no_plan(
    snap: Snapshot, named: tuple[str, ProfileSpec]
) -> None:
    """A plan that answers a waiting job's twins (same queue, user, request and GPU
    range, a rank no better) from its wait is the plan that asks every stage."""
    staged = stages(named[1], named[0])
    assert staged.waits_alike is not None
    alike = framework.plan(staged, snap, 10_000.0)
    asked = framework.plan(dataclasses.replace(staged, waits_alike=None), snap, 10_000.0)
    assert alike.actions == asked.actions
    assert alike.waiting == asked.waiting
    assert alike.recheck_at == asked.recheck_at


def _reason(plan: Plan, job_id: str) -> str:
    return next(a.reason for a in plan.actions if isinstance(a, Preempt) and a.job_id == job_id)


# ---- over time --------------------------------------------------------------------


@dataclasses.dataclass
class Replay:
    """A pure replay loop: just enough of a simulator to watch a policy over time."""

    snap: Snapshot
    durations: dict[str, float]
    now: float = 0.0
    ends: dict[str, float] = dataclasses.field(default_factory=dict)
    started: dict[str, float] = dataclasses.field(default_factory=dict)
    gpu_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    user_gpu_seconds: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    # Decayed past use, fed to each snapshot as the simulator feeds it.
    usage: UsageBook = dataclasses.field(default_factory=UsageBook)

    def step(self, profile: policy.Profile) -> None:
        self.snap = dataclasses.replace(self.snap, usage=self.usage.at(self.now))
        plan = profile.plan(self.snap, self.now)
        assert_valid(self.snap, plan)
        waiting = {j.job_id: j for j in self.snap.pending}
        running = {j.job_id: j for j in self.snap.placed}
        for action in plan.actions:
            if isinstance(action, Launch):
                job = waiting.pop(action.job_id)
                self.started.setdefault(job.job_id, self.now)
                self.ends[job.job_id] = self.now + self.durations[job.job_id]
                running[job.job_id] = _start(job, action, self.now)
                self.usage.change(job.queue, job.user, job.request.gpus, self.now)
            elif isinstance(action, Preempt):
                gone = running.pop(action.job_id)
                del self.ends[gone.job_id]
                waiting[gone.job_id] = _requeue(gone)
                self.usage.change(gone.queue, gone.user, -gone.request.gpus, self.now)
        if not self.ends:
            return
        # Jump to the next end; account GPU-seconds per queue on the way.
        nxt = min(self.ends.values())
        for job in running.values():
            used = job.request.gpus * (nxt - self.now)
            self.gpu_seconds[job.queue] = self.gpu_seconds.get(job.queue, 0.0) + used
            by_user = (job.queue, job.user)
            self.user_gpu_seconds[by_user] = self.user_gpu_seconds.get(by_user, 0.0) + used
        self.now = nxt
        for job_id in [j for j, t in self.ends.items() if t <= nxt]:
            del self.ends[job_id]
            done = running.pop(job_id)
            self.usage.change(done.queue, done.user, -done.request.gpus, nxt)
        self.snap = dataclasses.replace(
            self.snap,
            placed=tuple(running.values()),
            pending=tuple(sorted(waiting.values(), key=lambda j: (j.submitted_at, j.job_id))),
        )


def _start(job: PendingJob, launch: Launch, now: float) -> PlacedJob:
    return PlacedJob(
        job.job_id,
        job.user,
        job.queue,
        launch.shards,
        job.request,
        "running",
        started_at=now,
        estimate_s=job.estimate_s,
        attained_s=job.attained_s,
    )


def _requeue(job: PlacedJob) -> PendingJob:
    return PendingJob(
        job.job_id, job.user, job.queue, 0, job.kind, job.request, 0.0, estimate_s=job.estimate_s
    )


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3), min_size=5, max_size=25),
    lengths=st.lists(st.sampled_from([100.0, 500.0, 2_000.0]), min_size=26, max_size=26),
)
def test_a_reserved_gang_eventually_runs(sizes: list[int], lengths: list[float]) -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    jobs = [pending("small-0", 2, at=0.0, estimate_s=lengths[0])]
    jobs.append(pending("gang", 8, at=1.0, estimate_s=1_000.0))
    jobs += [
        pending(f"small-{i}", g, at=2.0 + i, estimate_s=lengths[i]) for i, g in enumerate(sizes, 1)
    ]
    durations = {j.job_id: j.estimate_s or 0.0 for j in jobs}
    replay = Replay(Snapshot(tuple(nodes), (), tuple(jobs), multi_node=True), durations)
    # `backfill` holds GPUs only for jobs that waited a day; the mechanism, from the start.
    spec = BUILTIN["backfill"]
    profile = policy.build(
        "backfill", dataclasses.replace(spec, settings=Settings(reserve_after_s=0.0))
    )
    for _ in range(200):
        replay.step(profile)
        if "gang" in replay.started:
            break
    assert "gang" in replay.started
    # It waited for the first job at most, not for the stream behind it.
    assert replay.started["gang"] <= lengths[0]


@settings(max_examples=20, deadline=None)
@given(
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0]), min_size=2, max_size=3),
    gpus_per_node=st.integers(2, 8),
    users=st.integers(1, 3),
)
def test_shares_converge_to_the_weights(
    weights: list[float], gpus_per_node: int, users: int
) -> None:
    """Every queue, and every user of each, floods the cluster with 1-GPU jobs that all
    end together. GPUs are whole, so a share is its weight's up to rounding:
    - between queues, none held on average more than one GPU beyond what its weight
      entitles it to beside any other (what filling GPU by GPU, least share first,
      guarantees each plan, and so over time);
    - queues of one weight, and the users of a queue, take turns with the GPU the
      rounding leaves over (their past use breaks the tie): over the replay they held
      the same GPU-seconds, up to one job's."""
    nodes, rounds, length = [node("n1", gpus_per_node), node("n2", gpus_per_node)], 12, 100.0
    gpus = 2 * gpus_per_node
    names = [f"q{i}" for i in range(len(weights))]
    queues = tuple(QueueSpec(q, weight=w) for q, w in zip(names, weights, strict=True))
    jobs = [
        pending(f"{q}-u{u}-{i}", 1, at=float(i), queue=q, user=f"u{u}", estimate_s=length)
        for i in range(rounds * gpus)  # enough that none runs out: the cluster stays full
        for q in names
        for u in range(users)
    ]
    durations = {j.job_id: length for j in jobs}
    replay = Replay(Snapshot(tuple(nodes), (), tuple(jobs), queues=queues), durations)
    profile = policy.profile("drf")
    for _ in range(rounds):
        replay.step(profile)
    assert sum(replay.gpu_seconds.values()) == gpus * length * rounds
    held = {q: replay.gpu_seconds.get(q, 0.0) / (length * rounds) for q in names}  # GPUs
    weight = dict(zip(names, weights, strict=True))
    for q, r in itertools.permutations(names, 2):
        assert (held[q] - 1) / weight[q] <= held[r] / weight[r] + 1e-9, (q, r, held)
        if weight[q] == weight[r]:
            assert abs(held[q] - held[r]) * rounds <= 1 + 1e-9, (q, r, held)
    for q in names:
        by_user = [replay.user_gpu_seconds.get((q, f"u{u}"), 0.0) for u in range(users)]
        assert max(by_user) - min(by_user) <= length, (q, by_user)
