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


# Permission bits by class: owner, group, others.
_READ = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
_PASS = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


def _may(account: Account, st: os.stat_result, *needs: tuple[int, int, int]) -> bool:
    """Whether the account has every permission in `needs` on a file of this stat, by
    its mode bits as the kernel reads them: the owner's class if it owns the file, else
    the group's if it is in the file's group, else the others'."""
    if st.st_uid == account.uid:
        i = 0
    elif st.st_gid in account.groups:
        i = 1
    else:
        i = 2
    return all(st.st_mode & bits[i] for bits in needs)


def may_not_read(account: Account, path: Path) -> Path | None:
    """The first place on the way to `path` (and to what its links point to), or inside
    it where it is a tree, that the account may not pass through or read; None where it
    may read all of it, or where `path` is not there (the copy says so). agentd reads a
    job's inputs as root, and a copy must not give a job what its owner could not read
    itself. By mode bits: ACLs are not read."""
    real = Path(os.path.realpath(path))
    try:
        for start in dict.fromkeys((path, real)):
            for parent in reversed(start.parents):
                if not _may(account, parent.stat(), _PASS):
                    return parent
        top = real.stat()
        if not stat.S_ISDIR(top.st_mode):
            return None if _may(account, top, _READ) else real
        if not _may(account, top, _READ, _PASS):
            return real
        for root, dirs, files in os.walk(real):
            for name in dirs + files:
                inside = Path(root) / name
                st = os.lstat(inside)
                if stat.S_ISLNK(st.st_mode):
                    continue  # copied as a link: the job follows it with its own rights
                needs = (_READ, _PASS) if stat.S_ISDIR(st.st_mode) else (_READ,)
                if not _may(account, st, *needs):
                    return inside
    except FileNotFoundError:
        return None
    return None
