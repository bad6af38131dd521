"""The stager against real files and a real local HTTP server that counts its requests."""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentd.stager import StageError, StageProgress, Stager


class Files:
    """What the server serves, and how often each name was asked for."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.requests: Counter[str] = Counter()
        self.gate: asyncio.Event | None = None  # when set, bodies wait for it
        self.entered = asyncio.Event()  # a request reached the gate
        self.server: TestServer | None = None

    def url(self, name: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(f"/files/{name}"))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests[name] += 1
        if name not in self.bodies:
            raise web.HTTPNotFound()
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        return web.Response(body=self.bodies[name])

    async def handle_streamed(self, request: web.Request) -> web.StreamResponse:
        """64 pieces of 16 KiB, each written on its own; `?chunked` gives no length."""
        self.requests["streamed"] += 1
        resp = web.StreamResponse()
        if "chunked" not in request.query:
            resp.content_length = 64 * 16384
        await resp.prepare(request)
        for i in range(64):
            await resp.write(bytes([i]) * 16384)
        return resp


@pytest.fixture
async def files() -> AsyncIterator[Files]:
    f = Files()
    app = web.Application()
    app.router.add_get("/files/{name}", f.handle)
    app.router.add_get("/streamed", f.handle_streamed)
    f.server = TestServer(app, host="127.0.0.1")
    await f.server.start_server()
    yield f
    await f.server.close()


class Reports:
    def __init__(self) -> None:
        self.items: list[StageProgress] = []
        self.arrived = asyncio.Event()

    def __call__(self, report: StageProgress) -> None:
        self.items.append(report)
        self.arrived.set()

    def of(self, job_key: str) -> list[StageProgress]:
        return [r for r in self.items if r.job_key == job_key]

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def reports() -> Reports:
    return Reports()


@pytest.fixture
async def stager(tmp_path: Path, reports: Reports) -> AsyncIterator[Stager]:
    s = Stager(tmp_path / "cache", 10 << 20, reports)
    yield s
    await s.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_two_jobs_share_one_download(stager: Stager, files: Files, reports: Reports) -> None:
    files.bodies["model.bin"] = b"weights" * 1000
    files.gate = asyncio.Event()
    url = files.url("model.bin")
    a = asyncio.create_task(stager.stage("a", [url]))
    b = asyncio.create_task(stager.stage("b", [url]))
    # Both jobs are waiting on the transfer before the body is sent.
    await reports.until(lambda: bool(reports.of("a")) and bool(reports.of("b")))
    files.gate.set()
    (path_a,), (path_b,) = await asyncio.gather(a, b)
    assert files.requests["model.bin"] == 1
    assert path_a == path_b
    assert path_a.read_bytes() == files.bodies["model.bin"]
    assert path_a.name == "model.bin"
    assert reports.of("a")[-1].done and reports.of("b")[-1].done


async def test_a_later_job_reuses_the_cache(stager: Stager, files: Files, reports: Reports) -> None:
    files.bodies["data.csv"] = b"1,2,3\n"
    (first,) = await stager.stage("a", [files.url("data.csv")])
    stager.release("a")
    (again,) = await stager.stage("b", [files.url("data.csv")])
    assert files.requests["data.csv"] == 1
    assert again == first
    assert [(r.done, r.bytes_done) for r in reports.of("b")] == [(True, 6)]


async def test_prefetch_and_launch_share_the_work(stager: Stager, files: Files) -> None:
    files.bodies["x"] = b"x" * 5000
    stager.prefetch("a", [files.url("x")])
    (path,) = await stager.stage("a", [files.url("x")])
    assert files.requests["x"] == 1
    assert path.read_bytes() == files.bodies["x"]


async def test_a_local_directory_is_copied(stager: Stager, tmp_path: Path) -> None:
    src = tmp_path / "dataset"
    (src / "train").mkdir(parents=True)
    (src / "train" / "part-0").write_bytes(b"a" * 300)
    (src / "labels.txt").write_text("cat\ndog\n")
    (src / "latest").symlink_to("train/part-0")
    (path,) = await stager.stage("a", [f"file://{src}"])
    assert path.is_dir() and path != src and path.name == "dataset"
    assert (path / "train" / "part-0").read_bytes() == b"a" * 300
    assert (path / "labels.txt").read_text() == "cat\ndog\n"
    assert os.readlink(path / "latest") == "train/part-0"
    assert stager.cache.used_bytes == 300 + 8


async def test_a_changed_local_file_is_copied_again(stager: Stager, tmp_path: Path) -> None:
    src = tmp_path / "config.json"
    src.write_text('{"lr": 0.1}')
    (old,) = await stager.stage("a", [str(src)])
    (same,) = await stager.stage("b", [str(src)])
    assert same == old
    stager.release("a")
    stager.release("b")
    src.write_text('{"lr": 0.01}')
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    (new,) = await stager.stage("c", [str(src)])
    assert new != old
    assert new.read_text() == '{"lr": 0.01}'
    assert not old.exists()  # the unpinned old version made way at once
    assert len(stager.cache.entries) == 1


async def test_a_missing_url_fails_with_the_status(
    stager: Stager, files: Files, reports: Reports
) -> None:
    url = files.url("nope.bin")
    with pytest.raises(StageError) as caught:
        await stager.stage("a", [url])
    assert caught.value.input == url
    assert "HTTP 404" in str(caught.value) and url in str(caught.value)
    assert reports.of("a")[-1].done and reports.of("a")[-1].error == "HTTP 404 Not Found"
    assert not stager.cache.entries


async def test_a_refused_port_fails_with_the_reason(stager: Stager) -> None:
    url = f"http://127.0.0.1:{free_port()}/weights.bin"
    with pytest.raises(StageError) as caught:
        await stager.stage("a", [url])
    assert str(caught.value).startswith(url + ": ")
    assert "connection refused" in caught.value.reason


async def test_the_job_fails_with_the_reason_of_its_bad_input(
    stager: Stager, files: Files, tmp_path: Path
) -> None:
    files.bodies["ok"] = b"fine"
    inputs = [files.url("ok"), f"{tmp_path}/missing.npz", "ftp://example.com/x"]
    with pytest.raises(StageError) as caught:
        await stager.stage("a", inputs)
    # One of the two bad inputs, named, with its own reason.
    assert (caught.value.input, caught.value.reason) in {
        (inputs[1], "file not found"),
        (inputs[2], "unsupported URL scheme 'ftp': use http, https or file"),
    }


async def test_an_input_larger_than_the_cache_fails(
    tmp_path: Path, files: Files, reports: Reports
) -> None:
    stager = Stager(tmp_path / "cache", 1000, reports)
    files.bodies["big"] = b"b" * 1001
    big_file = tmp_path / "big.bin"
    big_file.write_bytes(b"b" * 1001)
    try:
        for raw in (files.url("big"), str(big_file)):
            with pytest.raises(StageError, match="larger than the whole cache"):
                await stager.stage(raw, [raw])
        assert not stager.cache.entries and stager.cache.reserved_bytes == 0
    finally:
        await stager.close()


async def test_lru_evicts_the_least_recently_used_and_never_a_pinned_entry(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path / "cache", 300)
    src = {}
    for name in "abcdef":
        src[name] = tmp_path / name
        src[name].write_bytes(name.encode() * 100)

    async def stage(job: str, name: str) -> Path:
        (path,) = await stager.stage(job, [str(src[name])])
        return path

    try:
        a, b, c = await stage("j1", "a"), await stage("j2", "b"), await stage("j3", "c")
        stager.release("j1")
        stager.release("j2")
        assert await stage("j4", "a") == a  # a is now used more recently than b
        stager.release("j4")
        d = await stage("j5", "d")
        assert not b.exists() and a.exists() and c.exists() and d.exists()
        e = await stage("j6", "e")
        assert not a.exists() and c.exists() and d.exists() and e.exists()
        # Only pinned entries are left: c (j3), d (j5), e (j6).
        with pytest.raises(StageError, match="cache full"):
            await stage("j7", "f")
        assert c.read_bytes() == b"c" * 100
        stager.release("j3")
        f = await stage("j8", "f")
        assert f.exists() and not c.exists()
    finally:
        await stager.close()


async def raw_server(response: bytes) -> tuple[asyncio.Server, str]:
    """A server that answers every request with `response` and then hangs up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/shard.tar"


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 400,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n" + b"x" * 100,
    ],
    ids=["short-body", "cut-chunk"],
)
async def test_a_truncated_download_leaves_no_entry(
    stager: Stager, tmp_path: Path, response: bytes
) -> None:
    server, url = await raw_server(response)
    try:
        with pytest.raises(StageError, match="truncated") as caught:
            await stager.stage("a", [url])
    finally:
        server.close()
    assert caught.value.input == url
    await stager.close()  # lets the deletion of the temp file finish
    assert not stager.cache.entries
    assert list((tmp_path / "cache" / "data").iterdir()) == []
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


async def test_a_restarted_stager_finds_its_entries_and_drops_leftovers(
    tmp_path: Path, files: Files
) -> None:
    files.bodies["w.pt"] = b"w" * 4096
    local = tmp_path / "vocab.txt"
    local.write_text("a b c")
    first = Stager(tmp_path / "cache", 1 << 20)
    (remote_path, local_path) = await first.stage("running", [files.url("w.pt"), str(local)])
    await first.close()
    # What a crash in the middle of a transfer, or of a rename, leaves behind.
    (tmp_path / "cache" / "tmp" / "0123abcd.part").mkdir()
    (tmp_path / "cache" / "tmp" / "0123abcd.part" / "w.pt").write_bytes(b"half")
    (tmp_path / "cache" / "data" / ("f" * 32)).mkdir()

    second = Stager(tmp_path / "cache", 1 << 20)
    try:
        await second.start()
        assert list((tmp_path / "cache" / "tmp").iterdir()) == []
        assert not (tmp_path / "cache" / "data" / ("f" * 32)).exists()
        assert second.pinned_jobs() == {"running"}
        paths = await second.stage("next", [files.url("w.pt"), str(local)])
        assert paths == [remote_path, local_path]
        assert files.requests["w.pt"] == 1
        assert second.cache.used_bytes == 4096 + 5
    finally:
        await second.close()


async def test_progress_is_reported_at_a_modest_rate_and_ends_done(
    tmp_path: Path, files: Files, reports: Reports
) -> None:
    # An interval this long leaves only the tenths to trigger a report.
    stager = Stager(tmp_path / "cache", 10 << 20, reports, progress_interval_s=3600)
    assert files.server is not None
    url = str(files.server.make_url("/streamed"))
    try:
        await stager.stage("a", [url])
    finally:
        await stager.close()
    mine = reports.of("a")
    total = 64 * 16384
    assert 2 <= len(mine) <= 13  # first report, at most one per tenth, the final one
    assert not mine[0].done and mine[0].bytes_done == 0
    assert mine[-1] == StageProgress("a", url, total, total, True, None)
    assert all(r.bytes_total == total for r in mine[1:])
    done = [r.bytes_done for r in mine]
    assert done == sorted(done)


async def test_releasing_the_only_job_stops_its_transfer(
    stager: Stager, files: Files, reports: Reports
) -> None:
    files.bodies["huge"] = b"h" * 1000
    files.gate = asyncio.Event()
    stager.prefetch("a", [files.url("huge")])
    await asyncio.wait_for(files.entered.wait(), 10)
    waiting = asyncio.create_task(stager.stage("a", [files.url("huge")]))
    await asyncio.sleep(0)
    stager.release("a")
    with pytest.raises(StageError, match="released"):
        await waiting
    files.gate.set()
    # Had the first transfer gone on, this job would have joined it or found its entry.
    (path,) = await stager.stage("b", [files.url("huge")])
    assert files.requests["huge"] == 2
    assert path.read_bytes() == files.bodies["huge"]
    assert stager.pinned_jobs() == {"b"}


async def test_a_download_without_a_length_takes_room_as_it_comes(
    tmp_path: Path, files: Files
) -> None:
    assert files.server is not None
    url = str(files.server.make_url("/streamed").with_query("chunked"))
    roomy = Stager(tmp_path / "roomy", 2 << 20)
    small = Stager(tmp_path / "small", 100_000)
    try:
        (path,) = await roomy.stage("a", [url])
        assert path.stat().st_size == 64 * 16384 == roomy.cache.used_bytes
        with pytest.raises(StageError, match=r"larger than the whole cache \(more than 100000"):
            await small.stage("a", [url])
        assert not small.cache.entries and small.cache.reserved_bytes == 0
    finally:
        await roomy.close()
        await small.close()
