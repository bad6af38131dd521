"""The shim in-process, without an agent: steps, the rule on agent loss, checkpoints.

Controls are fed in as the link thread would, one line from the agent at a time.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from shared import shim
from shared import shim_protocol as sp


def control(s: shim.Shim, msg: sp.ShimMsg) -> None:
    s._on_line(sp.encode(msg))  # what the link thread does with a line from the agent


def run_steps(s: shim.Shim, n: int) -> None:
    for _ in range(n):
        with s.step():
            pass


def test_without_a_socket_the_shim_only_counts_steps() -> None:
    s = shim.Shim()
    run_steps(s, 3)
    assert s.steps == 3
    assert s.resume_state() is None


def test_a_failing_step_raises_the_jobs_own_error_and_is_not_counted() -> None:
    s = shim.Shim()
    with pytest.raises(KeyError), s.step():
        raise KeyError("the job's bug")
    assert s.steps == 0


def test_the_environment_configures_the_shim(tmp_path: Path) -> None:
    s = shim.Shim.from_env(
        {shim.ENV_JOB_KIND: shim.OPPORTUNISTIC, shim.ENV_CHECKPOINT_DIR: str(tmp_path)}
    )
    assert (s.job_kind, s.checkpoint_dir) == (shim.OPPORTUNISTIC, str(tmp_path))
    assert shim.Shim.from_env({shim.ENV_JOB_KIND: "vip"}).job_kind == shim.GUARANTEED


@pytest.mark.parametrize(
    "kind, expected",
    [
        (shim.GUARANTEED, shim.Controls(checkpoint=True)),
        (shim.OPPORTUNISTIC, shim.Controls(memory_cap_mib=100, share=25, checkpoint=True)),
    ],
)
def test_on_agent_loss_guaranteed_runs_free_and_opportunistic_keeps_its_setting(
    kind: str, expected: shim.Controls
) -> None:
    before = shim.Controls(memory_cap_mib=100, share=25, checkpoint=True)
    assert shim.after_agent_loss(before, kind) == expected


def test_a_throttled_step_sleeps_in_proportion_to_its_share() -> None:
    s = shim.Shim()
    control(s, sp.Limits(share=50))
    body, whole = [], []
    for _ in range(3):
        start = time.perf_counter()
        with s.step():
            time.sleep(0.02)
            body.append(time.perf_counter() - start)
        whole.append(time.perf_counter() - start)
    assert sum(whole) / sum(body) > 1.8  # share 50: as long asleep as at work


def test_close_releases_a_suspended_step() -> None:
    s = shim.Shim(job_kind=shim.OPPORTUNISTIC)
    control(s, sp.Suspend())
    worker = threading.Thread(target=run_steps, args=(s, 2))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and s.steps == 0  # held at the boundary before step 1
    s.close()
    worker.join(5)
    assert not worker.is_alive() and s.steps == 2


def save_step(s: shim.Shim) -> None:
    s.on_checkpoint(lambda d: (Path(d) / "state.json").write_text(json.dumps(s.steps)))


def test_checkpoint_saves_at_the_boundary_and_exits_with_the_status(tmp_path: Path) -> None:
    s = shim.Shim(checkpoint_dir=str(tmp_path))
    save_step(s)
    run_steps(s, 3)
    control(s, sp.Checkpoint())
    with pytest.raises(SystemExit) as exited:
        run_steps(s, 1)
    assert exited.value.code == shim.EXIT_CHECKPOINTED
    saved = tmp_path / "step-000000004"
    assert json.loads((saved / "state.json").read_text()) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [shim.LATEST, saved.name]
    assert shim.read_checkpoint(str(tmp_path)) == shim.ResumeState(str(saved), 4)

    again = shim.Shim(resume_from=str(saved))
    assert again.resume_state() == shim.ResumeState(str(saved), 4)
    run_steps(again, 1)
    assert again.steps == 5


@pytest.mark.parametrize("with_save, with_dir", [(False, True), (True, False)])
def test_a_checkpoint_that_cannot_be_made_leaves_the_job_running(
    tmp_path: Path, with_save: bool, with_dir: bool
) -> None:
    s = shim.Shim(checkpoint_dir=str(tmp_path) if with_dir else None)
    if with_save:
        save_step(s)
    control(s, sp.Checkpoint())
    run_steps(s, 2)
    assert s.steps == 2
    assert list(tmp_path.iterdir()) == []


def test_a_save_function_that_fails_leaves_no_checkpoint(tmp_path: Path) -> None:
    s = shim.Shim(checkpoint_dir=str(tmp_path))

    def save(directory: str) -> None:
        (Path(directory) / "half").write_text("...")
        raise OSError("disk full")

    s.on_checkpoint(save)
    control(s, sp.Checkpoint())
    run_steps(s, 1)
    assert s.steps == 1
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(shim.CheckpointError):
        shim.read_checkpoint(str(tmp_path))


def test_an_unreadable_checkpoint_is_an_error_for_the_job_to_see(tmp_path: Path) -> None:
    s = shim.Shim(resume_from=str(tmp_path / "gone"))  # constructing it never raises
    with pytest.raises(shim.CheckpointError, match="cannot resume"):
        s.resume_state()
    assert s.steps == 0


def saved_at(root: Path, step: int, at: float) -> Path:
    """A complete checkpoint of `step`, its manifest saying it was saved at `at`."""
    where = root / f"step-{step:09d}"
    where.mkdir()
    (where / shim.MANIFEST).write_text(json.dumps({"step": step, "saved_at": at}))
    return where


def test_a_save_leaves_the_newest_checkpoints_by_when_they_were_saved(tmp_path: Path) -> None:
    """A run that could not resume counts steps from 0 again: the checkpoints it saves
    are newer than those of higher steps before it, and those go first. A save that
    died left a `.partial`, which goes too."""
    saved_at(tmp_path, 40, at=100.0)
    saved_at(tmp_path, 90, at=200.0)  # the last before the restart from 0
    (tmp_path / "step-000000095.partial").mkdir()
    s = shim.Shim(checkpoint_dir=str(tmp_path), checkpoint_keep=2)
    save_step(s)
    run_steps(s, 3)
    control(s, sp.Checkpoint())
    with pytest.raises(SystemExit):
        run_steps(s, 1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [shim.LATEST, "step-000000004", "step-000000090"]


@pytest.mark.parametrize("keep, left", [(1, 1), (3, 3), (0, 5)])
def test_checkpoint_keep_bounds_what_is_left(tmp_path: Path, keep: int, left: int) -> None:
    newest = saved_at(tmp_path, 50, at=500.0)
    for step in range(1, 5):
        saved_at(tmp_path, step * 10, at=step * 100.0)
    shim.prune_checkpoints(tmp_path, newest, keep)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert len(kept) == left and newest.name in kept
    assert kept == [f"step-{s * 10:09d}" for s in range(6 - left, 6)]  # the newest ones


def test_checkpoint_keep_comes_from_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert shim.Shim.from_env({shim.ENV_CHECKPOINT_KEEP: "5"}).checkpoint_keep == 5
    assert shim.Shim.from_env({shim.ENV_CHECKPOINT_KEEP: "0"}).checkpoint_keep == 0
    assert shim.Shim.from_env({}).checkpoint_keep == shim.CHECKPOINT_KEEP
    bad = shim.Shim.from_env({shim.ENV_CHECKPOINT_KEEP: "-1"})
    assert bad.checkpoint_keep == shim.CHECKPOINT_KEEP
    assert "GPUSCHED_CHECKPOINT_KEEP='-1' is not a count of 0 or more" in capsys.readouterr().err
