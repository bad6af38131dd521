"""The local accounts jobs run as where agentd runs them as their owners
(`run_jobs_as = "owner"`): the job's user names an account on the node."""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # every group the account is in, its own first
    home: str

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups)}


def job_account(user: str) -> Account | str:
    """The account a job of `user` runs as, or why it cannot run on this node."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f'user {user!r} has no account on this node (run_jobs_as = "owner")'
    if entry.pw_uid == 0:
        return f'jobs do not run as root (run_jobs_as = "owner"): user {user!r} is uid 0'
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    ordered = (entry.pw_gid, *(g for g in groups if g != entry.pw_gid))
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, ordered, entry.pw_dir)


def closed_to_others(path: Path) -> Path | None:
    """The first directory on the way to `path` (itself included, where it exists) that
    users other than its owner cannot pass through: a job running as its owner could not
    reach what agentd puts there. None if there is none."""
    path = path.absolute()
    for where in (*reversed(path.parents), path):
        try:
            mode = where.stat().st_mode
        except FileNotFoundError:
            return None  # agentd creates the rest (mode 0755 under the usual umask)
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return where
    return None
