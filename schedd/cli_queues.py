"""`schedctl queues` and `schedctl explain JOB`: GET /v1/queues and a job, in words."""

from __future__ import annotations

from typing import Any

HEADER = (
    "QUEUE",
    "GUARANTEE",
    "MAX",
    "WEIGHT",
    "USED",
    "BORROWED",
    "SHARE",
    "PENDING",
    "WAITING (LAST CYCLE)",
)


def _gpus(value: dict[str, Any] | None) -> str:
    if value is None or value.get("gpus") is None:
        return "-"
    return str(value["gpus"])


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items(), key=lambda c: -c[1]))


def queue_row(q: dict[str, Any]) -> tuple[str, ...]:
    return (
        q["name"] + ("" if q["configured"] else " *"),
        _gpus(q["guarantee"]),
        _gpus(q["max"]),
        f"{q['weight']:g}",
        _gpus(q["usage"]),
        _gpus(q["borrowed"]),
        f"{q['fair_share']:.3f}",
        str(q["pending"]),
        _counts(q["waiting"]) or "-",
    )


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def queues_text(report: dict[str, Any]) -> str:
    """The queues as a table (GPUs), with the policy and the cluster's size."""
    cluster = report["cluster"]
    lines = [f"policy {report['policy']}, {cluster['gpus']} GPUs connected"]
    if not report["queues"]:
        return "\n".join([*lines, "no queues configured and no jobs queued"])
    lines.append(table([HEADER, *(queue_row(q) for q in report["queues"])]))
    if any(not q["configured"] for q in report["queues"]):
        lines.append("* not configured: no guarantee, no max, weight 1")
    return "\n".join(lines)


def explain_text(job: dict[str, Any], report: dict[str, Any]) -> str:
    """A job's state, why it waits, its queue's line, and the last cycle's wait counts."""
    lines = [f"job {job['id']} ({job['name']}) of {job['user']}: {job['state']}"]
    if job["state"] == "pending":
        why = job.get("pending_reason") or {}
        lines.append(f"waiting: {why.get('reason', '?')} [{why.get('code', '?')}]")
        held = job.get("reservation")
        if held:
            nodes = ", ".join(held["node_ids"])
            lines.append(f"reservation: on {nodes}, expected to start at {held['expected_start']}")
    elif job.get("reason"):
        lines.append(f"reason: {job['reason']}")
    if job.get("placement"):
        where = job["placement"]
        lines.append(f"placed on {where['node_id']}: {', '.join(where['gpu_uuids'])}")
    controls = job.get("controls") or {}
    if job["state"] == "running" and controls.get("suspended"):
        how = (
            "time-sliced: another job has its GPUs until its turn comes again"
            if controls.get("time_sliced")
            else "asked by a user: it keeps its GPUs until resumed"
        )
        lines.append(f"suspended since {job.get('suspended_at', '?')}, {how}")
    if job["state"] == "running" and controls.get("packed") and not controls.get("suspended"):
        lines.append(
            f"packed beside job {controls.get('packed_beside', '?')} since"
            f" {job.get('resumed_at', '?')}: the two run at once on its GPUs"
        )
    if job["state"] == "running" and job.get("resizing_to") is not None:
        held = job.get("resizing_to_gpus")
        on = f" ({', '.join(held)})" if held else ""
        lines.append(
            f"resizing to {job['resizing_to']} GPUs{on}: saving a checkpoint, then it"
            " restarts from it"
        )
    elif job["state"] == "running" and job.get("migrating_to"):
        held = job.get("migrating_to_gpus")
        there = f" (holding {', '.join(held)} there)" if held else ""
        lines.append(
            f"migrating to {job['migrating_to']}{there}: saving a checkpoint, then it"
            " resumes there from it"
        )
    if job.get("gpu_range"):
        least, most = job["gpu_range"]
        lines.append(f"elastic: {least} to {most} GPUs, on {job.get('gpus', '?')} now")
    lines.append(f"attempt {job['attempt']}, {job.get('attained_gpu_s', 0):g} GPU-seconds so far")
    mine = [q for q in report["queues"] if q["name"] == job["queue"]]
    lines.append("")
    if mine:
        lines.append(table([HEADER, queue_row(mine[0])]))
    else:
        lines.append(f"queue {job['queue']}: no figures")
    last = report.get("last_cycle")
    if last is not None:
        counts = _counts(last["waiting"]) or "none waiting"
        lines.append("")
        lines.append(f"last cycle ({last['at']}, {last['considered']} pending read): {counts}")
    return "\n".join(lines)
