from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path, schema_dsn: str) -> Iterator[Cluster]:
    c = Cluster(root=tmp_path, dsn=schema_dsn)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def running(cluster: Cluster) -> Cluster:
    """schedd and two agents with two simulated GPUs each."""
    cluster.start_schedd()
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    return cluster
