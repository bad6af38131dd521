"""Draining a node on real daemons, with schedctl and curl: a job running there runs on,
a new one goes to the other node, and the drained node takes jobs again once put back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e


def test_a_drained_node_runs_its_jobs_on_and_takes_no_new_one(cluster: Cluster) -> None:
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=1)
    cluster.start_agent("node-b", gpus=1)
    admin, alice = cluster.token("root", admin=True), cluster.token("alice")
    first = cluster.submit(alice, script="sleep 300", gpus=1)
    where = cluster.wait_state(alice, first, "running")["placement"]["node_id"]
    other = "node-b" if where == "node-a" else "node-a"

    said = json.loads(cluster.schedctl(admin, "drain", where, "--reason", "swap a disk"))
    assert (said["drain"]["reason"], said["jobs"], said["requeued"]) == ("swap a disk", [first], [])
    nodes = {n["node_id"]: n for n in cluster.curl("GET", "/v1/nodes", admin).body["nodes"]}
    assert (nodes[where]["drain_reason"], nodes[where]["drained_by"]) == ("swap a disk", "root")
    assert nodes[other]["drained_at"] is None
    lines = {line.split()[0]: line for line in cluster.schedctl(admin, "nodes").splitlines()}
    assert lines[where].endswith("drained by root: swap a disk"), lines
    assert lines[other].split()[1:] == ["yes", "1", "1", "0", "-", "in", "placement"], lines
    listed = json.loads(cluster.schedctl(admin, "nodes", "--json"))["nodes"]
    assert {n["node_id"] for n in listed} == {"node-a", "node-b"}

    # A user may not drain a node; the admin's own drain stands.
    refused = cluster.curl("POST", f"/v1/nodes/{other}/drain", alice, {"reason": "mine"})
    assert refused.status == 403, refused.text

    # The second job (two would not fit on the drained node anyway) goes to the other
    # node; a third waits, though the drained node will have a GPU free once the first
    # is cancelled.
    second = cluster.submit(alice, script="sleep 300", gpus=1)
    assert cluster.wait_state(alice, second, "running")["placement"]["node_id"] == other
    assert cluster.job(alice, first)["state"] == "running"
    cancelled = cluster.curl("POST", f"/v1/jobs/{first}/cancel", alice)
    assert cancelled.status == 202, cancelled.text
    cluster.wait_state(alice, first, "cancelled")
    third = cluster.submit(alice, script="sleep 300", gpus=1)

    def considered() -> dict[str, Any] | None:
        job = cluster.job(alice, third)
        code = (job.get("pending_reason") or {}).get("code")
        return job if job["state"] != "pending" or code not in (None, "not_considered") else None

    waiting = wait_until(considered, 30, "the third job considered by a cycle")
    assert waiting["state"] == "pending", waiting

    cluster.schedctl(admin, "undrain", where)
    assert cluster.wait_state(alice, third, "running")["placement"]["node_id"] == where
    log = [json.loads(line) for line in cluster.log("schedd").splitlines() if line[:1] == "{"]
    events = [(e["event"], e.get("node_id")) for e in log if "node" in e.get("event", "")]
    assert ("node drained", where) in events and ("node back in placement", where) in events
    for job_id in (second, third):
        cluster.curl("POST", f"/v1/jobs/{job_id}/cancel", alice)
