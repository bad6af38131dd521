"""`schedctl explain`'s words for a pending job (why it waits), a suspended one (who
suspended it, and what of its GPUs), a migrating one (where to, and the GPUs held there),
a packed one and an elastic one."""

from __future__ import annotations

from typing import Any

from schedd.cli_queues import explain_text

REPORT: dict[str, Any] = {"queues": [], "last_cycle": None}


def job(**controls: Any) -> dict[str, Any]:
    return {
        "id": "j-1",
        "name": "train",
        "user": "alice",
        "state": "running",
        "queue": "default",
        "attempt": 1,
        "attained_gpu_s": 30.0,
        "placement": {"node_id": "n1", "gpu_uuids": ["GPU-0"]},
        "controls": {"share": 100, "memory_cap_mib": None, **controls},
        "suspended_at": "2026-01-01T00:00:00+00:00",
    }


def test_a_time_sliced_job_is_said_to_wait_for_its_turn() -> None:
    text = explain_text(job(suspended=True, time_sliced=True), REPORT)
    assert "suspended since 2026-01-01T00:00:00+00:00, time-sliced: another job" in text


def test_a_job_its_user_suspended_keeps_its_gpus() -> None:
    text = explain_text(job(suspended=True, time_sliced=False), REPORT)
    assert "asked by a user: it keeps its GPUs" in text
    assert "suspended" not in explain_text(job(suspended=False), REPORT)


def test_a_migrating_job_says_where_it_goes() -> None:
    moving = {**job(suspended=False), "migrating_to": "n2", "migrating_to_gpus": ["GPU-7"]}
    text = explain_text(moving, REPORT)
    assert "migrating to n2 (holding GPU-7 there): saving a checkpoint" in text
    assert "migrating" not in explain_text(job(suspended=False), REPORT)


def test_a_packed_job_says_beside_whom() -> None:
    packed = {**job(suspended=False, packed=True, packed_beside="j-2"), "resumed_at": "T"}
    text = explain_text(packed, REPORT)
    assert "packed beside job j-2 since T: the two run at once on its GPUs" in text
    assert "packed" not in explain_text(job(suspended=True, time_sliced=True, packed=False), REPORT)


def test_an_elastic_job_says_its_range_and_a_resize_under_way() -> None:
    elastic = {**job(suspended=False), "gpus": 2, "gpu_range": [1, 4]}
    assert "elastic: 1 to 4 GPUs, on 2 now" in explain_text(elastic, REPORT)
    resizing = {**elastic, "resizing_to": 4, "resizing_to_gpus": ["GPU-0", "GPU-1"]}
    text = explain_text(resizing, REPORT)
    assert "resizing to 4 GPUs (GPU-0, GPU-1): saving a checkpoint, then it restarts" in text
    assert "elastic" not in explain_text(job(suspended=False), REPORT)


def test_a_pending_job_says_why_it_waits() -> None:
    """The question `explain` is mostly asked: the plan's reason and its code, as
    GET /v1/jobs/ID gives them."""
    waiting = {
        **job(),
        "state": "pending",
        "placement": None,
        "pending_reason": {"code": "no_capacity", "reason": "no node has 4 free GPUs"},
    }
    text = explain_text(waiting, REPORT)
    assert text.splitlines()[:2] == [
        "job j-1 (train) of alice: pending",
        "waiting: no node has 4 free GPUs [no_capacity]",
    ]
