"""The per-GPU coordinators inside the agent, over a real shim server on Unix sockets.

Scripted shims say hello and report steps as the real shim does (its own message
functions), and read back the controls the agent sends. Time is a fake clock advanced
by each step's wall time, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentd import coordination as coordination_module
from agentd.coordination import Coordination
from agentd.coordinator import CoordinatorSettings, GpuCoordinator
from agentd.job_controls import JobControls
from agentd.shim_server import ShimServer
from shared import shim
from shared import shim_protocol as sp
from shared.protocol import JobControlled, Msg

GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"
MEMORY_MIB = 16000
SETTINGS = CoordinatorSettings(solo_samples=5, window=4, warmup_steps=1)
# What each opportunistic job may hold with nothing known of the guaranteed job's memory:
# 16000 - 0 - 1024 (headroom), a multiple of 64.
FULL_CAP = 14976
SOLO_S = 0.1
# With the opportunistic jobs paused before its first step, the guaranteed job's warm-up
# and the pause's settling overlap; then come the solo samples.
LEARNING_STEPS = max(SETTINGS.warmup_steps, SETTINGS.settle_steps) + SETTINGS.solo_samples
_pids = itertools.count(os.getpid() * 100)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """The shim server's event sink: feeds the coordination, then wakes waiting tests.

    A message is recorded only after the coordination returned, so a test that waits
    for a step would time out if an exception escaped from it.
    """

    def __init__(self, coordination: Coordination) -> None:
        self.coordination = coordination
        self.last_step: dict[str, int] = {}
        self.arrived = asyncio.Event()

    def __call__(self, key: str, msg: sp.FromShim) -> None:
        self.coordination.on_shim_event(key, msg)
        if isinstance(msg, sp.Step):
            self.last_step[key] = msg.step
        self.arrived.set()

    async def step_seen(self, key: str, n: int) -> None:
        async with asyncio.timeout(5):
            while self.last_step.get(key) != n:
                self.arrived.clear()
                await self.arrived.wait()


@dataclass
class ScriptedShim:
    """A job's shim driven by hand: hello, steps, and the controls it reads back."""

    node: Node
    key: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    on_connect: list[sp.ToShim]  # the controls sent before `ready`
    steps: int = 0

    async def step(self, wall_s: float = SOLO_S, peak_mib: int | None = None) -> None:
        """Report one step, and return once the agent has handled it."""
        self.steps += 1
        self.node.clock.now += wall_s
        memory = None if peak_mib is None else shim.Memory(peak_mib, peak_mib, peak_mib)
        msg = shim.step_msg(self.steps, wall_s, wall_s, memory, None, False)
        self.writer.write(shim.encode(msg))
        await self.writer.drain()
        await self.node.sink.step_seen(self.key, self.steps)

    async def receive(self) -> sp.ToShim:
        return sp.decode_to_shim(await asyncio.wait_for(self.reader.readline(), 5))

    async def nothing_pending(self) -> bool:
        """Whether the agent sent nothing since the last receive: a marker comes next."""
        self.node.shims.resume(self.key)  # harmless to a running job
        return await self.receive() == sp.Resume()


@dataclass
class Node:
    shims: ShimServer
    coordination: Coordination
    sink: Sink
    clock: Clock
    posted: list[Msg]
    clients: list[ScriptedShim] = field(default_factory=list)

    async def start(self, key: str, kind: str, gpus: list[str]) -> None:
        """What the runner does for a launch: the socket first, then the observers."""
        await self.shims.open_job(key)
        self.coordination.job_started(key, kind, gpus)

    async def connect(
        self, key: str, kind: str = shim.OPPORTUNISTIC, applies: shim.Controls | None = None
    ) -> ScriptedShim:
        path = self.shims.socket_dir / f"{key}.sock"
        reader, writer = await asyncio.open_unix_connection(str(path))
        hello = shim.hello_msg(next(_pids), kind, 0, applies or shim.Controls())
        writer.write(shim.encode(hello))
        await writer.drain()
        client = ScriptedShim(self, key, reader, writer, [])
        while not isinstance(msg := await client.receive(), sp.Ready):
            client.on_connect.append(msg)
        self.clients.append(client)
        return client

    async def learn(self, guaranteed: ScriptedShim, peak_mib: int | None = None) -> None:
        """Steps at solo speed until the guaranteed job's solo time is known."""
        for _ in range(LEARNING_STEPS):
            await guaranteed.step(SOLO_S, peak_mib)

    async def sharing_gpu_a(self) -> tuple[ScriptedShim, ScriptedShim]:
        """Guaranteed job jg.1 and opportunistic job jo.1 on GPU A, the solo time
        learned and the opportunistic job let in: (its shim, the guaranteed job's)."""
        await self.start("jg.1", "guaranteed", [GPU_A])
        await self.start("jo.1", "opportunistic", [GPU_A])
        ot = await self.connect("jo.1")
        rg = await self.connect("jg.1", shim.GUARANTEED)
        await self.learn(rg)
        let_in = sp.Limits(share=SETTINGS.initial_share, memory_cap_mib=FULL_CAP)
        assert await ot.receive() == let_in
        return ot, rg

    def limits_posted(self) -> list[JobControlled]:
        return [m for m in self.posted if isinstance(m, JobControlled) and m.event == "limits"]


def limits(msgs: list[sp.ToShim]) -> list[sp.Limits]:
    return [m for m in msgs if isinstance(m, sp.Limits)]


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    socket_dir = Path(tempfile.mkdtemp(prefix="coord-"))  # a socket's path is short
    shims = ShimServer(socket_dir / "s")
    posted: list[Msg] = []
    clock = Clock()
    gpus = {GPU_A: MEMORY_MIB, GPU_B: MEMORY_MIB}
    coordination = Coordination(shims, posted.append, gpus, SETTINGS, clock)
    sink = Sink(coordination)
    shims.on_event = sink
    n = Node(shims, coordination, sink, clock, posted)
    yield n
    for client in n.clients:
        client.writer.close()
    await shims.close()
    shutil.rmtree(socket_dir)


async def test_an_opportunistic_job_waits_for_the_solo_time_then_gets_a_share(
    node: Node,
) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_A])
    (paused,) = node.limits_posted()
    assert (paused.job_id, paused.attempt) == ("jo", 1)
    assert paused.detail.startswith(f"coordinator on GPU {GPU_A}: ")
    assert "paused while jg.1's solo step time is learned" in paused.detail
    # Decided before the shim was up: the socket holds it for the job's first step.
    ot = await node.connect("jo.1")
    assert ot.on_connect == [sp.Limits(share=0, memory_cap_mib=FULL_CAP)]
    rg = await node.connect("jg.1", shim.GUARANTEED)
    assert rg.on_connect == []  # a guaranteed job is never steered

    for _ in range(LEARNING_STEPS - 1):
        await rg.step()
    assert await ot.nothing_pending()
    assert len(node.limits_posted()) == 1
    await rg.step()  # the last solo sample
    assert await ot.receive() == sp.Limits(share=SETTINGS.initial_share, memory_cap_mib=FULL_CAP)
    learned = node.limits_posted()[-1]
    assert (learned.job_id, learned.attempt) == ("jo", 1)
    assert "learned guaranteed job jg.1's solo step time: 0.1 s" in learned.detail
    assert learned.detail.endswith(f"share 0 -> {SETTINGS.initial_share}")
    (state,) = node.coordination.states()
    assert state.solo_step_s == pytest.approx(SOLO_S)

    # A window at solo speed gives back; a slow one cuts.
    for _ in range(SETTINGS.window):
        await rg.step()
    raised = SETTINGS.initial_share + SETTINGS.increase
    assert await ot.receive() == sp.Limits(share=raised, memory_cap_mib=FULL_CAP)
    for _ in range(SETTINGS.window):
        await rg.step(2 * SOLO_S)
    cut = int(raised * SETTINGS.decrease)
    assert await ot.receive() == sp.Limits(share=cut, memory_cap_mib=FULL_CAP)
    assert "at 2.000x its solo step time" in node.limits_posted()[-1].detail

    # The shim reconnects: the socket resends what it holds, and nothing is reported again.
    reported = len(node.posted)
    again = await node.connect("jo.1")
    assert limits(again.on_connect) == [sp.Limits(share=cut, memory_cap_mib=FULL_CAP)]
    assert len(node.posted) == reported


async def test_a_memory_surge_caps_the_neighbours_at_that_very_step(node: Node) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_A])
    await node.start("jo2.1", "opportunistic", [GPU_A])
    ot, ot2 = await node.connect("jo.1"), await node.connect("jo2.1")
    half = FULL_CAP // 2 // 64 * 64  # two jobs share the room equally
    assert ot.on_connect == ot2.on_connect == [sp.Limits(share=0, memory_cap_mib=half)]
    rg = await node.connect("jg.1", shim.GUARANTEED)
    await node.learn(rg)
    share = SETTINGS.initial_share
    for client in (ot, ot2):
        assert await client.receive() == sp.Limits(share=share, memory_cap_mib=half)

    await rg.step(SOLO_S, peak_mib=8000)
    surge = (MEMORY_MIB - 8000 - 1024) // 2 // 64 * 64
    for client in (ot, ot2):
        assert await client.receive() == sp.Limits(share=share, memory_cap_mib=surge)
    details = [m.detail for m in node.limits_posted()[-2:]]
    assert all("jg.1's memory peak rose to 8000 MiB" in d for d in details)

    # No room left: a pause, not a cap the jobs would fail on.
    await rg.step(SOLO_S, peak_mib=15000)
    for client in (ot, ot2):
        assert await client.receive() == sp.Limits(share=0, memory_cap_mib=0)
    assert "below the 512 MiB minimum" in node.limits_posted()[-1].detail


async def test_jobs_on_different_gpus_are_not_coordinated_together(node: Node) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_B])
    ot = await node.connect("jo.1")
    rg = await node.connect("jg.1", shim.GUARANTEED)
    assert ot.on_connect == []
    await node.learn(rg, peak_mib=12000)
    for _ in range(SETTINGS.window):
        await rg.step(3 * SOLO_S, peak_mib=15000)
    assert await ot.nothing_pending()
    assert node.posted == []
    a, b = node.coordination.states()
    assert (a.gpu_uuid, a.guaranteed, a.opportunistic) == (GPU_A, "jg.1", {})
    assert (b.gpu_uuid, b.guaranteed, b.opportunistic) == (GPU_B, None, {"jo.1": (100, None)})


async def test_a_job_on_two_gpus_gets_the_stricter_setting(node: Node) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jh.1", "guaranteed", [GPU_B])
    await node.start("jo.1", "opportunistic", [GPU_A, GPU_B])
    assert {m.detail.split(":")[0] for m in node.limits_posted()} == {
        f"coordinator on GPU {GPU_A}",
        f"coordinator on GPU {GPU_B}",
    }
    ot = await node.connect("jo.1")
    assert ot.on_connect == [sp.Limits(share=0, memory_cap_mib=FULL_CAP)]
    rg_a = await node.connect("jg.1", shim.GUARANTEED)
    rg_b = await node.connect("jh.1", shim.GUARANTEED)

    await node.learn(rg_a)  # GPU A would let it run; GPU B still learns
    assert node.limits_posted()[-1].detail.startswith(f"coordinator on GPU {GPU_A}: learned")
    assert await ot.nothing_pending()
    await rg_b.step(SOLO_S, peak_mib=8000)  # GPU B's cap is the smaller one
    surge = (MEMORY_MIB - 8000 - 1024) // 64 * 64
    assert await ot.receive() == sp.Limits(share=0, memory_cap_mib=surge)
    for _ in range(LEARNING_STEPS - 1):
        await rg_b.step(SOLO_S, peak_mib=8000)
    assert await ot.receive() == sp.Limits(share=SETTINGS.initial_share, memory_cap_mib=surge)


async def test_the_end_of_the_guaranteed_job_lifts_coordination(node: Node) -> None:
    ot, rg = await node.sharing_gpu_a()

    node.coordination.job_ended("jg.1")
    assert await ot.receive() == sp.Limits(share=100, memory_cap_mib=None)
    lifted = node.limits_posted()[-1]
    assert (lifted.job_id, lifted.attempt) == ("jo", 1)
    assert "guaranteed job jg.1 left; nothing to protect" in lifted.detail
    reported = len(node.posted)
    await rg.step(5 * SOLO_S, peak_mib=15000)  # a late report of the ended job
    assert len(node.posted) == reported
    node.coordination.job_ended("jg.1")  # again: nothing
    node.coordination.job_ended("jo.1")
    assert node.coordination.states() == []
    assert await ot.nothing_pending()


class Recorder:
    """Stands in for the module's logger: what it was asked to log, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda msg, **kw: self.lines.append((level, msg, kw))


async def test_a_coordinator_that_raises_is_logged_and_the_rest_carries_on(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(coordination_module, "log", recorder)
    real_step = GpuCoordinator.step
    calls = itertools.count()

    @functools.wraps(real_step)
    def step_once_broken(self: GpuCoordinator, *args: Any) -> Any:
        if next(calls) == 0:
            raise RuntimeError("coordinator bug")
        return real_step(self, *args)

    monkeypatch.setattr(GpuCoordinator, "step", step_once_broken)
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_A])
    ot = await node.connect("jo.1")
    rg = await node.connect("jg.1", shim.GUARANTEED)

    await rg.step()  # the sink returned (the step was seen) although the coordinator raised
    failures = [kw for level, msg, kw in recorder.lines if msg == "coordinator failed"]
    assert failures == [{"gpu": GPU_A, "job_key": "jg.1", "call": "step"}]
    assert [level for level, msg, _ in recorder.lines if msg == "coordinator failed"] == [
        "exception"
    ]
    assert node.shims.connected("jg.1")

    # A second guaranteed job on one GPU (time-slicing's) is not coordinated there while
    # the first one is: it waits for that one to be suspended or to end.
    await node.start("jg2.1", "guaranteed", [GPU_A])
    assert recorder.lines[-1] == (
        "info",
        "guaranteed job waits to be coordinated",
        {"job_key": "jg2.1", "gpu": GPU_A, "holder": "jg.1"},
    )
    await node.learn(rg)
    assert await ot.receive() == sp.Limits(share=SETTINGS.initial_share, memory_cap_mib=FULL_CAP)
    assert node.coordination.states()[0].guaranteed == "jg.1"


async def test_after_an_agent_restart_the_shims_are_set_to_what_the_coordinators_want(
    node: Node,
) -> None:
    # The restarted agent finds its jobs before it opens their sockets again.
    node.coordination.job_started("jg.1", "guaranteed", [GPU_A])
    node.coordination.job_started("jo.1", "opportunistic", [GPU_A])
    node.coordination.job_started("jp.1", "opportunistic", [GPU_B])
    assert len(node.limits_posted()) == 1  # jo.1 paused, while its socket is not open yet
    for key in ("jg.1", "jo.1", "jp.1", "jq.1"):
        await node.shims.open_job(key)

    # Each shim still applies what the previous agent asked.
    # (Set when the hello arrives, and resent by the socket before `ready`: twice, alike.)
    ot = await node.connect("jo.1", applies=shim.Controls(share=40, memory_cap_mib=5000))
    assert set(map(sp.encode, ot.on_connect)) == {
        sp.encode(sp.Limits(share=0, memory_cap_mib=FULL_CAP))
    }
    alone = await node.connect("jp.1", applies=shim.Controls(share=0, memory_cap_mib=3000))
    assert set(map(sp.encode, alone.on_connect)) == {
        sp.encode(sp.Limits(share=100, memory_cap_mib=None))  # nothing to protect there
    }
    resent = node.limits_posted()[-1]
    assert (resent.job_id, resent.attempt) == ("jp", 1)
    assert "connected applying share 0, memory cap 3000 MiB; set to share 100" in resent.detail
    # A job the agent did not start is left alone.
    reported = len(node.posted)
    stranger = await node.connect("jq.1", applies=shim.Controls(share=0))
    assert stranger.on_connect == []
    assert len(node.posted) == reported


def kind_posted(node: Node) -> list[JobControlled]:
    return [m for m in node.posted if isinstance(m, JobControlled) and m.event == "kind"]


async def test_an_upgrade_frees_the_job_unless_its_gpu_has_another_guaranteed_job(
    node: Node,
) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_A])
    ot = await node.connect("jo.1")
    assert ot.on_connect == [sp.Limits(share=0, memory_cap_mib=FULL_CAP)]  # paused
    # GPU A has jg.1: the upgrade is refused and the job stays steered as it was.
    node.coordination.set_kind("jo.1", "guaranteed")
    (refused,) = kind_posted(node)
    assert (refused.job_id, refused.attempt) == ("jo", 1)
    assert refused.detail == f"not taken: GPU {GPU_A} has a guaranteed job already"
    (state,) = node.coordination.states()
    assert (state.guaranteed, list(state.opportunistic)) == ("jg.1", ["jo.1"])
    assert await ot.nothing_pending()

    # Once jg.1 has left, the upgrade is taken: jo.1 is GPU A's guaranteed job, unsteered.
    node.coordination.job_ended("jg.1")
    assert await ot.receive() == sp.Limits(share=100, memory_cap_mib=None)  # nothing to protect
    node.coordination.set_kind("jo.1", "guaranteed")
    taken = kind_posted(node)[-1]
    assert taken.detail == f"guaranteed: taken by the coordinators of GPU(s) {GPU_A}"
    (state,) = node.coordination.states()
    assert (state.guaranteed, state.opportunistic) == ("jo.1", {})
    # A new opportunistic job beside it is steered, as beside any guaranteed job.
    await node.start("jn.1", "opportunistic", [GPU_A])
    assert node.limits_posted()[-1].job_id == "jn"
    node.coordination.set_kind("jo.1", "guaranteed")  # known already: nothing more said
    assert len(kind_posted(node)) == 2


async def test_guaranteed_jobs_taking_turns_on_a_gpu_are_protected_in_turn(node: Node) -> None:
    """Time-slicing: the suspended guaranteed job leaves the GPU's coordinator to the one
    whose turn it is, and takes it back when it is resumed in that one's place."""
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jo.1", "opportunistic", [GPU_A])
    ot = await node.connect("jo.1")
    assert limits(ot.on_connect) == [sp.Limits(share=0, memory_cap_mib=FULL_CAP)]

    # Suspend jg.1, then launch jg2.1 on its GPU (the order of the plan's actions).
    node.coordination.suspended("jg.1", True)
    assert await ot.receive() == sp.Limits(share=100, memory_cap_mib=None)
    assert node.coordination.states()[0].guaranteed is None
    await node.start("jg2.1", "guaranteed", [GPU_A])
    assert node.coordination.states()[0].guaranteed == "jg2.1"
    assert await ot.receive() == sp.Limits(share=0, memory_cap_mib=FULL_CAP)  # learns anew
    node.coordination.suspended("jg.1", True)  # a repeated suspend (a reconnect): nothing
    assert await ot.nothing_pending()

    # The rotation: jg2.1 suspended, then jg.1 resumed.
    node.coordination.suspended("jg2.1", True)
    node.coordination.suspended("jg.1", False)
    assert node.coordination.states()[0].guaranteed == "jg.1"

    # A resumed job that finds another guaranteed job there waits for it, as a job
    # launched there does (an agent that restarted recovers both as they were launched).
    node.coordination.suspended("jg2.1", False)
    assert node.coordination.states()[0].guaranteed == "jg.1"
    node.coordination.suspended("jg.1", True)
    assert node.coordination.states()[0].guaranteed == "jg2.1"
    node.coordination.job_ended("jg2.1")
    assert node.coordination.states()[0].guaranteed is None  # jg.1 is suspended still
    node.coordination.suspended("jg.1", False)
    assert node.coordination.states()[0].guaranteed == "jg.1"


async def test_a_packed_job_is_not_its_gpus_guaranteed_job_until_its_partner_leaves(
    node: Node,
) -> None:
    """Packing: a time-sliced job resumed beside the job whose turn it is (which is not
    suspended) runs uncoordinated; the partner stays the GPU's guaranteed job, through
    the pack being undone and made again, until it ends."""
    await node.start("jg.1", "guaranteed", [GPU_A])
    node.coordination.suspended("jg.1", True)
    await node.start("jg2.1", "guaranteed", [GPU_A])
    node.coordination.suspended("jg.1", False)  # packed beside jg2.1
    assert node.coordination.states()[0].guaranteed == "jg2.1"
    node.coordination.suspended("jg.1", True)  # the pack undone
    assert node.coordination.states()[0].guaranteed == "jg2.1"
    node.coordination.suspended("jg.1", False)  # packed again
    assert node.coordination.states()[0].guaranteed == "jg2.1"
    node.coordination.job_ended("jg2.1")  # its partner left: the GPU is its own
    assert node.coordination.states()[0].guaranteed == "jg.1"


async def test_a_guaranteed_job_waiting_on_a_gpu_joins_when_its_holder_ends(node: Node) -> None:
    await node.start("jg.1", "guaranteed", [GPU_A])
    await node.start("jg2.1", "guaranteed", [GPU_A, GPU_B])
    a, b = node.coordination.states()
    assert (a.guaranteed, b.guaranteed) == ("jg.1", "jg2.1")
    node.coordination.job_ended("jg.1")
    (a, b) = node.coordination.states()
    assert (a.guaranteed, b.guaranteed) == ("jg2.1", "jg2.1")


async def test_schedds_limits_bound_what_the_coordinators_give_an_opportunistic_job(
    node: Node,
) -> None:
    """Limits from schedd (a user's, or a plan's) are the most an opportunistic job the
    coordinators steer gets, beside the guaranteed job and once alone; a guaranteed
    job's limits are its setting, as without a coordinator."""
    controls = JobControls(node.shims, node.posted.append, lambda job_id, attempt: None, 1.0)
    controls.bound = node.coordination.bound
    ot, rg = await node.sharing_gpu_a()

    controls.set_limits("jo", 1, 5, 4096)
    assert await ot.receive() == sp.Limits(share=5, memory_cap_mib=4096)
    said = [m for m in node.posted if isinstance(m, JobControlled) and m.job_id == "jo"]
    assert said[-1].detail == (
        "at most share 5, memory cap 4096 MiB: the coordinators of its GPUs give no more"
    )
    node.coordination.job_ended("jg.1")  # alone now: still the bound, not the whole GPU
    assert await ot.nothing_pending()
    controls.set_limits("jo", 1, 100, None)  # lifted
    assert await ot.receive() == sp.Limits(share=100, memory_cap_mib=None)

    controls.set_limits("jg", 1, 50, None)  # no longer coordinated: its setting
    assert await rg.receive() == sp.Limits(share=50, memory_cap_mib=None)
