"""Runs jobs through the launcher and watches them without polling.

Each job attempt has a directory under `state_dir/jobs/`. The agent watches each
launcher through a pidfd (readable when the process ends), so it learns of an exit the
moment it happens, also for launchers it found again after a restart. An exit is kept
on disk until schedd acknowledges it (`acked` file), so it is never lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentd.accounts import Account, job_account
from agentd.coordinator import JobKind
from agentd.job_observers import job_key
from agentd.launcher import process_start_time, write_atomic
from agentd.shim_server import ShimServer
from agentd.stager import StageError, Stager
from shared import logging, shim
from shared.protocol import Gang, JobExited, JobFailed, JobReport, JobStarted, Launch, Msg

log = logging.get("runner")

Key = tuple[str, int]  # (job_id, attempt)
_FINAL = "final"  # in an attempt's `acked` file: the job ended for good with it


@dataclass
class Job:
    job_id: str
    attempt: int
    dir: Path
    launcher_pid: int | None = None
    pidfd: int | None = None
    ended: JobReport | None = None  # set once the launcher recorded the end
    done: asyncio.Event = field(default_factory=asyncio.Event)
    kind: JobKind = "guaranteed"  # as launched, or as a SetKind made it since

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def base_env(launch: Launch) -> dict[str, str]:
    """The job's environment: a small base from the agent, then GPUs, then the job's own."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "HOME", "TZ") if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(launch.env)
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(launch.gpu_uuids),
            "GPUSCHED_JOB_ID": launch.job_id,
            "GPUSCHED_ATTEMPT": str(launch.attempt),
        }
    )
    if launch.gang is not None:
        env.update(gang_env(launch.gang))
    return env


def gang_env(gang: Gang) -> dict[str, str]:
    """Where a part of a job spread over nodes is, in gpusched's names and in those
    torch.distributed reads: `MASTER_ADDR`/`MASTER_PORT` (its env:// rendezvous) and
    torchrun's own (`PET_*`, its options), so that `torchrun --nproc-per-node=N
    train.py` needs nothing more on any node."""
    rank, size, head, port = str(gang.rank), str(gang.size), gang.head, str(gang.port)
    return {
        "GPUSCHED_GANG_RANK": rank,
        "GPUSCHED_GANG_SIZE": size,
        "GPUSCHED_GANG_HEAD": head,
        "GPUSCHED_GANG_PORT": port,
        "NODE_RANK": rank,
        "NNODES": size,
        "MASTER_ADDR": head,
        "MASTER_PORT": port,
        "PET_NODE_RANK": rank,
        "PET_NNODES": size,
        "PET_MASTER_ADDR": head,
        "PET_MASTER_PORT": port,
    }


class Runner:
    def __init__(
        self,
        state_dir: Path,
        post: Callable[[Msg], None],
        shims: ShimServer | None = None,
        checkpoint_root: Path | None = None,
        checkpoint_keep: int = shim.CHECKPOINT_KEEP,
        run_as_owner: bool = False,
        on_start: Callable[[str, int, str, list[str]], None] | None = None,
        on_end: Callable[[str, int], None] | None = None,
        stager: Stager | None = None,
    ) -> None:
        """`post` queues a message for schedd, in order; it may drop it while offline.

        With `shims`, each job gets a shim socket and a checkpoint directory,
        `checkpoint_root/<job id>` (the same for every attempt, so a requeued job finds
        its checkpoints; the shim leaves the newest `checkpoint_keep` there after each
        save). With `run_as_owner`, each job runs as the local account named as its user
        (`accounts.job_account`), and its shim socket and checkpoint directory are that
        account's; a job whose user has none here fails.
        `on_start(job_id, attempt, kind, gpu_uuids)` is called when a job has started (or
        was found running after a restart), `on_end(job_id, attempt)` when it has ended.
        With `stager`, a job's inputs are copied to the node first; the job finds their
        local paths, in order, in GPUSCHED_INPUTS (separated by os.pathsep).
        """
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.post = post
        self.shims = shims
        self.checkpoint_root = checkpoint_root or state_dir / "checkpoints"
        self.checkpoint_keep = checkpoint_keep
        self.run_as_owner = run_as_owner
        self.on_start = on_start
        self.on_end = on_end
        self.stager = stager
        self._closing: set[asyncio.Task[None]] = set()
        self.jobs: dict[Key, Job] = {}
        # Kills that arrived before their launch (a cancel racing a placement).
        self._killed_early: set[Key] = set()
        self._starting: set[Key] = set()  # launches still copying their inputs

    def job_dir(self, job_id: str, attempt: int) -> Path:
        return self.jobs_dir / f"{job_id}.{attempt}"

    # ---- start ---------------------------------------------------------------

    async def start(self, launch: Launch) -> None:
        """Start the job and post JobStarted or JobFailed (its end follows when it ends)."""
        key = (launch.job_id, launch.attempt)
        known = self.jobs.get(key)
        if known is not None:  # a repeated launch: never start a job twice
            if known.ended is not None:
                self.post(end_message(known))
            else:
                pid = _read_json(known.dir / "pid.json") or {}
                self.post(
                    JobStarted(job_id=launch.job_id, attempt=launch.attempt, pid=pid.get("pid", 0))
                )
            return
        if key in self._killed_early:
            self._killed_early.discard(key)
            self.post(
                JobExited(job_id=launch.job_id, attempt=launch.attempt, signal=signal.SIGKILL)
            )
            return
        if launch.image is not None:
            reason = "image: running jobs in container images is not supported by this agent yet"
            self.post(JobFailed(job_id=launch.job_id, attempt=launch.attempt, reason=reason))
            return
        env = base_env(launch)
        account = await self.account_of(launch.user)
        if isinstance(account, str):
            log.warning("job refused", job_id=launch.job_id, reason=account)
            self.post(JobFailed(job_id=launch.job_id, attempt=launch.attempt, reason=account))
            return
        if account is not None:
            env.update(USER=account.name, LOGNAME=account.name, HOME=account.home)
        if launch.inputs and self.stager is not None:
            if key in self._starting:
                return  # a repeated launch while the first copies the inputs
            self._starting.add(key)
            try:
                paths = await self.stager.stage(launch.job_id, launch.inputs, account)
            except StageError as exc:
                self.stager.release(launch.job_id)
                reason = f"staging inputs failed: {exc}"
                log.warning("job inputs not staged", job_id=launch.job_id, reason=str(exc))
                self.post(JobFailed(job_id=launch.job_id, attempt=launch.attempt, reason=reason))
                return
            finally:
                self._starting.discard(key)
            if key in self._killed_early:  # cancelled while its inputs were copied
                self._killed_early.discard(key)
                self.stager.release(launch.job_id)
                self.post(
                    JobExited(job_id=launch.job_id, attempt=launch.attempt, signal=signal.SIGKILL)
                )
                return
            env["GPUSCHED_INPUTS"] = os.pathsep.join(str(p) for p in paths)
        job_dir = self.job_dir(launch.job_id, launch.attempt)
        job_dir.mkdir(parents=True, exist_ok=False)
        if self.shims is not None:
            try:
                env.update(await self._shim_env(launch, account))
            except OSError as exc:  # a full disk; a root-squashing NFS checkpoint_root
                await self.shims.close_job(job_key(launch.job_id, launch.attempt))
                shutil.rmtree(job_dir, ignore_errors=True)
                reason = f"cannot prepare the job's shim socket or checkpoint directory: {exc}"
                log.warning("job not started", job_id=launch.job_id, reason=reason)
                self.post(JobFailed(job_id=launch.job_id, attempt=launch.attempt, reason=reason))
                return
        spec: dict[str, Any] = {
            "argv": launch.argv,
            "env": env,
            "cwd": launch.cwd,
            "user": launch.user,
        }
        if account is not None:
            spec["run_as"] = account.as_json()
        write_atomic(job_dir / "launch.json", spec)
        job = Job(launch.job_id, launch.attempt, job_dir, kind=launch.kind)
        self.jobs[key] = job
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentd.launcher",
            str(job_dir),
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        line, _ = await proc.communicate()
        word = _parse_line(line)
        if "pid" in word:
            log.info("job started", job_id=launch.job_id, attempt=launch.attempt, pid=word["pid"])
            self.post(JobStarted(job_id=launch.job_id, attempt=launch.attempt, pid=word["pid"]))
            if self.on_start is not None:
                self.on_start(launch.job_id, launch.attempt, launch.kind, launch.gpu_uuids)
        launcher = _read_json(job_dir / "launcher.json")
        if launcher is not None:
            self._watch(job, launcher["pid"], launcher.get("start_time"))
        else:
            self._ended(job)

    async def account_of(self, user: str) -> Account | str | None:
        """With `run_as_owner`, the account a job of `user` runs as, or why it cannot
        run here (`accounts.job_account`); None: jobs run as agentd. The lookup goes to
        a worker thread: NSS may ask a directory server over the network."""
        if not self.run_as_owner:
            return None
        return await asyncio.to_thread(job_account, user)

    async def _shim_env(self, launch: Launch, account: Account | None) -> dict[str, str]:
        assert self.shims is not None
        uid, gid = (account.uid, account.gid) if account is not None else (None, None)
        socket_path = await self.shims.open_job(job_key(launch.job_id, launch.attempt), uid, gid)
        checkpoints = self.checkpoint_root / launch.job_id
        checkpoints.mkdir(parents=True, exist_ok=True)
        if account is not None:  # the job writes its checkpoints there
            os.chown(checkpoints, account.uid, account.gid)
        env = {
            shim.ENV_SOCKET: str(socket_path),
            shim.ENV_JOB_KIND: launch.kind,
            shim.ENV_CHECKPOINT_DIR: str(checkpoints),
            shim.ENV_CHECKPOINT_KEEP: str(self.checkpoint_keep),
        }
        if launch.resume_from is not None:
            env[shim.ENV_RESUME_FROM] = launch.resume_from
        return env

    async def reopen_shims(self) -> None:
        """After a restart: the sockets of the jobs still running, for their shims to find."""
        if self.shims is None:
            return
        for job in self.jobs.values():
            if job.ended is None:
                run_as = (_read_json(job.dir / "launch.json") or {}).get("run_as") or {}
                key = job_key(job.job_id, job.attempt)
                await self.shims.open_job(key, run_as.get("uid"), run_as.get("gid"))

    def pgid_of(self, job_id: str, attempt: int) -> int | None:
        job = self.jobs.get((job_id, attempt))
        if job is None or job.ended is not None:
            return None
        pid = _read_json(job.dir / "pid.json")
        return None if pid is None else int(pid["pgid"])

    # ---- watching --------------------------------------------------------------

    def _watch(self, job: Job, pid: int, start_time: int | None) -> None:
        """Follow the launcher's end through a pidfd; if it is already gone, read the end now."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        if pidfd is not None and start_time is not None and process_start_time(pid) != start_time:
            os.close(pidfd)  # the pid was reused by another process: ours is long gone
            pidfd = None
        job.launcher_pid = pid
        if pidfd is None:
            self._ended(job)
            return
        job.pidfd = pidfd
        asyncio.get_running_loop().add_reader(pidfd, self._ended, job)

    def _ended(self, job: Job) -> None:
        if job.pidfd is not None:
            asyncio.get_running_loop().remove_reader(job.pidfd)
            os.close(job.pidfd)
            job.pidfd = None
        job.ended = _report_from_disk(job)
        job.done.set()
        if self.shims is not None:
            task = asyncio.get_running_loop().create_task(
                self.shims.close_job(job_key(job.job_id, job.attempt))
            )
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        if self.on_end is not None:
            self.on_end(job.job_id, job.attempt)
        if self.stager is not None:
            self.stager.release(job.job_id)
        log.info(
            "job ended",
            job_id=job.job_id,
            attempt=job.attempt,
            exit_code=job.ended.exit_code,
            signal=job.ended.signal,
            reason=job.ended.reason,
            checkpoint=job.ended.checkpoint,
        )
        self.post(end_message(job))

    # ---- recovery and reports ----------------------------------------------------

    def recover(self) -> None:
        """After a restart: find every job not yet acknowledged and watch it again."""
        for job_dir in sorted(self.jobs_dir.iterdir()):
            if (job_dir / "acked").exists() or not (job_dir / "launch.json").exists():
                continue
            job_id, _, attempt = job_dir.name.rpartition(".")
            job = Job(job_id, int(attempt), job_dir)
            self.jobs[job.key] = job
            launcher = _read_json(job_dir / "launcher.json")
            if (job_dir / "exit.json").exists() or launcher is None:
                job.ended = _report_from_disk(job)
                job.done.set()
                continue
            self._watch(job, launcher["pid"], launcher.get("start_time"))
            if job.ended is None and self.on_start is not None:
                env = (_read_json(job_dir / "launch.json") or {}).get("env", {})
                gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
                if env.get(shim.ENV_JOB_KIND) == "opportunistic":
                    job.kind = "opportunistic"
                self.on_start(job.job_id, job.attempt, job.kind, gpus)
            log.info(
                "job recovered", job_id=job.job_id, attempt=job.attempt, running=job.ended is None
            )

    def reports(self) -> list[JobReport]:
        return [
            job.ended
            or JobReport(job_id=job.job_id, attempt=job.attempt, status="running", kind=job.kind)
            for job in self.jobs.values()
        ]

    def set_kind(self, job_id: str, attempt: int, kind: JobKind) -> None:
        """What the job is treated as now, for the next hello's report."""
        job = self.jobs.get((job_id, attempt))
        if job is not None:
            job.kind = kind

    def ack(self, job_id: str, attempt: int, final: bool = False) -> None:
        """schedd has the attempt's end; `final`: the job ended for good with it, and its
        checkpoints go with the attempt's directory (`prune`)."""
        job = self.jobs.get((job_id, attempt))
        if job is None or job.ended is None:
            return
        (job.dir / "acked").write_text(_FINAL if final else "")
        del self.jobs[job.key]

    def prune(self, retention_s: float, now: float | None = None) -> int:
        """Delete the directories of jobs whose end schedd acknowledged more than
        `retention_s` ago (the `acked` file's time), and the checkpoints of a job that
        ended for good there; how many went. Blocking: call it from a worker thread."""
        now = time.time() if now is None else now
        pruned = 0
        for job_dir in self.jobs_dir.iterdir():
            acked = job_dir / "acked"
            try:
                acked_at = acked.stat().st_mtime
                final = acked.read_text() == _FINAL
            except OSError:
                continue  # not acknowledged yet (or not a job's directory)
            if acked_at + retention_s <= now:
                job_id = job_dir.name.rpartition(".")[0]
                if final and job_id:  # never the root itself, whatever the name
                    shutil.rmtree(self.checkpoint_root / job_id, ignore_errors=True)
                shutil.rmtree(job_dir, ignore_errors=True)
                pruned += not job_dir.exists()
        return pruned

    async def prune_every(self, retention_s: float, interval_s: float = 3600.0) -> None:
        """`prune` at start and every `interval_s`; never, with a retention of 0."""
        if retention_s <= 0:
            return
        while True:
            pruned = await asyncio.to_thread(self.prune, retention_s)
            if pruned:
                log.info("job directories pruned", count=pruned, retention_s=retention_s)
            await asyncio.sleep(interval_s)

    # ---- kill --------------------------------------------------------------------

    async def kill(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM to the job's process group, SIGKILL after the grace period."""
        job = self.jobs.get((job_id, attempt))
        if job is None:
            self._killed_early.add((job_id, attempt))
            return
        pid = _read_json(job.dir / "pid.json")
        if job.ended is not None or pid is None:
            return
        pgid = pid["pgid"]
        log.info("killing job", job_id=job_id, attempt=attempt, pgid=pgid, grace_s=grace_s)
        if not _signal_group(pgid, signal.SIGTERM):
            return
        # A job suspended with SIGSTOP (no shim) would hold its SIGTERM until continued.
        _signal_group(pgid, signal.SIGCONT)
        try:
            await asyncio.wait_for(job.done.wait(), grace_s)
        except TimeoutError:
            log.info("grace period over, killing", job_id=job_id, attempt=attempt)
        # The group may outlive its leader (children of the job): take it all down.
        _signal_group(pgid, signal.SIGKILL)

    def close(self) -> None:
        for job in self.jobs.values():
            if job.pidfd is not None:
                asyncio.get_running_loop().remove_reader(job.pidfd)
                os.close(job.pidfd)
                job.pidfd = None


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _parse_line(line: bytes) -> dict[str, Any]:
    try:
        word = json.loads(line.decode().strip() or "{}")
    except ValueError:
        return {"error": f"launcher said {line[:200]!r}"}
    return word if isinstance(word, dict) else {"error": "launcher said nothing useful"}


def _report_from_disk(job: Job) -> JobReport:
    end = _read_json(job.dir / "exit.json")
    if end is None:
        return JobReport(
            job_id=job.job_id,
            attempt=job.attempt,
            status="exited",
            reason="the launcher died without recording the exit status",
        )
    if "failed" in end:
        return JobReport(
            job_id=job.job_id, attempt=job.attempt, status="exited", reason=str(end["failed"])
        )
    exit_code = end.get("exit_code")
    return JobReport(
        job_id=job.job_id,
        attempt=job.attempt,
        status="exited",
        exit_code=exit_code,
        signal=end.get("signal"),
        checkpoint=_checkpoint_left(job) if exit_code == shim.EXIT_CHECKPOINTED else None,
    )


def _checkpoint_left(job: Job) -> str | None:
    """The checkpoint a job that exited EXIT_CHECKPOINTED says it saved, if it is there.

    The exit status alone is not trusted: a job may exit 85 for reasons of its own. The
    shim writes the checkpoint's manifest, then `latest.json` naming it, then exits.
    """
    launch = _read_json(job.dir / "launch.json") or {}
    root = launch.get("env", {}).get(shim.ENV_CHECKPOINT_DIR)
    if not root:
        return None
    latest = _read_json(Path(root) / shim.LATEST)
    if latest is None or not isinstance(latest.get("path"), str):
        return None
    where = Path(root) / latest["path"]
    return str(where) if (where / shim.MANIFEST).is_file() else None


def end_message(job: Job) -> JobExited | JobFailed:
    end = job.ended
    assert end is not None
    if end.reason is not None:
        return JobFailed(job_id=job.job_id, attempt=job.attempt, reason=end.reason)
    return JobExited(
        job_id=job.job_id,
        attempt=job.attempt,
        exit_code=end.exit_code,
        signal=end.signal,
        checkpoint=end.checkpoint,
    )
