"""Chronus live: a deadline answered at submission, a guaranteed job preempting a
best-effort one to start, deadlines refused with the reason, and a refused one
guaranteed at the next decision once room has come (at an arrival, or when a lease
begins), through curl."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.model import TERMINAL, JobState
from tests.e2e.cluster import Cluster, Response, wait_until

pytestmark = pytest.mark.e2e

CHRONUS = """
policy = "chronus"
[profiles.chronus.settings]
min_run_s = 0
"""


def in_minutes(minutes: float) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


def with_deadline(
    cluster: Cluster, token: str, name: str, gpus: int, runtime_s: float, script: str = "sleep 300"
) -> Response:
    """POST a job due in 30 minutes; the response, with the deadline's answer."""
    spec = {"name": name, "script": script, "gpus": gpus, "estimated_runtime_s": runtime_s}
    return cluster.curl("POST", "/v1/jobs", token, {**spec, "deadline": in_minutes(30)})


def test_deadlines_are_guaranteed_or_refused_at_submission(cluster: Cluster) -> None:
    cluster.extra_schedd_config = CHRONUS
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=2)
    alice = cluster.token("alice")

    best_effort = cluster.submit(alice, script="sleep 300", gpus=2, estimated_runtime_s=36000)
    cluster.wait_state(alice, best_effort, "running")
    assert "deadline" not in cluster.job(alice, best_effort)

    # 2 GPUs x 25 min fit in 0.9 x 2 GPUs x 30 min: guaranteed, in the POST's answer.
    slo = {"script": "sleep 300", "gpus": 2, "estimated_runtime_s": 1500}
    answer = cluster.curl(
        "POST", "/v1/jobs", alice, {"name": "a", **slo, "deadline": in_minutes(30)}
    )
    assert answer.status == 201, answer.text
    assert answer.body["deadline"]["guaranteed"] is True, answer.body
    assert answer.body["deadline"]["reason"].startswith("guaranteed: 0.8 GPU-h fit")
    guaranteed = answer.body["id"]

    # It may not wait behind the best-effort job: that one is preempted and queued again.
    cluster.wait_state(alice, guaranteed, "running")
    cluster.wait_state(alice, best_effort, "pending")

    # 10 more GPU-minutes by the same time do not fit beside the guarantee.
    squeezed = with_deadline(cluster, alice, "c", gpus=1, runtime_s=600)
    assert squeezed.body["deadline"]["guaranteed"] is False, squeezed.body
    assert "guaranteed jobs leave" in squeezed.body["deadline"]["reason"]

    # A job that could not make it even alone is told so.
    hopeless = with_deadline(cluster, alice, "d", gpus=1, runtime_s=7200)
    refused = hopeless.body["deadline"]
    assert refused["guaranteed"] is False
    assert refused["reason"].startswith("cannot finish in time even alone: needs 120 min")
    # Refused deadlines stay queued, as best-effort jobs, and GET says why.
    shown = cluster.job(alice, hopeless.body["id"])
    assert shown["state"] == "pending" and shown["deadline"] == refused

    def logged() -> set[str] | None:
        lines = [json.loads(x) for x in cluster.log("schedd").splitlines() if x.startswith("{")]
        said = {e["event"] for e in lines if e.get("event", "").startswith("deadline")}
        return said if len(said) == 2 else None

    assert wait_until(logged, what="deadline decisions logged") == {
        "deadline guaranteed",
        "deadline not guaranteed",
    }

    # The guarantee that crowded `c` out is cancelled; at the next decision (another
    # deadline arrives) `c` is guaranteed, and the hopeless job is still refused.
    assert cluster.curl("POST", f"/v1/jobs/{guaranteed}/cancel", alice).status == 202
    cluster.wait_state(alice, guaranteed, "cancelled")
    later = with_deadline(cluster, alice, "e", gpus=1, runtime_s=60)
    assert later.body["deadline"]["guaranteed"] is True, later.body

    def guaranteed_again() -> dict[str, Any] | None:
        answer: dict[str, Any] = cluster.job(alice, squeezed.body["id"])["deadline"]
        return answer if answer["guaranteed"] else None

    again = wait_until(guaranteed_again, what="the refused deadline guaranteed")
    assert again["reason"].startswith("guaranteed: "), again
    # Still queued or running, so its answer could have changed: it did not.
    assert JobState(cluster.job(alice, hopeless.body["id"])["state"]) not in TERMINAL
    assert cluster.job(alice, hopeless.body["id"])["deadline"] == refused


def test_a_refused_deadline_is_guaranteed_at_the_next_lease_without_an_arrival(
    cluster: Cluster,
) -> None:
    cluster.extra_schedd_config = CHRONUS + "deadline_lease_s = 2\n"
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=2)
    alice = cluster.token("alice")
    crowding = with_deadline(cluster, alice, "a", gpus=2, runtime_s=1500)
    assert crowding.body["deadline"]["guaranteed"] is True, crowding.body
    squeezed = with_deadline(cluster, alice, "c", gpus=1, runtime_s=600)
    assert squeezed.body["deadline"]["guaranteed"] is False, squeezed.body

    # Nothing else is submitted: the decision comes with a lease (every 2 s here).
    assert cluster.curl("POST", f"/v1/jobs/{crowding.body['id']}/cancel", alice).status == 202

    def guaranteed_again() -> dict[str, Any] | None:
        answer: dict[str, Any] = cluster.job(alice, squeezed.body["id"])["deadline"]
        return answer if answer["guaranteed"] else None

    again = wait_until(guaranteed_again, what="the refused deadline guaranteed at a lease")
    assert again["reason"].startswith("guaranteed: "), again
