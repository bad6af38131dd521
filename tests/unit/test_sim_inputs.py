"""The simulator's other inputs: cluster shape, locality table, decayed usage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from schedd.sim.cluster import build_nodes
from schedd.sim.locality import LocalityError, LocalityModel, load_table
from schedd.sim.shape import ClusterShape, parse_shape
from schedd.sim.usage import DecayingMeter


@pytest.mark.parametrize(("text", "shape"), [("120x8", (120, 8)), (" 2X4 ", (2, 4))])
def test_cluster_shape(text: str, shape: tuple[int, int]) -> None:
    assert parse_shape(text) == ClusterShape(*shape)


@pytest.mark.parametrize("text", ["12", "x8", "0x8", "2x0", "2x8x1", "two"])
def test_bad_cluster_shape(text: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_shape(text)


def test_nodes_have_uuids_per_gpu_and_room_for_everything_else() -> None:
    nodes = build_nodes(ClusterShape(10, 2))
    assert [n.node_id for n in nodes][:2] == ["n00", "n01"]
    assert [g.uuid for g in nodes[3].gpus] == ["n03-g0", "n03-g1"]
    assert nodes[0].cpus >= 1000 and nodes[0].memory_mib >= 1 << 30


def test_racks_label_consecutive_nodes() -> None:
    assert all(not n.labels for n in build_nodes(ClusterShape(4, 2)))
    nodes = build_nodes(ClusterShape(5, 2, nodes_per_rack=2))
    assert [n.labels["rack"] for n in nodes] == ["r0", "r0", "r1", "r1", "r2"]


def test_locality_table_loads_and_looks_up_nearest(tmp_path: Path) -> None:
    path = tmp_path / "model_info.json"
    path.write_text(json.dumps({"vgg16": {"2": {"1": 1.0, "2": 0.9}, "8": {"2": 0.6, "4": 0.3}}}))
    model = LocalityModel(load_table(path), default=0.7)
    assert model.speed("vgg16", 2, 2) == 0.9
    assert model.speed("vgg16", 16, 2) == 0.6  # nearest GPU count: 8
    assert model.speed("vgg16", 8, 3) == 0.3  # a tie between 2 and 4 nodes: the larger
    assert model.speed("vgg16", 8, 1) == 1.0  # one node: full speed
    assert model.speed("bert", 8, 2) == 0.7  # unknown model: the default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "Expecting value"),
        ("[1]", "expected"),
        ('{"m": {"2": {"2": "fast"}}}', "model 'm'"),
        ('{"m": {"2": {"2": 0}}}', "speeds must be > 0"),
    ],
)
def test_bad_locality_table(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "model_info.json"
    path.write_text(text)
    with pytest.raises(LocalityError, match=message):
        load_table(path)


def test_decayed_usage_is_exact_and_lazy() -> None:
    meter: DecayingMeter[str] = DecayingMeter(half_life_s=10)
    meter.change("q", 4, now=0)
    meter.change("q", -4, now=10)
    tau = 10 / math.log(2)
    assert meter.values(10)["q"] == pytest.approx(4 * tau * 0.5)
    # Nothing held since: it halves every half-life.
    assert meter.values(30)["q"] == pytest.approx(4 * tau * 0.5 / 4)
