"""Configuration of both daemons: TOML files decoded into typed structs.

Unknown keys are refused so that a typo in a config file is an error at start-up,
not a silently ignored setting. `GPUSCHED_DSN` in the environment overrides `dsn`.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from shared.shim import CHECKPOINT_KEEP


class ConfigError(Exception):
    pass


Port = Annotated[int, Meta(ge=0, le=65535)]
Seconds = Annotated[float, Meta(gt=0)]
Count = Annotated[int, Meta(ge=0)]
Amount = Annotated[float, Meta(ge=0)]
# The job spec's queue names (shared/model.py QueueName): "org" or "org/team".
QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)*$")


class QueueConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One `[queues."org/team"]` table: what the queue is guaranteed and may borrow up to.

    A max left out is unbounded in that dimension; a guarantee left out is 0.
    """

    guarantee_gpus: Count
    guarantee_cpus: Amount = 0.0
    guarantee_memory_mib: Count = 0
    guarantee_gpu_memory_mib: Count = 0
    max_gpus: Count | None = None
    max_cpus: Amount | None = None
    max_memory_mib: Count | None = None
    max_gpu_memory_mib: Count | None = None
    weight: Annotated[float, Meta(gt=0)] = 1.0
    user_limit_factor: Annotated[float, Meta(gt=0)] | None = None


class ProfileConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One `[profiles.NAME]` table: plugin names per stage (checked against the policy).

    For a built-in profile, what is set here replaces the built-in's value and the rest
    stays; `settings` entries replace single settings. `tick_s = 0` plans on events only.
    """

    order: str | None = None
    place: str | None = None
    admit: list[str] | None = None
    make_room: list[str] | None = None
    decide: list[str] | None = None
    anticipate: list[str] | None = None
    blocking: str | None = None
    pending_window: int | None = None
    tick_s: float | None = None
    estimates: str | None = None
    settings: dict[str, Any] = {}


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
    # Past use weighs half as much after this long (fair shares count decayed history).
    usage_half_life_s: Seconds = 86400.0
    kill_grace_s: Seconds = 10.0
    # A preempted job whose shim can save a checkpoint is first asked to save at its next
    # mini-batch and exit, and gets SIGTERM only if it has not within this long; it then
    # resumes from that checkpoint. 0: SIGTERM at once, as for any other job.
    preempt_checkpoint_s: Annotated[float, Meta(ge=0)] = 60.0
    # The resource estimator is trained on succeeded jobs this often (when jobs have
    # finished since); 0 turns it off (run times then come from specs and history).
    estimator_retrain_s: Annotated[float, Meta(ge=0)] = 300.0
    # A GPU's utilisation and memory used, as policies see them, are its highest over
    # this many seconds (a GPU that stayed below a mark that long may take a sharer).
    gpu_window_s: Seconds = 300.0
    # A node gone this long has its jobs requeued (they are killed if it comes back).
    node_lost_after_s: Seconds = 300.0
    # XID errors that come from a job's own code or from killing it, not from the GPU:
    # logged only. Any other takes the GPU out of placement until an admin clears it.
    # The application XIDs NVIDIA's Kubernetes device plugin skips too.
    gpu_fault_ignore_xids: frozenset[Annotated[int, Meta(ge=0)]] = frozenset({13, 31, 43, 45, 68})
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 1024 * 1024
    db_pool_size: Annotated[int, Meta(ge=2, le=200)] = 10
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Queues by name; with none, any queue name is accepted and none has a quota.
    queues: dict[str, QueueConfig] = {}
    # Custom profiles, or overrides of built-in ones, by name.
    profiles: dict[str, ProfileConfig] = {}

    def resolved_dsn(self) -> str | None:
        return os.environ.get("GPUSCHED_DSN") or self.dsn

    def resolved_join_token(self) -> str:
        return _token(self.join_token, self.join_token_file)


class SimulatedGpus(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    count: Annotated[int, Meta(ge=0, le=64)] = 4
    model: str = "Simulated-A100-80GB"
    memory_mib: Annotated[int, Meta(gt=0)] = 81920


class CoordinatorConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """agentd/coordinator.py's CoordinatorSettings, which holds the defaults and checks
    the values at start; a value left out (None) keeps its default there."""

    enabled: bool = True
    slowdown: float | None = None
    decrease: float | None = None
    increase: int | None = None
    min_share: int | None = None
    initial_share: int | None = None
    window: int | None = None
    solo_samples: int | None = None
    warmup_steps: int | None = None
    settle_steps: int | None = None
    relearn_drop: float | None = None
    headroom_mib: int | None = None
    min_cap_mib: int | None = None
    cap_step_mib: int | None = None


class AgentConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    schedd_url: str = "http://127.0.0.1:8080"
    join_token: str | None = None
    join_token_file: str | None = None
    node_id: str = ""
    # Where the other nodes reach this one (a gang's head); "": as schedd sees it connect.
    advertise_address: str = ""
    state_dir: str = "/var/lib/gpusched-agent"
    # Topology labels, e.g. rack and domain, used by placement.
    labels: dict[str, str] = {}
    gpu_backend: Literal["auto", "nvml", "simulated"] = "auto"
    simulated: SimulatedGpus = msgspec.field(default_factory=SimulatedGpus)
    # AntMan's coordinator on GPUs shared by a guaranteed job and opportunistic ones.
    coordinator: CoordinatorConfig = msgspec.field(default_factory=CoordinatorConfig)
    # Resources offered to jobs; 0 means "what the machine has".
    cpus: Annotated[float, Meta(ge=0)] = 0
    memory_mib: Annotated[int, Meta(ge=0)] = 0
    # A GPU sample is pushed only when utilisation moved this many points, or memory this much.
    gpu_util_threshold_pct: Annotated[int, Meta(ge=1, le=100)] = 10
    gpu_memory_threshold_mib: Annotated[int, Meta(ge=1)] = 512
    gpu_sample_interval_s: Seconds = 1.0
    reconnect_max_s: Seconds = 30.0
    # Each job's shim socket lives here ("" = <state_dir>/shim). A Unix socket's path
    # holds at most 107 bytes, so keep it short.
    shim_socket_dir: str = ""
    # Each job's checkpoints go to <checkpoint_root>/<job id> ("" = <state_dir>/checkpoints).
    # For migration between nodes it must be storage both nodes see at the same path.
    checkpoint_root: str = ""
    # Whom jobs run as: "agentd" (agentd's own user) or "owner" (the local account named
    # as the job's user; agentd must run as root, and jobs of users without an account on
    # the node, or of root, are refused).
    run_jobs_as: Literal["agentd", "owner"] = "agentd"
    # Checkpoints left in a job's directory after each save, the newest (0 keeps all).
    checkpoint_keep: Annotated[int, Meta(ge=0)] = CHECKPOINT_KEEP
    # A job's step rate is sent to schedd at most this often.
    progress_interval_s: Seconds = 1.0
    # The node's cache of job inputs ("" = <state_dir>/stage), its size and download limit.
    stage_cache_dir: str = ""
    stage_cache_max_mib: Annotated[int, Meta(ge=1)] = 102400
    stage_http_timeout_s: Seconds = 3600.0
    # An ended job's directory (its output log, what `schedctl logs` reads) is deleted
    # this long after schedd acknowledged its end; 0 keeps every one.
    job_dir_retention_s: Annotated[float, Meta(ge=0)] = 7 * 86400.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def resolved_shim_socket_dir(self) -> Path:
        return Path(self.shim_socket_dir or Path(self.state_dir) / "shim")

    def resolved_stage_cache_dir(self) -> Path:
        return Path(self.stage_cache_dir or Path(self.state_dir) / "stage")

    def resolved_checkpoint_root(self) -> Path:
        return Path(self.checkpoint_root or Path(self.state_dir) / "checkpoints")

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
    tables: dict[str, Any] = {}
    if kind is SchedConfig:
        # Decoded one by one below, so that an error names the queue or profile.
        tables = {key: raw.pop(key) for key in ("queues", "profiles") if key in raw}
    try:
        config = msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if isinstance(config, SchedConfig):
        try:
            queues = _named_tables(tables.get("queues", {}), "queues", QueueConfig, quote=True)
            profiles = _named_tables(tables.get("profiles", {}), "profiles", ProfileConfig)
            for name, queue in queues.items():
                _check_queue(name, queue, queues)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        config = msgspec.structs.replace(config, queues=queues, profiles=profiles)
    return config


S = TypeVar("S", QueueConfig, ProfileConfig)


def _named_tables(raw: Any, key: str, kind: type[S], quote: bool = False) -> dict[str, S]:
    """`[key.NAME]` tables decoded one by one, errors naming `key.NAME.field`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected tables like [{key}.NAME]")
    out: dict[str, S] = {}
    for name, table in raw.items():
        where = f'{key}."{name}"' if quote else f"{key}.{name}"
        if key == "queues" and not QUEUE_NAME.match(name):
            raise ConfigError(
                f"{where}: not a queue name: lowercase letters, digits, _ and -, levels"
                ' separated by / (e.g. "vision/detection")'
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table, got {table!r}")
        try:
            out[name] = msgspec.convert(table, kind)
        except msgspec.ValidationError as exc:
            raise ConfigError(_named_error(where, str(exc))) from None
    return out


def _named_error(where: str, message: str) -> str:
    # msgspec says "Expected `int` >= 0, got -1 - at `$.max_gpus`" or
    # "Object contains unknown field `maxgpus`" or "Object missing required field `x`".
    reason, sep, at = message.rpartition(" - at `")
    if not sep:
        reason, at = message, ""
    field = at.rstrip("`").removeprefix("$").lstrip(".")
    reason = reason.replace(" | null`", "`")  # TOML has no null: an optional key is left out
    for prefix, words in (
        ("Object contains unknown field `", "unknown key"),
        ("Object missing required field `", "required"),
    ):
        if reason.startswith(prefix):
            field = ".".join(p for p in (field, reason.split("`")[1]) if p)
            reason = words
    return f"{where}.{field}: {reason}" if field else f"{where}: {reason}"


def _check_queue(name: str, queue: QueueConfig, queues: dict[str, QueueConfig]) -> None:
    where = f'queues."{name}"'
    for dim in ("gpus", "cpus", "memory_mib", "gpu_memory_mib"):
        limit = getattr(queue, f"max_{dim}")
        floor = getattr(queue, f"guarantee_{dim}")
        if limit == 0 and dim != "gpus":  # the policy reads 0 there as "no bound"
            raise ConfigError(f"{where}.max_{dim}: must be > 0 (leave it out for no bound)")
        if limit is not None and limit < floor:
            raise ConfigError(f"{where}.max_{dim}: must be ≥ guarantee_{dim} ({floor:g})")
    # GPUs only: a parent's CPUs and memories left out (0) do not make its teams' wrong.
    given = sum(q.guarantee_gpus for n, q in queues.items() if n.rpartition("/")[0] == name)
    if given > queue.guarantee_gpus:
        raise ConfigError(
            f"{where}.guarantee_gpus: {queue.guarantee_gpus} is less than its sub-queues'"
            f" guarantees together ({given})"
        )
