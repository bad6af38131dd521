"""Gandiva's grow and shrink of elastic jobs on real daemons: a job that asks for two GPUs
and may run on one (`min_gpus`) starts on the one GPU free, and grows to both once the
other job there has ended and nobody waits; a job on both shrinks to one to make room
for a job that waits, which then starts on the GPU it gave back, and grows again when
that job has ended. Each resize is a checkpoint and a restart with the new count, from
the step the job saved. Everything is asked and read over HTTP with curl."""

from __future__ import annotations

import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import ROOT, events_with, reasons, step_of
from tests.e2e.test_migration import GANDIVA, TRAIN

pytestmark = pytest.mark.e2e

# GANDIVA: no minimum run before a resize (the jobs here run for seconds). A restart
# costs the default 60 s of its GPUs: far less than what the elastic job's hour-long
# estimate saves by growing, or than the waiting job would otherwise wait for its GPUs.
ELASTIC_S = 3600.0  # the elastic job's estimated run time on all its GPUs
# Steps take 50 ms at least: a job this many steps in has run for `min_run_s` (1 s).
RAN_A_WHILE = 40
WAIT_S = 120  # any one step of the scenario, on a loaded 2-core machine
# Long enough that the other job surely ends before the elastic job comes of age.
OF_AGE_S = 12
GANDIVA_OF_AGE = f"""
policy = "gandiva"
[profiles.gandiva.settings]
min_run_s = {OF_AGE_S}
"""


def at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["at"])


class Scenario:
    """schedd under `gandiva`, one agent with two GPUs, and alice's training jobs."""

    def __init__(self, cluster: Cluster, config: str = GANDIVA) -> None:
        cluster.extra_schedd_config = config
        cluster.start_schedd()
        cluster.start_agent("node-a", gpus=2)
        self.cluster = cluster
        self.alice = cluster.token("alice")
        self.where = cluster.root / "job"
        self.where.mkdir()
        shutil.copy(ROOT / "shared" / "shim.py", self.where / "shim.py")
        (self.where / "train.py").write_text(TRAIN)
        admin = cluster.token("e2e-admin", admin=True)
        (node,) = cluster.curl("GET", "/v1/nodes", admin).body["nodes"]
        self.gpus = sorted(g["uuid"] for g in node["gpus"])

    def train(self, stop: Path, **spec: Any) -> str:
        command = [sys.executable, "-S", "train.py", str(stop), "5"]
        return self.cluster.submit(self.alice, command=command, cwd=str(self.where), **spec)

    def elastic(self, stop: Path) -> str:
        return self.train(stop, gpus=2, min_gpus=1, estimated_runtime_s=ELASTIC_S)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.cluster.job(self.alice, job_id)

    def reasons(self, job_id: str) -> list[str]:
        return reasons(self.cluster, self.alice, job_id)

    def running(self, job_id: str, attempt: int = 1) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] == "running" and job["attempt"] == attempt else None

        return dict(wait_until(check, WAIT_S, f"job {job_id} running, attempt {attempt}"))

    def ran_a_while(self, job_id: str, since: int = 0) -> None:
        """Past `min_run_s` in this attempt, and able to save a checkpoint (its shim
        reported steps): a job the policy may resize."""
        wait_until(
            lambda: step_of(self.cluster, self.alice, job_id) > since + RAN_A_WHILE,
            WAIT_S,
            f"job {job_id}'s steps",
        )
        wait_until(lambda: self.job(job_id).get("checkpointable"), WAIT_S, "checkpointable")

    def asked(self, job_id: str, words: str) -> str:
        """The event of the resize the scheduler asked, starting with `words`."""

        def find() -> str | None:
            return next((r for r in self.reasons(job_id) if r.startswith(words)), None)

        return str(wait_until(find, WAIT_S, f"job {job_id}: {words!r}"))

    def resumed(self, job_id: str, attempt: int, gpus: int, was: int) -> dict[str, Any]:
        """The job runs again on `gpus` GPUs (from `was`), from the step it saved, which
        its output shows; it goes on stepping from there."""
        job = self.running(job_id, attempt)
        assert job["gpus"] == gpus and len(job["placement"]["gpu_uuids"]) == gpus, job
        assert job["placement"]["node_id"] == "node-a"
        assert job["gpu_range"] == [1, 2]
        said = self.reasons(job_id)
        saves = [r for r in said if r.startswith("checkpointed: checkpoint of step")]
        assert len(saves) == attempt - 1, said
        saved = int(saves[-1].split()[-2])
        assert saved > RAN_A_WHILE
        assert job["checkpoint"].endswith(f"step-{saved:09d}")
        restart = f"resizing from {was} to {gpus} GPUs on node node-a: resumes from"
        assert f"{restart} {job['checkpoint']}" in said, said
        wait_until(lambda: step_of(self.cluster, self.alice, job_id) > saved, WAIT_S, "steps after")
        self.printed(job_id, f'{{"started_at": {saved}, "gpus": {gpus}}}')
        return job

    def printed(self, job_id: str, line: str) -> None:
        """The job's output has `line` (it prints it as it starts)."""
        path = f"/v1/jobs/{job_id}/logs"
        wait_until(
            lambda: line in self.cluster.curl("GET", path, self.alice).text,
            WAIT_S,
            f"job {job_id} printing {line}",
        )

    def grows_when_it_ends(self, elastic: str, other: str, stop: Path, attempt: int) -> None:
        """`other` ends (its stop file appears) and nobody waits: the elastic job, on one
        of its two GPUs, grows into the one freed, resuming as `attempt`, and then holds
        both."""
        stop.touch()
        self.succeeds(other)
        words = "resize from 1 to 2 GPUs on node node-a asked by the scheduler:"
        asked = self.asked(elastic, words)
        assert "grows into 1 idle GPU(s) on its node" in asked, asked
        grown = self.resumed(elastic, attempt=attempt, gpus=2, was=1)
        assert sorted(grown["placement"]["gpu_uuids"]) == self.gpus

    def succeeds(self, *job_ids: str) -> None:
        for job_id in job_ids:
            done = self.cluster.wait_state(
                self.alice, job_id, "succeeded", "failed", timeout=WAIT_S
            )
            assert done["state"] == "succeeded", done


def test_an_elastic_job_starts_on_fewer_gpus_and_grows_when_they_free_up(
    cluster: Cluster,
) -> None:
    s = Scenario(cluster)
    other_stop, elastic_stop = cluster.root / "other-done", cluster.root / "elastic-done"
    other = s.train(other_stop, gpus=1)
    held = s.running(other)["placement"]["gpu_uuids"]

    # It asks for two GPUs, one at least: one is free, so it starts on that one.
    elastic = s.elastic(elastic_stop)
    job = s.running(elastic)
    assert (job["gpus"], job["gpu_range"]) == (1, [1, 2]), job
    assert len(job["placement"]["gpu_uuids"]) == 1
    assert set(job["placement"]["gpu_uuids"]).isdisjoint(held)
    assert any("elastic, on 1 of its 2 GPUs" in r for r in s.reasons(elastic)), job["events"]
    s.printed(elastic, '{"started_at": 0, "gpus": 1}')
    s.ran_a_while(elastic)
    assert not any("resize" in r for r in s.reasons(elastic))

    # The other job ends, and nobody waits: the elastic job grows into the GPU it freed.
    s.grows_when_it_ends(elastic, other, other_stop, attempt=2)

    elastic_stop.touch()
    s.succeeds(elastic)
    assert s.job(elastic)["attempt"] == 2


def test_an_elastic_job_shrinks_for_a_waiting_job_and_grows_back(cluster: Cluster) -> None:
    s = Scenario(cluster)
    elastic_stop, waiting_stop = cluster.root / "elastic-done", cluster.root / "waiting-done"
    elastic = s.elastic(elastic_stop)
    whole = s.running(elastic)["placement"]["gpu_uuids"]
    assert sorted(whole) == s.gpus
    s.ran_a_while(elastic)

    # A job of one GPU finds none free, and no job of one GPU to take turns with: the
    # elastic job shrinks to one GPU, the first of its own, to make room for it.
    waiting = s.train(waiting_stop, gpus=1)
    asked = s.asked(elastic, "resize from 2 to 1 GPUs on node node-a asked by the scheduler:")
    assert f"shrinks to 1 GPU(s) to make room on node node-a for job {waiting}" in asked, asked
    shrunk = s.resumed(elastic, attempt=2, gpus=1, was=2)
    assert shrunk["placement"]["gpu_uuids"] == whole[:1]

    # The waiting job starts on the GPU given back, once the elastic job has left it.
    job = s.cluster.wait_state(s.alice, waiting, "running", timeout=WAIT_S)
    assert job["placement"]["gpu_uuids"] == whole[1:]
    assert job["attempt"] == 1 and "resize" not in str(job["events"])
    left = next(at(e) for e in shrunk["events"] if (e["from"], e["to"]) == ("running", "pending"))
    began = next(at(e) for e in job["events"] if e["to"] == "running")
    assert began >= left, (began, left)

    # It ends, and nobody waits: the elastic job grows back into its GPU.
    saved = step_of(cluster, s.alice, elastic)
    s.ran_a_while(elastic, since=saved)
    s.grows_when_it_ends(elastic, waiting, waiting_stop, attempt=3)

    elastic_stop.touch()
    s.succeeds(elastic)
    assert s.job(elastic)["attempt"] == 3


def test_a_young_elastic_job_grows_when_it_comes_of_age_with_no_event(cluster: Cluster) -> None:
    """Gandiva's introspective mode: the other job ends while the elastic job is still
    younger than `min_run_s`, so the plan at that event may not resize it. Nothing
    happens after that; the scheduler plans again when the job comes of age (the plan's
    recheck time), and the job grows then."""
    s = Scenario(cluster, GANDIVA_OF_AGE)
    other_stop, elastic_stop = cluster.root / "other-done", cluster.root / "elastic-done"
    other = s.train(other_stop, gpus=1)
    s.running(other)
    elastic = s.elastic(elastic_stop)
    job = s.running(elastic)
    assert job["gpus"] == 1, job
    started = next(at(e) for e in job["events"] if e["to"] == "running")

    other_stop.touch()
    s.succeeds(other)
    ended = next(at(e) for e in s.job(other)["events"] if e["to"] == "succeeded")
    assert (ended - started).total_seconds() < OF_AGE_S, (started, ended)  # still young

    def grow_asked() -> dict[str, Any] | None:
        found = events_with(cluster, s.alice, elastic, "resize from 1 to 2 GPUs")
        return found[0] if found else None

    asked = wait_until(grow_asked, OF_AGE_S + WAIT_S, "the grow, asked with no event")
    assert "grows into 1 idle GPU(s) on its node" in asked["reason"], asked
    assert (at(asked) - started).total_seconds() >= OF_AGE_S, (started, asked["at"])
    s.resumed(elastic, attempt=2, gpus=2, was=1)
    elastic_stop.touch()
    s.succeeds(elastic)
