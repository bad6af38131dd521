"""Gandiva's time-slicing on real daemons: a second job finds no free GPU and starts on
the GPU of a running one, which is suspended at its next step; the two take turns of
`timeslice_s` there, with no job pending, until both have done all their steps. The
turns go on where they were after schedd or the agent restarts (kill -9) meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import reasons, shim_jobs_on_one_gpu, step_of

pytestmark = pytest.mark.e2e

SLICE_S = 3
# Packing off: these little-used jobs would otherwise run at once (test_packing.py).
GANDIVA = f"""
policy = "gandiva"
[profiles.gandiva]
decide = ["timeslice"]
[profiles.gandiva.settings]
timeslice_s = {SLICE_S}
"""
# Each job needs a few turns whatever the machine's speed: its steps sleep (they stand
# for input waits), so 150 of them take at least 7.5 s, more than two slices.
STEPS, PAUSE = "150", "0.05"
SUSPENDED = "suspend asked by the scheduler"
RESUMED = "resume asked by the scheduler"
# On a loaded machine a turn may stretch; the jobs' whole run, turns included, is bounded.
DONE_S = 240


def suspended_now(cluster: Cluster, token: str, job_id: str) -> dict[str, Any] | None:
    job = cluster.job(token, job_id)
    controls = job["controls"] or {}
    sliced = controls.get("suspended") and controls.get("time_sliced") and "suspended_at" in job
    return job if sliced else None


def start_pair(cluster: Cluster) -> tuple[str, str, str, list[str]]:
    """schedd under `gandiva` and one agent with one GPU; job A runs, then job B starts
    on A's GPU while A is suspended. (token, A, B, the GPU)"""
    alice, submit = shim_jobs_on_one_gpu(cluster, GANDIVA, STEPS, PAUSE)
    first = submit()
    gpu = cluster.wait_state(alice, first, "running", timeout=60)["placement"]["gpu_uuids"]
    # Its shim is connected (a job without one would be stopped with SIGSTOP instead).
    wait_until(lambda: step_of(cluster, alice, first) > 3, 60, "A's first steps")
    second = submit()
    started = cluster.wait_state(alice, second, "running", "succeeded", timeout=60)
    assert started["placement"]["gpu_uuids"] == gpu
    return alice, first, second, gpu


def test_two_jobs_take_turns_on_one_gpu(cluster: Cluster) -> None:
    alice, first, second, gpu = start_pair(cluster)
    assert any(r.startswith(SUSPENDED) for r in reasons(cluster, alice, first))
    # The job that makes way is shown suspended while the other has its turn, and its
    # shim acted on it at a step boundary.
    paused = wait_until(lambda: suspended_now(cluster, alice, first), 60, "A shown suspended")
    assert paused["state"] == "running" and paused["placement"]["gpu_uuids"] == gpu
    wait_until(
        lambda: any("suspended: suspended at step" in r for r in reasons(cluster, alice, first)),
        60,
        "A's shim suspended",
    )
    for job_id in (first, second):
        done = cluster.wait_state(alice, job_id, "succeeded", "failed", timeout=DONE_S)
        assert done["state"] == "succeeded", done
    turns_taken(cluster, alice, first, second)


@pytest.mark.parametrize("daemon", ["schedd", "agent"])
def test_turns_go_on_after_a_restart(cluster: Cluster, daemon: str) -> None:
    """schedd finds the turns in the database; a new agent, whose jobs' shims resumed
    when the old one went, is told the suspension again at its hello."""
    alice, first, second, _ = start_pair(cluster)
    wait_until(lambda: suspended_now(cluster, alice, first), 60, "A shown suspended")
    if daemon == "schedd":
        cluster.kill9(cluster.schedd)  # type: ignore[arg-type]
        cluster.start_schedd()
    else:
        cluster.kill9(cluster.agents["node-a"])
        cluster.start_agent("node-a", gpus=1)
    cluster.wait_node("node-a")
    for job_id in (first, second):
        done = cluster.wait_state(alice, job_id, "succeeded", "failed", timeout=DONE_S)
        assert done["state"] == "succeeded", done
    turns_taken(cluster, alice, first, second)


def turns_taken(cluster: Cluster, token: str, first: str, second: str) -> None:
    """Each job was suspended for the other and resumed at its turn: A made way for B,
    B for A at the end of B's turn, and each came back."""
    for job_id in (first, second):
        said = reasons(cluster, token, job_id)
        assert any(r.startswith(SUSPENDED) for r in said), said
        assert any(r.startswith(RESUMED) for r in said), said
        assert any(r.startswith("resumed: resumed at step") for r in said), said
    a = reasons(cluster, token, first)
    assert a.index(next(r for r in a if r.startswith(SUSPENDED))) < a.index(
        next(r for r in a if r.startswith(RESUMED))
    )
