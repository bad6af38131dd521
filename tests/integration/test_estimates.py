"""The resource estimator live: usage gathered from GPU samples, training on succeeded
jobs in PostgreSQL, estimates in snapshots and in GET /v1/estimates/{job}."""

from __future__ import annotations

import asyncpg

from schedd.store import jobs, nodes, tokens
from shared.model import JobSpec
from shared.protocol import GpuSample
from tests.integration.fake_agent import FakeAgent
from tests.integration.inprocess import api_call, start_schedd


def spec(model: str, **more: object) -> JobSpec:
    return JobSpec(name="train", command=["true"], labels={"model": model}, **more)  # type: ignore[arg-type]


def sample(uuid: str, util: int, memory: int) -> GpuSample:
    return GpuSample(uuid=uuid, utilization_pct=util, memory_used_mib=memory)


async def finished(
    pool: asyncpg.Pool, user: str, model: str, run_s: float, peak_mib: int | None = None
) -> None:
    row, _ = await jobs.submit(pool, user, spec(model), None)
    await pool.execute(
        "UPDATE jobs SET state = 'succeeded', attained_gpu_s = $2, started_at = now(),"
        " finished_at = now(), gpu_memory_peak_mib = $3 WHERE id = $1",
        row["id"],
        run_s,
        peak_mib,
    )


async def test_gpu_samples_add_up_to_a_running_jobs_usage(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec("bert", gpus=2), None)
    other, _ = await jobs.submit(pool, "alice", spec("bert"), None)  # pending: untouched
    await pool.execute(
        "UPDATE jobs SET state = 'running', node_id = 'n1', gpu_uuids = $2 WHERE id = $1",
        row["id"],
        ["g1", "g2"],
    )
    await nodes.record_samples(
        pool, "n1", [sample("g1", 80, 1000), sample("g2", 60, 3000), sample("g9", 5, 5)]
    )
    # The same GPU names reported by another node are another node's GPUs.
    await nodes.record_samples(pool, "n2", [sample("g1", 99, 99_999)])
    unread = GpuSample(uuid="g2", utilization_pct=100, memory_used_mib=80_000, error="lost")
    await nodes.record_samples(pool, "n1", [sample("g1", 100, 2000), unread])
    used = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", row["id"])
    assert used["gpu_memory_peak_mib"] == 3000
    assert used["gpu_util_samples"] == 2
    assert used["gpu_util_sum"] == 170.0  # (80 + 60) / 2, then 100
    assert used["gpu_util_sumsq"] == 70.0**2 + 100.0**2
    idle = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", other["id"])
    assert idle["gpu_memory_peak_mib"] is None and idle["gpu_util_samples"] == 0

    # Another job now runs on g2 beside it: a sample of g2 shows both, and is neither's.
    await pool.execute(
        "UPDATE jobs SET state = 'running', node_id = 'n1', gpu_uuids = $2 WHERE id = $1",
        other["id"],
        ["g2"],
    )
    await nodes.record_samples(pool, "n1", [sample("g1", 10, 500), sample("g2", 90, 9_000)])
    both = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", row["id"])
    beside = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", other["id"])
    assert (both["gpu_memory_peak_mib"], both["gpu_util_samples"]) == (3000, 2)
    assert (beside["gpu_memory_peak_mib"], beside["gpu_util_samples"]) == (None, 0)

    # Suspended there, it keeps its tensors in GPU memory: the sample's utilisation is
    # the running job's, its memory is not.
    await pool.execute(
        """UPDATE jobs SET controls = '{"suspended": true}'::jsonb WHERE id = $1""", other["id"]
    )
    await nodes.record_samples(pool, "n1", [sample("g1", 10, 500), sample("g2", 90, 9_000)])
    turns = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", row["id"])
    assert (turns["gpu_memory_peak_mib"], turns["gpu_util_samples"]) == (3000, 3)


async def test_the_estimator_learns_from_succeeded_jobs_and_says_so(pool: asyncpg.Pool) -> None:
    alice = await tokens.create(pool, "alice", "user")
    bob = await tokens.create(pool, "bob", "user")
    for i in range(30):
        await finished(pool, "alice", "resnet50", 3600.0 + i)
        await finished(pool, "alice", "bert", 600.0 + i)
    async with start_schedd(pool) as schedd:
        scheduler = schedd.scheduler
        status, body = await api_call(schedd, alice, "POST", "/v1/jobs", {
            "name": "train", "command": ["true"], "labels": {"model": "bert"}})  # fmt: skip
        assert status == 201, body
        job_id = body["id"]
        trained = await scheduler.train_estimator()
        assert trained is not None and trained.trained_on == 60
        assert await scheduler.train_estimator() is trained  # nothing new: kept

        status, shown = await api_call(schedd, alice, "GET", f"/v1/estimates/{job_id}")
        assert status == 200, shown
        run = shown["estimates"]["run_time_s"]
        assert 550 < run["value"] < 700, run
        assert run["basis"].startswith("random forest of 50 trees on 60 finished jobs")
        assert shown["estimates"]["gpu_memory_peak_mib"]["value"] is None
        assert shown["used"]["source"] == "estimator"
        assert (await api_call(schedd, bob, "GET", f"/v1/estimates/{job_id}"))[0] == 404

        # The scheduler plans with the same figure for a job with no estimate of its own.
        rows = await jobs.pending(pool, 10)
        await scheduler._predict(rows)
        planned = scheduler._predicted[job_id][1]
        assert abs(planned - run["value"]) < 1e-3 * run["value"]

        # History grows: the next training learns from it, and predictions follow.
        for i in range(10):
            await finished(pool, "alice", "bert", 1200.0 + i)
        retrained = await scheduler.train_estimator()
        assert retrained is not None and retrained is not trained
        assert retrained.trained_on == 70
        await scheduler._predict(rows)
        assert scheduler._predicted[job_id][0] is retrained
        assert scheduler._predicted[job_id][1] > planned  # bert's jobs now take longer


async def test_a_predicted_peak_memory_stands_in_where_a_spec_asks_none(
    pool: asyncpg.Pool,
) -> None:
    """Once 20 succeeded jobs report their peak GPU memory, the snapshot gives a pending
    job whose spec asks none the predicted peak (what sharing a GPU reads), and
    GET /v1/estimates/{job} says so; a spec's own figure stands."""
    alice = await tokens.create(pool, "alice", "user")
    for i in range(30):
        for model, peak in (("bert", 6_000), ("resnet50", 12_000)):
            await finished(pool, "alice", model, 600.0 + i, peak + i)
    async with start_schedd(pool, estimator_retrain_s=0) as schedd:
        agent = await FakeAgent(schedd.server, gpus=1).connect(hub=schedd.hub)
        bare, _ = await jobs.submit(pool, "alice", spec("resnet50", gpus=2), None)
        asks, _ = await jobs.submit(pool, "alice", spec("bert", gpu_memory_mib=2_000), None)
        scheduler = schedd.scheduler
        before = {j.job_id: j for j in (await scheduler.snapshot(10)).pending}
        assert before[bare["id"]].predicted_gpu_memory_mib is None  # nothing trained yet

        assert await scheduler.train_estimator() is not None
        pending = {j.job_id: j for j in (await scheduler.snapshot(10)).pending}
        predicted = pending[bare["id"]].predicted_gpu_memory_mib
        assert predicted is not None and 11_000 < predicted < 13_100, predicted
        assert pending[asks["id"]].predicted_gpu_memory_mib is None
        assert pending[asks["id"]].request.gpu_memory_mib == 2_000

        status, shown = await api_call(schedd, alice, "GET", f"/v1/estimates/{bare['id']}")
        assert status == 200, shown
        assert shown["used_for_sharing"] == {"gpu_memory_mib": predicted, "source": "estimator"}
        status, shown = await api_call(schedd, alice, "GET", f"/v1/estimates/{asks['id']}")
        assert shown["used_for_sharing"] == {"gpu_memory_mib": 2_000, "source": "spec"}
        await agent.close()
