"""As root, the embedded database refuses a data directory that belongs to someone else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedd.store import embedded


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can be refused this way")
def test_root_does_not_take_over_a_service_users_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 65534, 65534)
    with pytest.raises(embedded.EmbeddedPostgresError, match="uid 65534"):
        embedded.start(data)
    assert not (data / "postgres").exists()
    assert data.stat().st_uid == 65534
