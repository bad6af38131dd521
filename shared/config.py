"""Configuration of both daemons: TOML files decoded into typed structs.

Unknown keys are refused so that a typo in a config file is an error at start-up,
not a silently ignored setting. `GPUSCHED_DSN` in the environment overrides `dsn`.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta


class ConfigError(Exception):
    pass


Port = Annotated[int, Meta(ge=0, le=65535)]
Seconds = Annotated[float, Meta(gt=0)]


class SchedConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    listen_host: str = "127.0.0.1"
    listen_port: Port = 8080
    # PostgreSQL DSN; with none, schedd runs an embedded PostgreSQL in data_dir/postgres.
    dsn: str | None = None
    data_dir: str = "/var/lib/gpusched"
    # Agents present this token on the websocket. One of the two is required.
    join_token: str | None = None
    join_token_file: str | None = None
    policy: str = "fifo"
    kill_grace_s: Seconds = 10.0
    # A node gone this long has its jobs requeued (they are killed if it comes back).
    node_lost_after_s: Seconds = 300.0
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 1024 * 1024
    db_pool_size: Annotated[int, Meta(ge=2, le=200)] = 10
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def resolved_dsn(self) -> str | None:
        return os.environ.get("GPUSCHED_DSN") or self.dsn

    def resolved_join_token(self) -> str:
        return _token(self.join_token, self.join_token_file)


class SimulatedGpus(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    count: Annotated[int, Meta(ge=0, le=64)] = 4
    model: str = "Simulated-A100-80GB"
    memory_mib: Annotated[int, Meta(gt=0)] = 81920


class AgentConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    schedd_url: str = "http://127.0.0.1:8080"
    join_token: str | None = None
    join_token_file: str | None = None
    node_id: str = ""
    state_dir: str = "/var/lib/gpusched-agent"
    # Topology labels, e.g. rack and domain, used by placement.
    labels: dict[str, str] = {}
    gpu_backend: Literal["auto", "nvml", "simulated"] = "auto"
    simulated: SimulatedGpus = msgspec.field(default_factory=SimulatedGpus)
    # Resources offered to jobs; 0 means "what the machine has".
    cpus: Annotated[float, Meta(ge=0)] = 0
    memory_mib: Annotated[int, Meta(ge=0)] = 0
    # A GPU sample is pushed only when utilisation moved this many points, or memory this much.
    gpu_util_threshold_pct: Annotated[int, Meta(ge=1, le=100)] = 10
    gpu_memory_threshold_mib: Annotated[int, Meta(ge=1)] = 512
    gpu_sample_interval_s: Seconds = 1.0
    reconnect_max_s: Seconds = 30.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def resolved_node_id(self) -> str:
        return self.node_id or socket.gethostname()

    def resolved_join_token(self) -> str:
        return _token(self.join_token, self.join_token_file)

    def websocket_url(self) -> str:
        base = self.schedd_url.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base.removeprefix("https://")
        elif base.startswith("http://"):
            base = "ws://" + base.removeprefix("http://")
        return base + "/v1/agents/ws"


def _token(value: str | None, path: str | None) -> str:
    if value:
        return value
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"join_token_file: cannot read {path}: {exc.strerror}") from None
        if token:
            return token
        raise ConfigError(f"join_token_file: {path} is empty")
    raise ConfigError("join_token or join_token_file is required")


C = TypeVar("C", SchedConfig, AgentConfig)


def load(kind: type[C], path: str | None) -> C:
    """Load a config file (or the defaults when path is None)."""
    if path is None:
        return kind()
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
