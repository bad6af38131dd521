"""The launcher: starts one job and records how it ended, outliving the agent.

Run as `python -m agentd.launcher JOB_DIR`. It forks: the first process relays one JSON
line (`{"pid": ...}` or `{"error": ...}`) to the agent and exits; the second leaves the
agent's session, starts the job in a process group of its own, writes `pid.json`, waits
for it and writes `exit.json` atomically. So a job runs on, and its exit status is
kept, while the agent restarts. Stdlib only.

Files in JOB_DIR: launch.json (in), launcher.json, pid.json, exit.json, output.log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def process_start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot, to tell a pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _run(job_dir: Path, report_fd: int) -> int:
    spec = json.loads((job_dir / "launch.json").read_text())
    write_atomic(
        job_dir / "launcher.json",
        {"pid": os.getpid(), "start_time": process_start_time(os.getpid())},
    )
    log = open(job_dir / "output.log", "ab")  # noqa: SIM115 - held for the job's lifetime
    # Run as the job's owner (`run_jobs_as = "owner"`): the child takes the account's
    # ids and groups before it executes; the output log stays open from here.
    run_as = spec.get("run_as") or {}
    try:
        child = subprocess.Popen(
            spec["argv"],
            env=spec["env"],
            cwd=spec.get("cwd"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            close_fds=True,
            user=run_as.get("uid"),
            group=run_as.get("gid"),
            extra_groups=run_as.get("groups"),
        )
    except OSError as exc:
        reason = f"cannot start {spec['argv'][0]!r}: {exc.strerror or exc}"
        if run_as and isinstance(exc, PermissionError):
            reason += f" (as user {run_as.get('name')!r})"
        if spec.get("cwd") and not os.path.isdir(spec["cwd"]):
            reason = f"cannot start: cwd {spec['cwd']!r} is not a directory on this node"
        write_atomic(job_dir / "exit.json", {"failed": reason})
        os.write(report_fd, (json.dumps({"error": reason}) + "\n").encode())
        os.close(report_fd)
        return 0
    log.close()
    write_atomic(job_dir / "pid.json", {"pid": child.pid, "pgid": child.pid})
    os.write(report_fd, (json.dumps({"pid": child.pid}) + "\n").encode())
    os.close(report_fd)
    while True:
        try:
            _, status = os.waitpid(child.pid, 0)
            break
        except ChildProcessError:
            status = None
            break
        except InterruptedError:
            continue
    if status is None:
        write_atomic(job_dir / "exit.json", {"failed": "exit status lost"})
        return 0
    code = os.waitstatus_to_exitcode(status)
    result = {"exit_code": code} if code >= 0 else {"signal": -code}
    write_atomic(job_dir / "exit.json", result)
    return 0


def main() -> None:
    job_dir = Path(sys.argv[1])
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        # The relay: hand the agent the launcher's first word, then get out of the way.
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            line = reader.readline()
        sys.stdout.buffer.write(line or b'{"error": "launcher died before starting the job"}\n')
        sys.stdout.flush()
        os._exit(0)
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # let go of the agent's pipes, so its read sees EOF
    os.close(devnull)
    # Drop every other inherited descriptor (the agent's sockets and pipes among them):
    # a launcher holding them would keep them open for the job's whole life.
    os.closerange(3, write_end)
    os.closerange(write_end + 1, os.sysconf("SC_OPEN_MAX"))
    try:
        code = _run(job_dir, write_end)
    except Exception as exc:  # anything at all: record it rather than vanish silently
        write_atomic(job_dir / "exit.json", {"failed": f"launcher error: {exc!r}"})
        code = 1
    os._exit(code)


if __name__ == "__main__":
    main()
