"""`schedctl nodes`: GET /v1/nodes as a table, a line per node."""

from __future__ import annotations

from typing import Any

from schedd.cli_queues import table

HEADER = ("NODE", "CONNECTED", "GPUS", "FREE", "JOBS", "FAULTY", "STATE")


def node_row(node: dict[str, Any]) -> tuple[str, ...]:
    gpus = node["gpus"]
    faulty = [g for g in gpus if g.get("fault")]
    jobs = {g["job_id"] for g in gpus if g.get("job_id")}
    free = sum(1 for g in gpus if not g.get("job_id") and not g.get("fault"))
    if node.get("drained_at"):
        state = f"drained by {node['drained_by']}: {node['drain_reason']}"
    else:
        state = "in placement" if node["connected"] else "away"
        if node.get("coordinator") is False:
            state += "; no coordinator"
    return (
        node["node_id"],
        "yes" if node["connected"] else "no",
        str(len(gpus)),
        str(free) if node["connected"] and not node.get("drained_at") else "-",
        str(len(jobs)),
        str(len(faulty)) if faulty else "-",
        state,
    )


def nodes_text(body: dict[str, Any]) -> str:
    """The nodes as a table; FREE counts GPUs a new job could get (none while a node is
    away or drained); a job on two GPUs counts once."""
    if not body["nodes"]:
        return "no nodes have connected yet"
    return table([HEADER, *(node_row(n) for n in body["nodes"])])
