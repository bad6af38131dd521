"""The live snapshot from real rows: decayed usage, run-time estimates, placed jobs, ticks."""

from __future__ import annotations

import asyncio
import math

import asyncpg
import msgspec
import pytest

from schedd.store import jobs, tokens
from shared import protocol as p
from shared.config import ProfileConfig, QueueConfig
from shared.model import JobKind, JobSpec, JobState
from tests.integration.fake_agent import FakeAgent
from tests.integration.inprocess import api_get, start_schedd, waits_with

HOUR = 3600.0


async def add_job(
    pool: asyncpg.Pool, user: str = "alice", name: str = "train", **spec: object
) -> str:
    fields: dict[str, object] = {"gpus": 3, **spec}  # 3 GPUs: never fits a 2-GPU node
    row, _ = await jobs.submit(pool, user, JobSpec(name=name, command=["true"], **fields), None)  # type: ignore[arg-type]
    return str(row["id"])


async def add_run(
    pool: asyncpg.Pool, queue: str, user: str, gpus: int, start_h: float, end_h: float
) -> None:
    """A finished run `start_h` to `end_h` hours ago."""
    job_id = await add_job(pool, user, queue=queue, gpus=gpus)
    await pool.execute(
        "INSERT INTO job_runs (job_id, attempt, queue, user_name, gpus, started_at, ended_at)"
        " VALUES ($1, 1, $2, $3, $4, now() - make_interval(secs => $5),"
        " now() - make_interval(secs => $6))",
        job_id,
        queue,
        user,
        gpus,
        start_h * HOUR,
        end_h * HOUR,
    )
    await pool.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", job_id)


def decayed(gpus: int, start_h: float, end_h: float, half_life_h: float = 1.0) -> float:
    h = half_life_h * HOUR
    return gpus * h / math.log(2) * (0.5 ** (end_h / half_life_h) - 0.5 ** (start_h / half_life_h))


async def test_decayed_usage_counts_every_run_in_the_horizon(pool: asyncpg.Pool) -> None:
    await add_run(pool, "org/team", "bob", 2, start_h=2, end_h=1)
    await add_run(pool, "org/team", "bob", 1, start_h=0.5, end_h=0.25)  # a second attempt
    await add_run(pool, "org/team", "alice", 8, start_h=12, end_h=11)  # 11 half-lives: left out
    await add_run(pool, "other", "bob", 4, start_h=3, end_h=2.5)
    running = await add_job(pool, "carol", queue="org", gpus=1)
    await pool.execute(
        "UPDATE jobs SET state = 'running', node_id = 'n9', started_at = now() - interval '30 min'"
        " WHERE id = $1",
        running,
    )
    async with start_schedd(pool, usage_half_life_s=HOUR) as schedd:
        usage = await schedd.scheduler.usage()
        # The run past the horizon is not only left out: schedd deletes it.
        async with asyncio.timeout(5):
            while await pool.fetchval("SELECT count(*) FROM job_runs") > 3:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    team_bob = decayed(2, 2, 1) + decayed(1, 0.5, 0.25)
    carol = decayed(1, 0.5, 0)
    expected_users = {
        ("org/team", "bob"): team_bob,
        ("org", "carol"): carol,
        ("other", "bob"): decayed(4, 3, 2.5),
    }
    assert usage.users.keys() == expected_users.keys()
    for key, value in expected_users.items():
        assert usage.users[key] == pytest.approx(value, rel=2e-3)
    # A queue counts its sub-queues: "org" holds carol's run and its team's.
    assert usage.queues["org"] == pytest.approx(team_bob + carol, rel=2e-3)
    assert usage.queues["org/team"] == pytest.approx(team_bob, rel=2e-3)
    assert set(usage.queues) == {"org", "org/team", "other"}
    left = await pool.fetch("SELECT user_name, queue FROM job_runs ORDER BY ended_at")
    assert [tuple(r) for r in left] == [("bob", "other"), ("bob", "org/team"), ("bob", "org/team")]


async def test_a_run_that_ends_is_recorded_with_its_gpu_time(pool: asyncpg.Pool) -> None:
    job_id = await add_job(pool, gpus=2, queue="q")
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.RUNNING, "started", attempt=1)
    await pool.execute(
        "UPDATE jobs SET started_at = now() - interval '100 seconds' WHERE id = $1", job_id
    )
    await jobs.transition(pool, job_id, JobState.PENDING, "lost", attempt=1)
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.RUNNING, "started", attempt=2)
    await pool.execute(
        "UPDATE jobs SET started_at = now() - interval '10 seconds' WHERE id = $1", job_id
    )
    await jobs.transition(pool, job_id, JobState.SUCCEEDED, "exit 0", attempt=2)
    row = await jobs.get(pool, job_id)
    assert row["attained_gpu_s"] == pytest.approx(2 * 110, abs=2)
    runs = await pool.fetch(
        "SELECT attempt, queue, user_name, gpus, extract(epoch FROM ended_at - started_at) AS s"
        " FROM job_runs WHERE job_id = $1 ORDER BY attempt",
        job_id,
    )
    assert [(r["attempt"], r["queue"], r["user_name"], r["gpus"]) for r in runs] == [
        (1, "q", "alice", 2),
        (2, "q", "alice", 2),
    ]
    assert [float(r["s"]) for r in runs] == [pytest.approx(100, abs=2), pytest.approx(10, abs=2)]


async def test_the_snapshot_carries_queues_estimates_and_placed_jobs(pool: asyncpg.Pool) -> None:
    # alice's 25 earlier "train" jobs ran 100 s to 124 s; the latest 20 ran 105 s to 124 s.
    for i in range(25):
        done = await add_job(pool, "alice", "train")
        await pool.execute(
            "UPDATE jobs SET state = 'succeeded',"
            " finished_at = now() - make_interval(secs => $2),"
            " started_at = now() - make_interval(secs => $2 + $3) WHERE id = $1",
            done,
            float(1000 - i),
            float(100 + i),
        )
    failed = await add_job(pool, "alice", "train")  # a failure says nothing of the run time
    await pool.execute(
        "UPDATE jobs SET state = 'failed', started_at = now() - interval '1 hour',"
        " finished_at = now() WHERE id = $1",
        failed,
    )
    by_history = await add_job(pool, "alice", "train")
    by_spec = await add_job(pool, "alice", "train", estimated_runtime_s=42.5)
    other_user = await add_job(pool, "bob", "train")
    other_name = await add_job(pool, "alice", "eval")
    placed = await add_job(
        pool, "carol", "serve", gpus=1, queue="a", priority=7, kind=JobKind.OPPORTUNISTIC
    )
    await jobs.transition(
        pool, placed, JobState.ASSIGNED, "placed", node_id="n1", gpu_uuids=["GPU-0"]
    )
    await jobs.transition(pool, placed, JobState.RUNNING, "started", attempt=1)
    await pool.execute(
        "UPDATE jobs SET attained_gpu_s = 50, started_at = now() - interval '20 seconds'"
        " WHERE id = $1",
        placed,
    )
    queues = {"a": QueueConfig(guarantee_gpus=1, max_gpus=2)}
    # The resource estimator off: run times from specs and history alone (its own test
    # is test_estimates.py).
    async with start_schedd(pool, queues=queues, estimator_retrain_s=0) as schedd:
        agent = await FakeAgent(schedd.server).connect(
            p.JobReport(job_id=placed, attempt=1, status="running"), hub=schedd.hub
        )
        snapshot = await schedd.scheduler.snapshot(100)
        window = await schedd.scheduler.snapshot(2)
        await agent.close()
    # Jobs larger than a node may be placed across nodes: the gangs run live.
    assert [q.name for q in snapshot.queues] == ["a"] and snapshot.multi_node
    estimates = {j.job_id: j.estimate_s for j in snapshot.pending}
    assert estimates[by_history] == pytest.approx(sum(range(105, 125)) / 20, abs=0.5)
    assert estimates[by_spec] == 42.5
    assert estimates[other_user] is None and estimates[other_name] is None
    (job,) = snapshot.placed
    assert (job.job_id, job.queue, job.user, job.state) == (placed, "a", "carol", "running")
    assert (job.priority, job.kind, job.request.gpus) == (7, "opportunistic", 1)
    assert job.started_at is not None
    assert job.attained_s == pytest.approx(50 + 20, abs=2)
    # The window: the oldest pending jobs only, in submission order.
    assert [j.job_id for j in window.pending] == [j.job_id for j in snapshot.pending][:2]


async def test_a_job_larger_than_the_cluster_waits_saying_so(pool: asyncpg.Pool) -> None:
    """Larger than any node, it would run across nodes (a gang); larger than all of
    them together, it waits for more to connect."""
    job_id = await add_job(pool, gpus=3)
    async with start_schedd(pool, policy="default") as schedd:
        agent = await FakeAgent(schedd.server).connect()
        async with asyncio.timeout(5):
            while schedd.scheduler.why_pending(job_id).code != "too_large":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert schedd.scheduler.why_pending(job_id).reason == ("asks for 3 GPUs; the cluster has 2")
        await agent.close()


async def test_a_profile_with_a_tick_plans_while_jobs_wait(pool: asyncpg.Pool) -> None:
    profiles = {"ticking": ProfileConfig(order="fifo", place="best_fit", tick_s=0.05)}
    await add_job(pool)  # pending for good: after the node's arrival, only ticks plan
    async with start_schedd(pool, policy="ticking", profiles=profiles) as schedd:
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        start = schedd.scheduler.cycles
        async with asyncio.timeout(5):
            while schedd.scheduler.cycles < start + 5:  # noqa: ASYNC110 - a counter
                await asyncio.sleep(0.01)
        await agent.close()


async def test_without_a_tick_only_events_plan(pool: asyncpg.Pool) -> None:
    async with start_schedd(pool, policy="fifo") as schedd:
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        job_id = await add_job(pool)
        schedd.scheduler.wake()
        # Wait until a cycle with the node has considered the job (it never fits: it
        # stays pending), and for the cycles the node's arrival and the wake asked for
        # (one or two: wakes that come while a cycle runs make one more) to be over.
        async with asyncio.timeout(30):
            while job_id not in schedd.scheduler.waiting:  # noqa: ASYNC110 - a dict
                await asyncio.sleep(0.01)
            seen = -1
            while schedd.scheduler.cycles != seen:
                seen = schedd.scheduler.cycles
                await asyncio.sleep(0.3)
        # Then nothing plans again: no event comes, and the profile has no tick.
        await asyncio.sleep(1.0)
        assert schedd.scheduler.cycles == seen
        await agent.close()


async def test_the_snapshot_carries_the_service_jobs_took(pool: asyncpg.Pool) -> None:
    """Ended jobs (any end) give their service; unfinished ones that ran, theirs so far
    (the attempt running now included), as censored observations."""
    for gpu_s, state in [(100.0, "succeeded")] * 30 + [(300.0, "failed")] * 10:
        done = await add_job(pool)
        await pool.execute(
            "UPDATE jobs SET state = $2, attained_gpu_s = $3, finished_at = now() WHERE id = $1",
            done,
            state,
            gpu_s,
        )
    never_ran = await add_job(pool)
    await pool.execute(
        "UPDATE jobs SET state = 'cancelled', finished_at = now() WHERE id = $1", never_ran
    )
    requeued = await add_job(pool)  # pending again after 200 GPU-seconds
    await pool.execute("UPDATE jobs SET attained_gpu_s = 200 WHERE id = $1", requeued)
    running = await add_job(pool, gpus=2)  # 2 GPUs for 100 s, after 50 GPU-seconds before
    await pool.execute(
        "UPDATE jobs SET state = 'running', node_id = 'n9', attained_gpu_s = 50,"
        " started_at = now() - interval '100 seconds' WHERE id = $1",
        running,
    )
    await add_job(pool)  # waiting, never ran: tells nothing
    rows = await jobs.service_taken(pool)
    ongoing = sorted(r["gpu_s"] for r in rows if not r["finished"])
    assert ongoing == [200.0, pytest.approx(250.0, abs=5.0)]
    assert sorted(r["gpu_s"] for r in rows if r["finished"]) == [0.0] + [100.0] * 30 + [300.0] * 10
    async with start_schedd(pool) as schedd:
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        history = (await schedd.scheduler.snapshot(100)).service_history
        await agent.close()
    # Kaplan-Meier: 30 of 42 at risk end at 100; the two unfinished ones leave before 300.
    assert history is not None and history.finished == 40
    assert history.values == (100.0, 300.0)
    assert history.masses == pytest.approx((30 / 42, 12 / 42))


async def test_time_suspended_is_not_service(pool: asyncpg.Pool) -> None:
    """A job that started 100 s ago and was suspended for the last 70 s of them (resumed,
    then suspended again, just now) has taken 30 s of its 2 GPUs: in the snapshot, in
    the service history, in its queue's decayed usage, and in its record and run time
    when it ends."""
    job_id = await add_job(pool, gpus=2, queue="q")
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.RUNNING, "started", attempt=1)
    await pool.execute(
        "UPDATE jobs SET started_at = now() - interval '100 s' WHERE id = $1", job_id
    )
    sliced = {"suspended": True, "free_memory": True, "time_sliced": True}
    assert await jobs.set_suspended(pool, job_id, 1, True, sliced, "suspend")
    await pool.execute(
        "UPDATE jobs SET suspended_at = now() - interval '70 s' WHERE id = $1", job_id
    )
    resumed = {"suspended": False, "free_memory": False, "time_sliced": False}
    assert not await jobs.set_suspended(pool, job_id, 1, False, resumed, "by a user")
    assert await jobs.set_suspended(pool, job_id, 1, False, resumed, "resume", sliced=True)
    row = await jobs.get(pool, job_id)
    assert row is not None and row["paused_s"] == pytest.approx(70, abs=1)
    assert row["suspended_at"] is None and row["resumed_at"] is not None
    assert await jobs.set_suspended(pool, job_id, 1, True, sliced, "suspend")
    row = await jobs.get(pool, job_id)
    assert row is not None
    # Changes that do not apply to it as it is now change nothing; a repeated suspend
    # keeps the suspension's start.
    assert not await jobs.set_suspended(pool, job_id, 1, True, sliced, "x", not_suspended=True)
    assert await jobs.set_suspended(pool, job_id, 1, True, sliced, "again", sliced=True)
    assert (await jobs.get(pool, job_id))["suspended_at"] == row["suspended_at"]  # type: ignore[index]
    assert row["controls"] == {**jobs.DEFAULT_CONTROLS, **sliced}

    rows = await jobs.service_taken(pool)
    assert [r["gpu_s"] for r in rows] == [pytest.approx(2 * 30, abs=1)]
    async with start_schedd(pool, usage_half_life_s=HOUR) as schedd:
        (job,) = await schedd.scheduler.placed_now()
        usage = await schedd.scheduler.usage()
    assert (job.state, job.attained_s) == ("suspended", pytest.approx(2 * 30, abs=1))
    assert job.state_since == pytest.approx(row["suspended_at"].timestamp())
    # The 30 s it ran count as the 30 s before its suspension.
    expected = decayed(2, 30 / HOUR, 0)
    assert usage.users[("q", "alice")] == pytest.approx(expected, rel=0.05)

    await jobs.transition(pool, job_id, JobState.SUCCEEDED, "exit 0", attempt=1)
    row = await jobs.get(pool, job_id)
    assert row is not None and row["attained_gpu_s"] == pytest.approx(2 * 30, abs=1)
    paused = await pool.fetchval("SELECT paused_s FROM job_runs WHERE job_id = $1", job_id)
    assert paused == pytest.approx(70, abs=1)
    # Its run time, for estimates from history, is the time it ran.
    means = await jobs.mean_runtimes(pool, [("alice", "train")])
    assert means[("alice", "train")] == pytest.approx(30, abs=1)
    # A new attempt starts with none of it.
    await pool.execute("UPDATE jobs SET state = 'pending' WHERE id = $1", job_id)
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    row = await jobs.get(pool, job_id)
    assert row is not None and (row["suspended_at"], row["resumed_at"], row["paused_s"]) == (
        None,
        None,
        0,
    )
    assert row["controls"] is None


async def test_an_opportunistic_job_waits_for_a_node_whose_agent_throttles_it(
    pool: asyncpg.Pool,
) -> None:
    """An agent with its coordinator off says so in its hello: nothing there would
    throttle an opportunistic job, so none goes there; it starts on a node that does."""
    job_id = await add_job(pool, gpus=1, kind=JobKind.OPPORTUNISTIC)
    async with start_schedd(pool, policy="default") as schedd:
        bare = FakeAgent(schedd.server, node_id="bare")
        bare.inventory = msgspec.structs.replace(bare.inventory, coordinator=False)
        await bare.connect(hub=schedd.hub)
        (node,) = (await schedd.scheduler.snapshot(10)).nodes
        assert (node.node_id, node.coordinated) == ("bare", False)
        reason = await waits_with(schedd, job_id, "no_shareable_gpu")
        assert "1 node without a coordinator to throttle it" in reason
        steered = await FakeAgent(schedd.server, node_id="steered").connect()
        launch = await steered.expect(p.Launch)
        assert (launch.job_id, launch.kind) == (job_id, "opportunistic")
        token = await tokens.create(pool, "root", "admin")
        listed = (await api_get(schedd, token, "/v1/nodes"))["nodes"]
        assert {n["node_id"]: n["coordinator"] for n in listed} == {"bare": False, "steered": True}
        await bare.close()
        await steered.close()
