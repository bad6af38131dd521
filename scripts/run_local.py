"""`make run`: the whole system on this machine, for trying it out.

Starts schedd (embedded PostgreSQL in the run directory unless GPUSCHED_DSN is set) and
one agent (NVIDIA GPUs through NVML when a driver is present, else simulated GPUs),
creates a token, prints a curl line that submits a job, and runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def write_once(path: Path, text: str, mode: int = 0o644) -> None:
    if not path.exists():
        path.write_text(text)
        path.chmod(mode)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"schedd exited; see {log}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"schedd did not become healthy; see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=".run", help="run directory (default .run)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GPUSCHED_PORT", 8080)))
    args = parser.parse_args()
    run = Path(args.dir).resolve()
    run.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"

    write_once(run / "join_token", secrets.token_urlsafe(32) + "\n", 0o600)
    (run / "schedd.toml").write_text(
        f'listen_port = {args.port}\ndata_dir = "{run / "schedd"}"\n'
        f'join_token_file = "{run / "join_token"}"\n'
    )
    # Job shim sockets need a short path (a Unix socket's is 107 bytes at most).
    sockets = run / "agent" / "shim"
    if len(str(sockets)) > 64:
        sockets = Path(tempfile.gettempdir()) / f"gpusched-{os.getuid()}-{args.port}"
    (run / "agentd.toml").write_text(
        f'schedd_url = "{url}"\njoin_token_file = "{run / "join_token"}"\n'
        f'node_id = "local"\nstate_dir = "{run / "agent"}"\nshim_socket_dir = "{sockets}"\n'
    )
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        log = open(run / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [BIN / name, "--config", str(run / f"{name}.toml")], stdout=log, stderr=log
        )
        procs.append(proc)
        return proc

    try:
        schedd = start("schedd")
        wait_healthy(url, schedd, run / "schedd.log")
        token_file = run / "token"
        if not token_file.exists():
            user = os.environ.get("USER") or "demo"
            token = (
                subprocess.run(
                    [
                        BIN / "schedctl",
                        "token",
                        "create",
                        user,
                        "--admin",
                        "--config",
                        str(run / "schedd.toml"),
                    ],
                    check=True,
                    capture_output=True,
                )
                .stdout.decode()
                .strip()
            )
            write_once(token_file, token + "\n", 0o600)
        token = token_file.read_text().strip()
        start("agentd")
        spec = '{"name": "hello", "command": ["python3", "-c", "print(6 * 7)"], "gpus": 1}'
        print(f"gpusched is running at {url} (logs: {run}/schedd.log, {run}/agentd.log)")
        print(f"export GPUSCHED_TOKEN={token}")
        print("Submit a job:")
        print(
            f"curl -s -H \"Authorization: Bearer $GPUSCHED_TOKEN\" -d '{spec}' {url}/v1/jobs",
            flush=True,
        )
        print(
            'Then: curl -s -H "Authorization: Bearer $GPUSCHED_TOKEN" '
            f"{url}/v1/jobs/JOB_ID   (and .../logs). Ctrl-C stops everything.",
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        sys.exit("a daemon exited; see the logs above")
    except KeyboardInterrupt:
        pass
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
