"""Liquid live: a waiting job's inputs are copied to the node it will get while the job
there still runs, and the copy is done before the launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e

LIQUID = 'policy = "liquid"\n'


def test_a_prefetch_finishes_before_the_launch(cluster: Cluster, tmp_path: Path) -> None:
    data = tmp_path / "shard-000.bin"
    data.write_bytes(b"\x01" * 200_000)
    cluster.extra_schedd_config = LIQUID
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=1)
    alice = cluster.token("alice")

    # Runs until the test lets it end (expected to end within seconds: in the horizon).
    go = tmp_path / "go"
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.1; done"
    running = cluster.submit(alice, script=wait_for_go, gpus=1, estimated_runtime_s=6)
    cluster.wait_state(alice, running, "running")
    waiting = cluster.submit(alice, script="true", gpus=1, inputs=[data.as_uri()])

    def reasons() -> list[str]:
        return [e["reason"] for e in cluster.job(alice, waiting)["events"]]

    staged = f"input {data.as_uri()} staged on node node-a (200000 bytes)"
    wait_until(lambda: staged in reasons(), what="the inputs staged ahead")
    # Copied while the first job still ran: the node was busy, the job still waiting.
    assert cluster.job(alice, running)["state"] == "running"
    shown = cluster.job(alice, waiting)
    assert shown["state"] == "pending" and shown["inputs_prefetched_to"] == "node-a"
    asked = next(r for r in reasons() if r.startswith("prefetch of its inputs to node node-a"))
    assert "asked by the scheduler: node node-a is expected to free 1 GPU(s)" in asked

    go.touch()
    done = cluster.wait_state(alice, waiting, "succeeded", timeout=60)
    order = [e["reason"] for e in done["events"]]
    launched = next(i for i, e in enumerate(done["events"]) if e["to"] == "assigned")
    assert order.index(asked) < order.index(staged) < launched
    # Asked once: the next cycles saw where the inputs already were.
    assert sum(r.startswith("prefetch of its inputs") for r in order) == 1
