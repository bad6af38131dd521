"""What both benchmarks share: a real schedd subprocess on a fresh database, and figures.

`running_schedd()` writes a schedd.toml (log_level = "warning"), starts `schedd` as a
subprocess on a free loopback port, waits for /healthz, creates an API token with
`schedctl token create`, and on the way out (also on an error or Ctrl-C) stops schedd,
stops an embedded PostgreSQL that schedd could not stop itself, drops the benchmark's
schema on an external server and removes the temporary directory.

The database is the external server named by a DSN (a fresh schema, `?search_path=`),
or, with no DSN, the embedded PostgreSQL that schedd starts in its own data_dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp
import asyncpg
from _version import code_version

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
LOG_LEVEL = "warning"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def default_dsn() -> str:
    return os.environ.get("GPUSCHED_DSN", "")


def dsn_help() -> str:
    return "PostgreSQL DSN (default: $GPUSCHED_DSN; empty or 'embedded': schedd's embedded server)"


def _bin(name: str) -> str:
    found = VENV_BIN / name
    return str(found) if found.exists() else (shutil.which(name) or name)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_search_path(dsn: str, schema: str) -> str:
    """The DSN with `search_path` set (asyncpg passes unknown query keys to the server)."""
    parts = urlsplit(dsn)
    extra = urlencode({"search_path": schema})
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=query))


def redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return dsn


@dataclass
class Schedd:
    url: str
    ws_url: str
    token: str
    join_token: str
    db_dsn: str  # where the jobs table is, for checks
    database: str  # "embedded" or "external <dsn>"
    pg_version: str
    pid: int
    config_path: Path
    log_path: Path
    background_pct: float | None  # machine busy before schedd started (other work on it)
    cpu: CpuMeter = field(init=False)

    def __post_init__(self) -> None:
        self.cpu = CpuMeter(self.pid)


async def _wait_healthy(url: str, proc: asyncio.subprocess.Process, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(
                    f"schedd exited with {proc.returncode} at start:\n{_tail(log_path)}"
                )
            try:
                async with session.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"schedd not healthy after {START_TIMEOUT_S:g}s:\n{_tail(log_path)}"
                )
            await asyncio.sleep(0.1)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def _stop_embedded(data_dir: Path) -> None:
    """Stop the embedded server if schedd left it running (it was killed, or crashed)."""
    from schedd.store import embedded

    pgdata = data_dir / "postgres"
    if pgdata.exists() and embedded._is_running(pgdata):
        embedded.EmbeddedPostgres(pgdata=pgdata, dsn="", started_here=True).stop()


@contextlib.asynccontextmanager
async def running_schedd(dsn: str, *, wrap: Sequence[str] = ()) -> AsyncIterator[Schedd]:
    """A schedd subprocess on a fresh database; everything is removed on the way out.

    `wrap` is a command prefix for schedd (e.g. a profiler); it must exec schedd.main.
    """
    external = bool(dsn) and dsn != "embedded"
    tmp = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    os.chmod(tmp, 0o755)  # the embedded server runs as its own user when we are root
    data_dir = tmp / "data"
    schema = "bench_" + secrets.token_hex(6)
    proc: asyncio.subprocess.Process | None = None
    schema_made = False
    try:
        background = await _background_load()
        env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_DSN"}
        if external:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f"CREATE SCHEMA {schema}")
                schema_made = True
            finally:
                await conn.close()
            env["GPUSCHED_DSN"] = with_search_path(dsn, schema)
        port = free_port()
        join_token = "jt-" + secrets.token_hex(16)
        lines = [
            'listen_host = "127.0.0.1"',
            f"listen_port = {port}",
            f'data_dir = "{data_dir}"',
            f'join_token = "{join_token}"',
            f'log_level = "{LOG_LEVEL}"',
        ]
        config_path = tmp / "schedd.toml"
        config_path.write_text("\n".join(lines) + "\n")
        log_path = tmp / "schedd.log"
        cmd = [*wrap, "-m", "schedd.main"] if wrap else [_bin("schedd")]
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                "--config",
                str(config_path),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        url = f"http://127.0.0.1:{port}"
        await _wait_healthy(url, proc, log_path)
        # After schedd is up, so that an embedded server is reused (and left running).
        made = await asyncio.to_thread(
            subprocess.run,
            [_bin("schedctl"), "token", "create", "bench", "--config", str(config_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if made.returncode != 0:
            raise RuntimeError(f"schedctl token create failed: {made.stderr.strip()}")
        token = made.stdout.strip().splitlines()[-1]
        if external:
            db_dsn, database = env["GPUSCHED_DSN"], f"external ({redact(dsn)})"
        else:
            from schedd.store import embedded
            from shared import logging

            logging.configure("bench", "warning", sys.stderr)
            pg = await asyncio.to_thread(embedded.start, data_dir)
            db_dsn, database = pg.dsn, "embedded (in schedd's data_dir)"
        conn = await asyncpg.connect(db_dsn)
        try:
            pg_version = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        yield Schedd(
            url=url,
            ws_url=f"ws://127.0.0.1:{port}/v1/agents/ws",
            token=token,
            join_token=join_token,
            db_dsn=db_dsn,
            database=database,
            pg_version=str(pg_version).split(" ")[0],
            pid=proc.pid,
            background_pct=background,
            config_path=config_path,
            log_path=log_path,
        )
    except Exception:
        if proc is not None:
            print(f"schedd log, last lines:\n{_tail(log_path, 40)}", file=sys.stderr)
        raise
    finally:
        if proc is not None:
            await _stop(proc)
            problems = [
                line
                for line in _tail(log_path, 200).splitlines()
                if '"level":"error"' in line or "Traceback" in line
            ]
            if problems:
                print(f"note: schedd logged {len(problems)} error(s); its log ends with:")
                print(_tail(log_path, 8))
        if not external:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_stop_embedded, data_dir)
        if schema_made:
            try:
                conn = await asyncpg.connect(dsn)
                try:
                    await conn.execute(f"DROP SCHEMA {schema} CASCADE")
                finally:
                    await conn.close()
            except Exception as exc:
                print(f"warning: could not drop schema {schema}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


# ---- figures -------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[str, int, float]]:
    """pid -> (command name, parent pid, CPU seconds used so far) for every process."""
    found: dict[int, tuple[str, int, float]] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return found
    for name in entries:
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        found[int(name)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return found


def _machine_times() -> tuple[float, float] | None:
    """(CPU seconds all cores spent busy, seconds the hypervisor stole from them) since boot."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    values = [float(v) for v in first[:8]]
    busy = sum(values[:3]) + values[5] + values[6]
    return busy / _TICKS, values[7] / _TICKS


def _schedstat(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of a process's main thread."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


@dataclass
class CpuUse:
    """CPU used during a measurement, as % of one core: 100 = one core busy all along."""

    wall_s: float
    groups: dict[str, float]  # schedd, client, postgres, other
    machine_pct: float | None  # of all cores: 100 = every core busy all along
    # % of one core that the hypervisor gave to someone else (this machine is a VM)
    steal_pct: float | None = None
    # schedd's event-loop thread: % of the time running, and runnable but waiting for a core
    loop_running_pct: float | None = None
    loop_waiting_pct: float | None = None

    def describe(self) -> str:
        if not self.groups:
            return "cpu use unknown (no /proc)"
        parts = ", ".join(f"{name} {pct:.0f}%" for name, pct in self.groups.items())
        machine = f"{self.machine_pct:.0f}%" if self.machine_pct is not None else "?"
        steal = f"{self.steal_pct:.0f}%" if self.steal_pct is not None else "?"
        text = (
            f"cpu, % of one core: {parts}, stolen by the hypervisor {steal}; "
            f"machine busy {machine} of all {os.cpu_count()} cores"
        )
        if self.loop_running_pct is not None and self.loop_waiting_pct is not None:
            text += (
                f"; schedd's event loop ran {self.loop_running_pct:.0f}% of the time and "
                f"waited for a free core {self.loop_waiting_pct:.0f}%"
            )
        return text


class CpuMeter:
    """CPU used between start() and stop() by schedd, by the benchmark's client side (this
    process and its children), by every process named postgres (on an external server that
    includes other sessions' work), and by everything else on the machine."""

    def __init__(self, schedd_pid: int) -> None:
        self.schedd_pid = schedd_pid
        self._t0 = 0.0
        self._procs: dict[int, tuple[str, int, float]] = {}
        self._busy0: tuple[float, float] | None = None
        self._sched0: tuple[float, float] | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._procs = _processes()
        self._busy0 = _machine_times()
        self._sched0 = _schedstat(self.schedd_pid)

    def _group(self, pid: int, procs: dict[int, tuple[str, int, float]]) -> str:
        if procs[pid][0] == "postgres":
            return "postgres"
        me, seen = os.getpid(), 0
        while pid in procs and seen < 64:
            if pid == self.schedd_pid:
                return "schedd"
            if pid == me:
                return "client"
            pid, seen = procs[pid][1], seen + 1
        return "other"

    def stop(self) -> CpuUse:
        wall = time.perf_counter() - self._t0
        procs, busy1, sched1 = _processes(), _machine_times(), _schedstat(self.schedd_pid)
        used = {"schedd": 0.0, "client": 0.0, "postgres": 0.0}
        for pid, (comm, _, cpu) in procs.items():
            before = self._procs.get(pid)
            delta = cpu - before[2] if before is not None and before[0] == comm else cpu
            group = self._group(pid, procs)
            if group != "other":
                used[group] += delta
        machine_pct = steal_pct = None
        if procs and self._busy0 is not None and busy1 is not None and wall > 0:
            busy = busy1[0] - self._busy0[0]
            used["other"] = max(0.0, busy - sum(used.values()))
            machine_pct = 100 * busy / wall / (os.cpu_count() or 1)
            steal_pct = 100 * (busy1[1] - self._busy0[1]) / wall
        groups = {k: 100 * v / wall for k, v in used.items()} if procs and wall > 0 else {}
        use = CpuUse(wall, groups, machine_pct, steal_pct)
        if self._sched0 is not None and sched1 is not None and wall > 0:
            use.loop_running_pct = 100 * (sched1[0] - self._sched0[0]) / wall
            use.loop_waiting_pct = 100 * (sched1[1] - self._sched0[1]) / wall
        return use


async def _background_load(seconds: float = 1.0) -> float | None:
    busy0, t0 = _machine_times(), time.perf_counter()
    await asyncio.sleep(seconds)
    busy1, wall = _machine_times(), time.perf_counter() - t0
    if busy0 is None or busy1 is None:
        return None
    return 100 * (busy1[0] - busy0[0]) / wall / (os.cpu_count() or 1)


def conditions(schedd: Schedd) -> list[str]:
    background = (
        f"{schedd.background_pct:.0f}% of all cores busy in the second before schedd started"
        if schedd.background_pct is not None
        else "unknown"
    )
    return [
        f"code: commit {code_version()}",
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Linux {platform.release()}",
        f"python: {platform.python_version()} (schedd and benchmark client)",
        f"postgresql: {schedd.pg_version}, {schedd.database}",
        f'schedd: one process, uvloop, log_level = "{LOG_LEVEL}", policy fifo, '
        "db_pool_size 10 (default)",
        f"background load: {background}",
    ]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(str(h).rjust(w) for h, w in zip(header, widths, strict=True))]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def install_sigterm(task: asyncio.Task[object]) -> None:
    """SIGTERM cancels the benchmark like Ctrl-C does, so that clean-up still runs."""
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
