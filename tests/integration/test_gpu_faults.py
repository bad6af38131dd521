"""GPU faults through the hub, the scheduler and the API, with scripted agents: an XID
that points at the GPU takes it out of placement until an admin clears it (kept across a
restart), a job's own XID does not, a GPU that cannot be read is out while it cannot,
and a job that holds a GPU when it faults keeps it until it ends."""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg
import msgspec
import pytest

from schedd.policy.actions import Launch, Plan
from schedd.policy.snapshot import Snapshot
from schedd.store import jobs, tokens
from shared import protocol as p
from shared.model import JobKind
from tests.integration.fake_agent import FakeAgent, agent_on, exited, started, state_becomes
from tests.integration.inprocess import (
    Schedd,
    api_call,
    api_get,
    start_schedd,
    submit,
    waits_with,
)


async def gpu_shown(schedd: Schedd, token: str, uuid: str) -> dict[str, object]:
    nodes = (await api_get(schedd, token, "/v1/nodes"))["nodes"]
    return next(g for n in nodes for g in n["gpus"] if g["uuid"] == uuid)


async def faulted(schedd: Schedd, agent: FakeAgent, uuid: str, xid: int | None) -> None:
    await agent.send(p.GpuFault(uuid=uuid, xid=xid, error=f"XID {xid}"))
    async with asyncio.timeout(5):
        while uuid not in schedd.hub.faulty:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_hardware_xid_takes_the_gpu_out_until_an_admin_clears_it(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await agent_on(schedd, "n1")
    admin = await tokens.create(pool, "root", "admin")
    alice = await tokens.create(pool, "alice", "user")
    await faulted(schedd, agent, "n1-g1", 79)
    shown = await gpu_shown(schedd, admin, "n1-g1")
    assert (shown["fault"], shown["fault_xid"]) == ("XID 79", 79) and shown["fault_at"]

    # Only one GPU of the node is offered now: the cluster has one.
    pair = await submit(schedd, pool, gpus=2)
    assert await waits_with(schedd, pair, "too_large") == "asks for 2 GPUs; the cluster has 1"
    one = await submit(schedd, pool, gpus=1)
    assert (await started(agent, pool, one)).gpu_uuids == ["n1-g0"]

    # Only an admin clears it; a GPU the node does not have, or one without a fault, is
    # told apart.
    path = "/v1/nodes/n1/gpus/n1-g1/fault"
    assert (await api_call(schedd, alice, "DELETE", path))[0] == 403
    status, body = await api_call(schedd, admin, "DELETE", "/v1/nodes/n1/gpus/n9-g1/fault")
    assert (status, body["detail"]) == (404, "no GPU n9-g1 on node n1")
    status, body = await api_call(schedd, admin, "DELETE", path)
    assert status == 200
    assert (body["cleared"]["fault"], body["cleared"]["fault_xid"]) == ("XID 79", 79)
    status, body = await api_call(schedd, admin, "DELETE", path)
    assert (status, body["detail"]) == (409, "GPU n1-g1 of node n1 has no fault to clear")
    assert (await gpu_shown(schedd, admin, "n1-g1"))["fault"] is None
    # Back in placement: the pair starts once the single job has ended.
    await exited(agent, one, exit_code=0)
    assert sorted((await started(agent, pool, pair)).gpu_uuids) == ["n1-g0", "n1-g1"]
    await agent.close()


async def test_a_jobs_own_xid_leaves_the_gpu_in_placement(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await agent_on(schedd, "n1")
    await agent.send(p.GpuFault(uuid="n1-g1", xid=13, error="XID 13"))
    # A hardware XID on the other GPU after it: once that one is handled (a link's
    # messages are handled in order), so was the job's own.
    await faulted(schedd, agent, "n1-g0", 79)
    assert schedd.hub.faulty == {"n1-g0"}
    one = await submit(schedd, pool, gpus=1)
    assert (await started(agent, pool, one)).gpu_uuids == ["n1-g1"]
    await agent.close()


async def test_a_job_on_a_gpu_that_faults_keeps_it_until_it_ends(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await agent_on(schedd, "n1")
    holder = await submit(schedd, pool, gpus=2)
    await started(agent, pool, holder)
    await faulted(schedd, agent, "n1-g0", 79)  # fell off the bus
    # Not killed by schedd (the fault kills it, or it ends): its GPUs stay its own.
    (job,) = await schedd.scheduler.placed_now()
    assert job.job_id == holder and (await jobs.get(pool, holder))["state"] == "running"
    snapshot = await schedd.scheduler.snapshot(10)
    assert [g.uuid for g in snapshot.nodes[0].gpus] == ["n1-g0", "n1-g1"]
    assert snapshot.nodes[0].out == frozenset({"n1-g0"})  # what every plan now sees
    with pytest.raises(TimeoutError):  # and nothing is sent to stop the job
        await agent.next(within=0.5)
    await exited(agent, holder, signal=9)
    await state_becomes(pool, holder, "failed")
    pair = await submit(schedd, pool, gpus=2)
    await waits_with(schedd, pair, "too_large")
    one = await submit(schedd, pool, gpus=1)
    assert (await started(agent, pool, one)).gpu_uuids == ["n1-g1"]
    await agent.close()


async def test_a_fault_outlives_a_restart(pool: asyncpg.Pool) -> None:
    async with start_schedd(pool) as first:
        agent = await agent_on(first, "n1")
        await faulted(first, agent, "n1-g0", 48)
        await agent.close()
    async with start_schedd(pool) as second:
        assert second.hub.faulty == {"n1-g0"}
        agent = await agent_on(second, "n1")
        one = await submit(second, pool, gpus=1)
        assert (await started(agent, pool, one)).gpu_uuids == ["n1-g1"]
        await agent.close()


async def test_a_gpu_that_cannot_be_read_is_out_while_it_cannot(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await agent_on(schedd, "n1")
    lost = p.GpuSample(uuid="n1-g0", utilization_pct=100, memory_used_mib=1000, error="GPU is lost")
    fine = p.GpuSample(uuid="n1-g1", utilization_pct=0, memory_used_mib=0)
    await agent.send(p.GpuState(samples=[lost, fine]))
    pair = await submit(schedd, pool, gpus=2)
    await waits_with(schedd, pair, "too_large")
    # It answers again: back in placement, and the pair starts.
    back = p.GpuSample(uuid="n1-g0", utilization_pct=0, memory_used_mib=0)
    await agent.send(p.GpuState(samples=[back]))
    assert sorted((await started(agent, pool, pair)).gpu_uuids) == ["n1-g0", "n1-g1"]
    await agent.close()


async def test_a_gpu_out_that_an_opportunistic_job_holds_goes_to_nobody(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    """An opportunistic job does not own its GPU: were it not out, a guaranteed job
    could take it."""
    agent = await agent_on(schedd, "n1")
    guest = await submit(schedd, pool, kind=JobKind.OPPORTUNISTIC)
    (uuid,) = (await started(agent, pool, guest)).gpu_uuids
    await faulted(schedd, agent, uuid, 79)
    pair = await submit(schedd, pool, gpus=2)
    await waits_with(schedd, pair, "no_capacity")
    # Cleared, the GPU is the pair's, beside the guest as any GPU only a guest holds.
    admin = await tokens.create(pool, "root", "admin")
    assert (await api_call(schedd, admin, "DELETE", f"/v1/nodes/n1/gpus/{uuid}/fault"))[0] == 200
    assert sorted((await started(agent, pool, pair)).gpu_uuids) == ["n1-g0", "n1-g1"]
    await agent.close()


async def test_a_fault_stays_when_the_gpu_leaves_the_inventory_and_is_cleared_once(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await agent_on(schedd, "n1")
    admin = await tokens.create(pool, "root", "admin")
    await faulted(schedd, agent, "n1-g1", 79)
    # The agent restarts and no longer finds the GPU (it fell off the bus).
    await agent.close()
    agent = FakeAgent(schedd.server, "n1", gpus=1)
    agent.inventory = msgspec.structs.replace(
        agent.inventory, gpus=[p.GpuInfo(index=0, uuid="n1-g0", model="Sim", memory_mib=1000)]
    )
    await agent.connect(hub=schedd.hub)
    assert (await gpu_shown(schedd, admin, "n1-g1"))["fault"] == "XID 79"
    # Two admins clear it at once: one clears it, the other finds nothing to clear.
    path = "/v1/nodes/n1/gpus/n1-g1/fault"
    answers = await asyncio.gather(*(api_call(schedd, admin, "DELETE", path) for _ in range(2)))
    assert sorted(status for status, _ in answers) == [200, 409]
    assert "n1-g1" not in schedd.hub.faulty
    await agent.close()


async def test_a_launch_decided_before_a_fault_arrived_is_not_carried_out(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    """The fault comes while the plan's actions are carried out (here: right after the
    plan), onto the very GPU a launch was to use: the launch is skipped."""
    agent = await agent_on(schedd, "n1", gpus=1)
    scheduler = schedd.scheduler
    real = scheduler.profile.plan

    def fault_after(snapshot: Snapshot, now: float) -> Plan:
        plan = real(snapshot, now)
        if any(isinstance(a, Launch) for a in plan.actions):
            schedd.hub.faulty.add("n1-g0")
        return plan

    scheduler.profile = dataclasses.replace(scheduler.profile, plan=fault_after)
    job = await submit(schedd, pool, gpus=1)
    async with asyncio.timeout(5):
        while "n1-g0" not in schedd.hub.faulty:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    scheduler.wake()  # as the hub does when a fault arrives
    await waits_with(schedd, job, "too_large")  # the next cycle sees the GPU out
    assert (await jobs.get(pool, job))["state"] == "pending"
    with pytest.raises(TimeoutError):
        await agent.expect(p.Launch, within=0.3)
    await agent.close()
