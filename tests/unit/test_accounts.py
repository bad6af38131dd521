"""Whom a job runs as under `run_jobs_as = "owner"`, and agentd's checks at start."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentd.accounts import Account, closed_to_others, job_account, may_not_read
from agentd.main import ConfigProblem, check_run_as_owner
from shared.config import AgentConfig


def test_a_user_with_an_account_runs_as_it_with_its_groups() -> None:
    account = job_account("nobody")
    assert isinstance(account, Account)
    assert (account.name, account.uid) == ("nobody", 65534)
    assert account.groups[0] == account.gid


@pytest.mark.parametrize(
    "user, why",
    [
        ("no-such-user-7f3a", "user 'no-such-user-7f3a' has no account on this node"),
        ("root", "jobs do not run as root (run_jobs_as = \"owner\"): user 'root' is uid 0"),
    ],
)
def test_a_user_without_an_account_or_root_is_refused(user: str, why: str) -> None:
    refused = job_account(user)
    assert isinstance(refused, str) and refused.startswith(why)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can pass through (pytest's own are closed to others)."""
    base = Path(tempfile.mkdtemp(prefix="owner-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def test_a_closed_directory_on_the_way_is_found(open_dir: Path) -> None:
    (open_dir / "state" / "shim").mkdir(parents=True)
    assert closed_to_others(open_dir / "state" / "shim") is None
    assert closed_to_others(open_dir / "not" / "yet") is None  # agentd makes it, open
    (open_dir / "state").chmod(0o700)
    assert closed_to_others(open_dir / "state" / "shim") == open_dir / "state"
    assert closed_to_others(open_dir / "state") == open_dir / "state"


def config(state_dir: Path, **more: object) -> AgentConfig:
    return AgentConfig(state_dir=str(state_dir), run_jobs_as="owner", **more)  # type: ignore[arg-type]


def test_owner_mode_needs_root(open_dir: Path) -> None:
    with pytest.raises(ConfigProblem, match='run_jobs_as = "owner" needs agentd to run as root'):
        check_run_as_owner(config(open_dir), euid=1000)
    check_run_as_owner(AgentConfig(state_dir=str(open_dir)), euid=1000)  # "agentd": any user


def test_owner_mode_refuses_directories_jobs_cannot_reach(open_dir: Path) -> None:
    state = open_dir / "state"
    state.mkdir(mode=0o700)  # as systemd's StateDirectoryMode=0700 makes it
    with pytest.raises(ConfigProblem) as refused:
        check_run_as_owner(config(state), euid=0)
    assert str(refused.value).startswith(
        f'shim_socket_dir: jobs running as their owners (run_jobs_as = "owner") cannot reach'
        f" '{state}/shim': '{state}' is mode 0700, closed to other users"
    )
    # Each place a job reaches set outside the closed state directory: it starts.
    check_run_as_owner(
        config(
            state,
            shim_socket_dir=str(open_dir / "run"),
            checkpoint_root=str(open_dir / "checkpoints"),
            stage_cache_dir=str(open_dir / "stage"),
        ),
        euid=0,
    )
    with pytest.raises(ConfigProblem, match=r"^stage_cache_dir: "):
        check_run_as_owner(
            config(
                state,
                shim_socket_dir=str(open_dir / "run"),
                checkpoint_root=str(open_dir / "checkpoints"),
            ),
            euid=0,
        )


def made(path: Path, mode: int, text: str | None = None) -> Path:
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another owner need root")
def test_an_input_is_readable_only_as_its_owner_could_read_it_itself(open_dir: Path) -> None:
    """agentd copies inputs as root: the check is what the job's account could read."""
    nobody = job_account("nobody")
    assert isinstance(nobody, Account)
    assert may_not_read(nobody, made(open_dir / "open.txt", 0o644, "x")) is None
    private = made(open_dir / "private.txt", 0o600, "x")
    assert may_not_read(nobody, private) == private
    # A file anyone may read, in a directory only root may enter (as under /root).
    closed = made(open_dir / "closed", 0o700)
    inside = made(closed / "weights.bin", 0o644, "x")
    assert may_not_read(nobody, inside) == closed
    # A link from an open place to it: the kernel would follow it into `closed`.
    (open_dir / "link").symlink_to(inside)
    assert may_not_read(nobody, open_dir / "link") == closed
    # A tree: every directory entered and every file read.
    tree = made(open_dir / "tree", 0o755)
    made(tree / "a.txt", 0o644, "x")
    assert may_not_read(nobody, tree) is None
    deep = made(tree / "deep", 0o711)  # passable, not listable: its files cannot be copied
    assert may_not_read(nobody, tree) == deep
    deep.chmod(0o755)
    secret = made(deep / "secret", 0o640, "x")
    assert may_not_read(nobody, tree) == secret
    # The group's class where the account is in the file's group.
    os.chown(secret, 0, nobody.gid)
    assert may_not_read(nobody, tree) is None
    assert may_not_read(nobody, open_dir / "gone") is None  # the copy says it is not there
