"""Gandiva's packing on real daemons: two shim jobs that keep a simulated GPU little busy
(their steps mostly wait) take turns on it, then run at once: the agent's GPU samples
(simulated from what the shims report) give each one's utilisation while it ran alone,
and the scheduler resumes the suspended job beside the other. Both then finish."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import reasons, shim_jobs_on_one_gpu

pytestmark = pytest.mark.e2e

# Turns far longer than the jobs: they never swap, they are packed. A pack is never
# undone here (pack_min_progress 0): on a busy test machine the two jobs' steps may
# slow each other on the CPU, which the integration tests' undoing covers.
GANDIVA_PACKING = """
policy = "gandiva"
[profiles.gandiva]
decide = ["timeslice", "pack"]
[profiles.gandiva.settings]
timeslice_s = 3600.0
pack_min_progress = 0.0
"""
# Steps of a few milliseconds with 50 ms waits: about a tenth of the GPU each.
STEPS, PAUSE = "300", "0.05"
PACKED = "resume beside job"
DONE_S = 240


def test_two_little_used_jobs_are_packed(cluster: Cluster) -> None:
    alice, submit = shim_jobs_on_one_gpu(cluster, GANDIVA_PACKING, STEPS, PAUSE)
    first = submit()
    cluster.wait_state(alice, first, "running", timeout=60)
    # Sampled alone: its utilisation is known before the second job arrives.
    wait_until(
        lambda: cluster.job(alice, first).get("utilization_alone_pct") is not None,
        60,
        "A's utilisation alone",
    )
    second = submit()
    cluster.wait_state(alice, second, "running", "succeeded", timeout=60)

    # B's own samples come while A is suspended; then A resumes beside B.
    def said_once(words: str) -> list[str] | None:
        said = reasons(cluster, alice, first)
        return said if any(words in x for x in said) else None

    said = wait_until(lambda: said_once(PACKED), 90, "A packed beside B")
    assert any(x.startswith("suspend asked by the scheduler") for x in said), said
    packed = next(x for x in said if PACKED in x)
    assert f"resume beside job {second}" in packed and "together they use about" in packed
    assert cluster.job(alice, second)["utilization_alone_pct"] is not None
    wait_until(lambda: said_once("resumed: resumed at step"), 60, "A's shim resumed")
    for job_id in (first, second):
        done = cluster.wait_state(alice, job_id, "succeeded", "failed", timeout=DONE_S)
        assert done["state"] == "succeeded", done
