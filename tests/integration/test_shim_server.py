"""The shim server over real Unix sockets: who may connect, and hostile clients.

The clients here are hand-written, to send what a real shim never would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentd.shim_server import ShimServer
from shared import shim
from shared import shim_protocol as sp

PID = os.getpid()


def hello_line(pid: int = PID) -> bytes:
    return shim.encode(shim.hello_msg(pid, shim.GUARANTEED, 0, shim.Controls()))


HELLO = hello_line()


def step_line(n: int) -> bytes:
    return shim.encode(shim.step_msg(n, 0.01, None, None, None, False))


class Arrivals:
    """The server's event sink: wakes whoever waits for a shim's message."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()

    def __call__(self, key: str, msg: sp.FromShim) -> None:
        self.arrived.set()


@pytest.fixture
async def server() -> AsyncIterator[ShimServer]:
    socket_dir = Path(tempfile.mkdtemp(prefix="shim-"))  # a socket's path is short
    srv = ShimServer(socket_dir / "sockets", on_event=Arrivals())
    yield srv
    await srv.close()
    shutil.rmtree(socket_dir)


class Client:
    """A hand-driven shim."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: Path, hello: bool = True, pid: int = PID) -> Client:
        client = cls(*await asyncio.open_unix_connection(str(path)))
        if hello:
            await client.send(hello_line(pid))
            assert isinstance(await client.receive(), sp.Ready)
        return client

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self) -> sp.ToShim:
        return sp.decode_to_shim(await asyncio.wait_for(self.reader.readline(), 5))

    async def closed_by_server(self) -> bool:
        try:
            rest = await asyncio.wait_for(self.reader.read(), 5)
        except ConnectionError:
            return True
        return rest == b""

    def close(self) -> None:
        self.writer.close()


async def report_reaches(server: ShimServer, key: str, n: int) -> None:
    assert isinstance(server.on_event, Arrivals)
    async with asyncio.timeout(5):
        while (report := server.report(key)) is None or report.step != n:
            server.on_event.arrived.clear()
            await server.on_event.arrived.wait()


async def still_works(server: ShimServer, key: str, client: Client, n: int) -> None:
    server.set_limits(key, share=n)
    assert await client.receive() == sp.Limits(share=n)
    await client.send(step_line(n))
    await report_reaches(server, key, n)


async def test_the_socket_is_private_to_the_job(server: ShimServer) -> None:
    path = await server.open_job("j-1.1")
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await server.open_job("j-1.1") == path  # again after a restart: the same
    if os.geteuid() == 0:
        owned = await server.open_job("j-2.1", uid=4242, gid=4343)
        assert (owned.stat().st_uid, owned.stat().st_gid) == (4242, 4343)
        assert stat.S_IMODE(owned.stat().st_mode) == 0o600
    await server.close_job("j-1.1")
    assert not path.exists()


@pytest.mark.parametrize("key", ["", "../x", "a/b", ".hidden", "x" * 65])
async def test_a_key_that_is_not_a_plain_name_is_refused(server: ShimServer, key: str) -> None:
    with pytest.raises(ValueError):
        await server.open_job(key)


HOSTILE_FIRST_LINES = {
    "not json": b"{hello\n",
    "over the limit": b'{"type":"hello","pad":"' + b"x" * sp.MAX_LINE_BYTES + b'"}\n',
    "wrong types": HELLO.replace(b'"step":0', b'"step":"zero"'),
    "unknown type": b'{"type":"launch","argv":["sh"]}\n',
    "not a hello": step_line(1),
    "old protocol": HELLO.replace(b'"protocol":1', b'"protocol":0'),
}


async def test_hostile_clients_are_closed_and_nobody_else_notices(server: ShimServer) -> None:
    path_a = await server.open_job("j-a.1")
    path_b = await server.open_job("j-b.1")
    good_a = await Client.connect(path_a)
    good_b = await Client.connect(path_b)
    for what, line in HOSTILE_FIRST_LINES.items():
        hostile = await Client.connect(path_a, hello=False)
        with contextlib.suppress(ConnectionError):  # the server may close mid-line
            await hostile.send(line)
        assert await hostile.closed_by_server(), what
        hostile.close()
    # Clients that said a proper hello and then misbehave.
    path_c = await server.open_job("j-c.1")
    for bad in (b'{"type":"step","step":-1}\n', b"\xff\xfe\n", b"[]\n", HELLO):
        liar = await Client.connect(path_c)
        await liar.send(bad)
        assert await liar.closed_by_server(), bad
        liar.close()
        assert not server.connected("j-c.1")
    await still_works(server, "j-a.1", good_a, 40)
    await still_works(server, "j-b.1", good_b, 60)
    good_a.close()
    good_b.close()


async def test_a_reconnecting_shim_replaces_its_old_connection(server: ShimServer) -> None:
    path = await server.open_job("j-1.1")
    server.set_limits("j-1.1", share=30)
    first = await Client.connect(path, hello=False)
    await first.send(HELLO)
    assert await first.receive() == sp.Limits(share=30)
    assert isinstance(await first.receive(), sp.Ready)
    second = await Client.connect(path, hello=False)
    await second.send(HELLO)
    assert await second.receive() == sp.Limits(share=30)  # the controls again, for it
    assert await first.closed_by_server()
    assert isinstance(await second.receive(), sp.Ready)
    await still_works(server, "j-1.1", second, 70)
    first.close()
    second.close()


async def test_a_connection_that_says_nothing_is_not_the_jobs(server: ShimServer) -> None:
    path = await server.open_job("j-1.1")
    silent = await Client.connect(path, hello=False)
    await asyncio.sleep(0.05)
    assert not server.connected("j-1.1")
    server.suspend("j-1.1")  # kept for the shim that will say hello
    shim_ = await Client.connect(path, hello=False)
    await shim_.send(HELLO)
    assert await shim_.receive() == sp.Suspend()
    assert server.connected("j-1.1")
    silent.close()
    shim_.close()


async def test_each_process_of_a_job_gets_the_controls(server: ShimServer) -> None:
    path = await server.open_job("j-1.1")
    rank0 = await Client.connect(path, pid=1000)
    rank1 = await Client.connect(path, pid=1001)
    server.set_limits("j-1.1", share=50)
    assert await rank0.receive() == sp.Limits(share=50)
    assert await rank1.receive() == sp.Limits(share=50)
    rank0.close()
    server.suspend("j-1.1")
    assert await rank1.receive() == sp.Suspend()
    assert server.connected("j-1.1")
    rank1.close()


async def test_one_process_speaks_for_the_job(server: ShimServer) -> None:
    """A job of two ranks in step reports each step once: the first process connected
    speaks for it, and the next once it goes. A checkpoint's outcome counts from any."""
    seen: list[tuple[str, int]] = []

    class Recording(Arrivals):
        def __call__(self, key: str, msg: sp.FromShim) -> None:
            if isinstance(msg, sp.Step | sp.Suspended | sp.CheckpointFailed):
                seen.append((type(msg).__name__, msg.step))
            super().__call__(key, msg)

    server.on_event = arrivals = Recording()
    path = await server.open_job("j-1.1")
    rank0 = await Client.connect(path, pid=1000)
    rank1 = await Client.connect(path, pid=1001)
    assert server.reporter("j-1.1") == 1000
    await rank1.send(step_line(1))
    await rank1.send(shim.encode(shim.suspended_msg(1, None)))
    await rank0.send(step_line(1))
    await report_reaches(server, "j-1.1", 1)
    await rank1.send(step_line(2))
    await rank1.send(shim.encode(shim.checkpoint_failed_msg(2, "disk full")))
    async with asyncio.timeout(5):
        while ("CheckpointFailed", 2) not in seen:
            arrivals.arrived.clear()
            await arrivals.arrived.wait()
    assert seen == [("Step", 1), ("CheckpointFailed", 2)]
    assert server.report("j-1.1") == sp.decode_from_shim(step_line(1))
    rank0.close()  # rank 1 speaks for the job now
    async with asyncio.timeout(5):
        while server.reporter("j-1.1") != 1001:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await rank1.send(step_line(3))
    await report_reaches(server, "j-1.1", 3)
    assert seen[-1] == ("Step", 3)
    rank1.close()
