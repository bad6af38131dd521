"""Where the stager's inputs come from: parsing them, and copying one into a directory.

An input is an absolute local path, a `file://` URL (a file or a directory tree) or an
`http(s)://` URL; any other scheme is refused. Copies count their bytes into a `Counter`
that the event loop reads for progress reports.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import aiohttp
import yarl

from agentd.stage_cache import is_plain_name

CHUNK = 1 << 20
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class StageError(Exception):
    """An input could not be staged; `reason` is for the job's owner to read."""

    def __init__(self, input: str, reason: str) -> None:
        super().__init__(f"{input}: {reason}" if input else reason)
        self.input = input
        self.reason = reason


@dataclass(frozen=True)
class Source:
    """An input as parsed, before any I/O: `url` for http(s), else `path`."""

    raw: str
    item: str  # the base name the job sees in the cache
    url: str | None = None
    path: Path | None = None


class Counter(Protocol):
    """Where a copy counts its bytes (written by a thread, read by the loop) and learns
    that it should stop."""

    bytes_done: int
    bytes_total: int | None
    stop: bool


class _Stopped(Exception):
    """A copy thread noticed that its transfer was cancelled."""


def parse_input(raw: str) -> Source:
    if not _SCHEME.match(raw):
        return _local(raw, raw)
    try:
        url = yarl.URL(raw)
    except ValueError as exc:
        raise StageError(raw, f"bad URL: {exc}") from None
    scheme = url.scheme.lower()
    if scheme == "file":
        if url.host not in (None, "", "localhost"):
            raise StageError(raw, "bad URL: a file:// URL must name a local path")
        return _local(raw, url.path)
    if scheme not in ("http", "https"):
        raise StageError(raw, f"unsupported URL scheme {scheme!r}: use http, https or file")
    if not url.host:
        raise StageError(raw, "bad URL: no host")
    # yarl lowercases the host, drops a default port and resolves dot segments.
    return Source(raw, _item(url.path), url=str(url.with_fragment(None)))


def _local(raw: str, path: str) -> Source:
    if not path.startswith("/"):
        raise StageError(raw, "a local path must be absolute")
    return Source(raw, _item(path), path=Path(os.path.normpath(path)))


def _item(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1][:200]
    return name if is_plain_name(name) else "input"


def fingerprint(path: Path) -> tuple[str, str, int]:
    """(key, real path, size) of a local input, from its sizes and modification times.
    Blocking: a directory is walked."""
    real = path.resolve(strict=True)
    st = real.stat()
    if stat.S_ISREG(st.st_mode):
        return f"file:{real}:{st.st_size}:{st.st_mtime_ns}", str(real), st.st_size
    if not stat.S_ISDIR(st.st_mode):
        raise StageError(str(path), "not a regular file or directory")
    digest, total = hashlib.sha256(), 0
    for top, dirs, files in os.walk(real):
        dirs.sort()
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in sorted(files + links):
            lst = os.lstat(os.path.join(top, name))
            rel = os.path.relpath(os.path.join(top, name), real)
            digest.update(f"{rel}\0{lst.st_size}\0{lst.st_mtime_ns}\0".encode())
            total += lst.st_size if stat.S_ISREG(lst.st_mode) else 0
    return f"dir:{real}:{digest.hexdigest()}", str(real), total


def copy_local(src: Path, dest: Path, key: str, counter: Counter) -> None:
    """Copies a file or a tree (symlinks inside a tree stay links) and checks that the
    source still has the fingerprint `key`. Blocking."""

    def copy_file(src_file: str, dst_file: str) -> None:
        with open(src_file, "rb") as fin, open(dst_file, "wb") as fout:
            while chunk := fin.read(CHUNK):
                if counter.stop:
                    raise _Stopped
                fout.write(chunk)
                counter.bytes_done += len(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        shutil.copymode(src_file, dst_file)

    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, copy_function=copy_file)
    else:
        copy_file(str(src), str(dest))
    if fingerprint(src)[0] != key:
        raise StageError(str(src), "changed while it was being copied")


async def download(
    session: aiohttp.ClientSession,
    url: str,
    dest: Path,
    counter: Counter,
    *,
    timeout_s: float,
    make_room: Callable[[int, int], None],
    progress: Callable[[], None],
) -> None:
    """Streams `url` into `dest`. `make_room(n, total)` reserves n more bytes for a body
    that reaches `total` bytes with them (or raises); `progress()` after each chunk."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(30.0, timeout_s))
    # Identity encoding: the length must count the bytes written, not compressed ones.
    headers = {"Accept-Encoding": "identity"}
    try:
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                raise StageError(url, f"HTTP {resp.status} {resp.reason or ''}".rstrip())
            counter.bytes_total = resp.content_length
            if counter.bytes_total is not None:
                make_room(counter.bytes_total, counter.bytes_total)
            out = await asyncio.to_thread(open, dest, "wb")
            try:
                await _write_body(resp, out, counter, make_room, progress)
            finally:
                out.close()
    except aiohttp.ClientConnectorError as exc:
        reason = _connect_reason(exc.os_error)
        raise StageError(url, f"cannot connect to {exc.host}:{exc.port}: {reason}") from None
    except aiohttp.ClientPayloadError:
        raise StageError(url, _truncated(counter)) from None
    except TimeoutError:
        raise StageError(url, f"timed out after {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise StageError(url, f"HTTP error: {type(exc).__name__}: {exc}") from None
    if counter.bytes_total is not None and counter.bytes_done != counter.bytes_total:
        raise StageError(url, _truncated(counter))
    counter.bytes_total = counter.bytes_done


async def _write_body(
    resp: aiohttp.ClientResponse,
    out: BinaryIO,
    counter: Counter,
    make_room: Callable[[int, int], None],
    progress: Callable[[], None],
) -> None:
    buf = bytearray()  # written in big pieces: one thread hop per CHUNK, not per packet
    async for chunk in resp.content.iter_chunked(CHUNK):
        if counter.bytes_total is None:  # no length given: room is taken as it comes
            make_room(len(chunk), counter.bytes_done + len(chunk))
        buf += chunk
        counter.bytes_done += len(chunk)
        if len(buf) >= CHUNK:
            await asyncio.to_thread(out.write, bytes(buf))
            buf.clear()
        progress()
    await asyncio.to_thread(_write_and_sync, out, bytes(buf))


def _write_and_sync(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()
    os.fsync(out.fileno())


def _truncated(counter: Counter) -> str:
    total = "an unknown number of" if counter.bytes_total is None else counter.bytes_total
    return f"download truncated: connection closed after {counter.bytes_done} of {total} bytes"


def _connect_reason(exc: OSError) -> str:
    # asyncio words a refusal "Connect call failed (...)": the errno says it plainly.
    plain = isinstance(exc, ConnectionError) or type(exc) is OSError
    if plain and exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno).lower()
    return exc.strerror or str(exc)


def os_reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        # copytree goes on past a failed file and lists them all: name the first.
        failures = exc.args[0]
        src, _, why = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return f"cannot copy {src}: {why}{more}"
    return exc.strerror or str(exc)
