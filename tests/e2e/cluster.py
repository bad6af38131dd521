"""A cluster of real processes for end-to-end tests: schedd, agents, and curl as the client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
JOIN_TOKEN = "e2e-join-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Response:
    status: int
    body: Any
    text: str


@dataclass
class Cluster:
    root: Path
    dsn: str
    port: int = field(default_factory=free_port)
    schedd: subprocess.Popen[bytes] | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_schedd_config: str = ""
    # Shim sockets need a short path (107 bytes at most): not under pytest's tmp_path.
    socket_root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gs-")))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def schedd_config(self) -> Path:
        return self.root / "schedd.toml"

    def _env(self) -> dict[str, str]:
        """The DSN for the daemons; an empty one means schedd's embedded PostgreSQL."""
        env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_DSN"}
        if self.dsn:
            env["GPUSCHED_DSN"] = self.dsn
        return env

    # ---- processes ------------------------------------------------------------------

    def start_schedd(self) -> None:
        self.schedd_config.write_text(
            f'listen_port = {self.port}\njoin_token = "{JOIN_TOKEN}"\n'
            f'data_dir = "{self.root / "schedd-data"}"\nkill_grace_s = 3\n'
            f"{self.extra_schedd_config}"
        )
        log = open(self.root / "schedd.log", "ab")  # noqa: SIM115 - the process owns it
        self.schedd = subprocess.Popen(
            [BIN / "schedd", "--config", str(self.schedd_config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(),
        )
        wait_until(self._healthy, what="schedd /healthz")

    def _healthy(self) -> bool:
        assert self.schedd is not None
        if self.schedd.poll() is not None:
            raise AssertionError(f"schedd exited: {self.log('schedd')[-3000:]}")
        try:
            return self.curl("GET", "/healthz", token=None).status == 200
        except subprocess.CalledProcessError:
            return False

    def start_agent(
        self, node_id: str, gpus: int = 2, wait: bool = True, extra_config: str = ""
    ) -> subprocess.Popen[bytes]:
        """`extra_config`: more top-level settings of agentd.toml (a `shim_socket_dir`
        given there replaces the test's own)."""
        config = self.root / f"{node_id}.toml"
        given = {line.split("=")[0].strip() for line in extra_config.splitlines() if "=" in line}
        socket_dir = (
            ""
            if "shim_socket_dir" in given
            else f'shim_socket_dir = "{self.socket_root / node_id}"\n'
        )
        config.write_text(
            f'schedd_url = "{self.url}"\njoin_token = "{JOIN_TOKEN}"\nnode_id = "{node_id}"\n'
            f'state_dir = "{self.root / node_id}"\ngpu_backend = "simulated"\n'
            f"reconnect_max_s = 1\ncpus = 16\nmemory_mib = 65536\n"
            f"{socket_dir}{extra_config}"
            f"[simulated]\ncount = {gpus}\n"
        )
        log = open(self.root / f"{node_id}.log", "ab")  # noqa: SIM115 - the process owns it
        self.agents[node_id] = subprocess.Popen(
            [BIN / "agentd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        if wait:
            self.wait_node(node_id)
        return self.agents[node_id]

    def wait_node(self, node_id: str, connected: bool = True) -> None:
        token = self.token("e2e-admin", admin=True)

        def check() -> bool:
            nodes = self.curl("GET", "/v1/nodes", token).body["nodes"]
            return any(n["node_id"] == node_id and n["connected"] is connected for n in nodes)

        wait_until(check, what=f"node {node_id} connected={connected}")

    def kill9(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in [*self.agents.values(), self.schedd]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        # Jobs outlive agents by design: end whatever a test left running.
        for pid_file in self.root.glob("*/jobs/*/pid.json"):
            with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
                os.killpg(json.loads(pid_file.read_text())["pgid"], signal.SIGKILL)
        shutil.rmtree(self.socket_root, ignore_errors=True)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- clients ------------------------------------------------------------------------

    _tokens: dict[tuple[str, bool], str] = field(default_factory=dict)

    def token(self, user: str, admin: bool = False) -> str:
        key = (user, admin)
        if key not in self._tokens:
            argv = [BIN / "schedctl", "token", "create", user, "--config", str(self.schedd_config)]
            if admin:
                argv.append("--admin")
            out = subprocess.run(argv, check=True, capture_output=True, env=self._env(), timeout=60)
            self._tokens[key] = out.stdout.decode().strip()
        return self._tokens[key]

    def curl(
        self, method: str, path: str, token: str | None, body: Any = None, *extra: str
    ) -> Response:
        """One request through the real curl binary."""
        argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", *extra]
        if token is not None:
            argv += ["-H", f"Authorization: Bearer {token}"]
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        argv.append(self.url + path)
        out = subprocess.run(argv, check=True, capture_output=True, timeout=60).stdout.decode()
        text, _, status = out.rpartition("\n")
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        return Response(int(status), parsed, text)

    def schedctl(self, token: str, *argv: str) -> str:
        """What the real schedctl prints for `argv`, as `token`'s user; it must succeed."""
        env = {**os.environ, "GPUSCHED_URL": self.url, "GPUSCHED_TOKEN": token}
        done = subprocess.run(
            [BIN / "schedctl", *argv], env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def submit(self, token: str, **spec: Any) -> str:
        response = self.curl("POST", "/v1/jobs", token, {"name": "e2e", **spec})
        assert response.status == 201, response.text
        return str(response.body["id"])

    def job(self, token: str, job_id: str) -> dict[str, Any]:
        response = self.curl("GET", f"/v1/jobs/{job_id}", token)
        assert response.status == 200, response.text
        return dict(response.body)

    def wait_state(
        self, token: str, job_id: str, *states: str, timeout: float = 30.0
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.job(token, job_id)
            return job if job["state"] in states else None

        return dict(wait_until(check, timeout, what=f"job {job_id} in {states}"))
