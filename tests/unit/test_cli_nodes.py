"""`schedctl nodes` as a table, from what GET /v1/nodes answers."""

from __future__ import annotations

from typing import Any

from schedd.cli_nodes import nodes_text


def gpu(job: str | None = None, fault: str | None = None) -> dict[str, Any]:
    return {"uuid": "GPU-x", "job_id": job, "fault": fault}


def node(node_id: str, connected: bool, gpus: list[dict[str, Any]], **drain: Any) -> dict[str, Any]:
    return {"node_id": node_id, "connected": connected, "gpus": gpus, "drained_at": None, **drain}


def test_a_line_per_node_with_free_gpus_jobs_faults_and_drains() -> None:
    body = {
        "nodes": [
            # A job on two GPUs counts once; a faulty GPU is not free.
            node("gpu-01", True, [gpu("j-1"), gpu("j-1"), gpu(fault="XID 79"), gpu()]),
            node("gpu-02", False, [gpu(), gpu()]),
            node("gpu-04", True, [gpu()], coordinator=False),
            node(
                "gpu-03",
                True,
                [gpu(), gpu("j-2")],
                drained_at="2026-11-26T20:00:00+00:00",
                drained_by="root",
                drain_reason="swap a disk",
            ),
        ]
    }
    assert nodes_text(body).splitlines() == [
        "NODE    CONNECTED  GPUS  FREE  JOBS  FAULTY  STATE",
        "gpu-01  yes        4     1     1     1       in placement",
        "gpu-02  no         2     -     0     -       away",
        "gpu-04  yes        1     1     0     -       in placement; no coordinator",
        "gpu-03  yes        2     -     1     -       drained by root: swap a disk",
    ]


def test_no_nodes_yet() -> None:
    assert nodes_text({"nodes": []}) == "no nodes have connected yet"
