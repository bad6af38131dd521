"""A job larger than any node runs as a gang over two real agents, driven with curl: its
parts find each other through the head's address and port, its logs are read by rank,
and a part that fails takes the others down with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.processes import alive

pytestmark = pytest.mark.e2e
PY = sys.executable

# Rank 0 listens where the gang says its head is; the other rank connects and says who it
# is: what torch.distributed's rendezvous does, with nothing but sockets.
RENDEZVOUS = """
import os, socket, time
rank, size = int(os.environ["GPUSCHED_GANG_RANK"]), os.environ["NNODES"]
head, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
gpus = os.environ["CUDA_VISIBLE_DEVICES"]
if rank == 0:
    server = socket.create_server((head, port))
    server.settimeout(60)
    peer, _ = server.accept()
    print(f"rank 0 of {size} on {gpus} heard: {peer.recv(1024).decode()}", flush=True)
else:
    for _ in range(600):
        try:
            peer = socket.create_connection((head, port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(f"rank {rank} on {gpus}".encode())
    print(f"rank {rank} of {size} told the head at {head}:{port}", flush=True)
"""


def test_a_gang_over_two_nodes_meets_at_its_head_and_succeeds(running: Cluster) -> None:
    alice = running.token("alice")
    job_id = running.submit(alice, command=[PY, "-c", RENDEZVOUS], gpus=4)
    job = running.wait_state(alice, job_id, "succeeded", "failed", timeout=60)
    assert job["state"] == "succeeded", job
    parts = job["placement"]["parts"]
    assert [p["rank"] for p in parts] == [0, 1]
    assert {p["node_id"] for p in parts} == {"node-a", "node-b"}
    assert all(p["exit_code"] == 0 and p["ended_at"] for p in parts)
    assert job["placement"]["node_id"] == parts[0]["node_id"]
    assert sorted(job["placement"]["gpu_uuids"]) == sorted(u for p in parts for u in p["gpu_uuids"])
    first, second = (",".join(p["gpu_uuids"]) for p in parts)
    rank0 = running.curl("GET", f"/v1/jobs/{job_id}/logs", alice).text
    assert rank0 == f"rank 0 of 2 on {first} heard: rank 1 on {second}\n"
    rank1 = running.curl("GET", f"/v1/jobs/{job_id}/logs?rank=1", alice).text
    assert rank1.startswith("rank 1 of 2 told the head at ")
    assert running.schedctl(alice, "logs", "--rank", "1", job_id) == rank1


def test_a_failing_part_takes_the_gang_down(running: Cluster, tmp_path: Path) -> None:
    alice = running.token("alice")
    pid_file = tmp_path / "rank0.pid"
    code = (
        "import os, time\n"
        "if os.environ['GPUSCHED_GANG_RANK'] == '0':\n"
        f"    open({str(pid_file)!r} + '.new', 'w').write(str(os.getpid()))\n"
        f"    os.replace({str(pid_file)!r} + '.new', {str(pid_file)!r})  # whole, or not there\n"
        "    time.sleep(300)\n"
        "else:\n"
        f"    while not os.path.exists({str(pid_file)!r}):\n"
        "        time.sleep(0.05)\n"
        "    raise SystemExit(3)\n"
    )
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=4)
    job = running.wait_state(alice, job_id, "failed", "succeeded", timeout=60)
    rank1 = job["placement"]["parts"][1]["node_id"]
    assert (job["state"], job["exit_code"]) == ("failed", 3)
    assert job["reason"] == f"part 1 on node {rank1}: exited with code 3"
    rank0 = job["placement"]["parts"][0]
    assert rank0["exit_signal"] == 15  # stopped by the gang's break-up, not its own end
    pid = int(pid_file.read_text())
    wait_until(lambda: not alive(pid), timeout=10, what="rank 0 gone")
