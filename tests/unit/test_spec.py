"""Job spec validation: defaults, bounds, and errors that name the field."""

from __future__ import annotations

import orjson
import pytest

from shared.model import JobKind, SpecError, parse_spec


def body(**fields: object) -> bytes:
    base: dict[str, object] = {"name": "train", "command": ["python3", "train.py"]}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not None})


def test_minimal_spec_gets_sane_defaults() -> None:
    spec = parse_spec(body())
    assert (spec.gpus, spec.cpus, spec.memory_mib, spec.queue, spec.priority) == (
        1,
        1.0,
        1024,
        "default",
        0,
    )
    assert spec.kind is JobKind.GUARANTEED
    assert spec.argv() == ["python3", "train.py"]


def test_full_spec_round_trips() -> None:
    spec = parse_spec(
        body(
            env={"LR": "0.1"},
            cwd="/data",
            gpus=8,
            gpu_memory_mib=40000,
            cpus=16,
            memory_mib=65536,
            queue="vision/detection",
            priority=10,
            kind="opportunistic",
            deadline="2026-12-01T00:00:00Z",
            iterations=1000,
            estimated_runtime_s=5400,
            inputs=["/datasets/imagenet", "https://example.org/x.tar"],
            image="registry/pytorch:2",
            labels={"model": "resnet50", "batch_size": "256"},
        )
    )
    assert spec.kind is JobKind.OPPORTUNISTIC
    assert spec.deadline is not None and spec.deadline.tzinfo is not None
    assert spec.labels["model"] == "resnet50"


def test_script_runs_through_sh() -> None:
    spec = parse_spec(body(command=None, script="echo hi && exit 3"))
    assert spec.argv() == ["/bin/sh", "-c", "echo hi && exit 3"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"gpus": -1}, "gpus"),
        ({"gpus": "2"}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"cpus": 0}, "cpus"),
        ({"memory_mib": 0}, "memory_mib"),
        ({"priority": 5000}, "priority"),
        ({"kind": "urgent"}, "kind"),
        ({"name": "has space"}, "name"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"queue": "UPPER"}, "queue"),
        ({"queue": "a//b"}, "queue"),
        ({"command": []}, "command"),
        ({"command": "python3 x.py"}, "command"),
        ({"command": None}, "command"),
        ({"script": "echo"}, "command"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"env": {"OK": 1}}, "env"),
        ({"command": ["python3", 3]}, "command[1]"),
        ({"cwd": "relative/dir"}, "cwd"),
        ({"deadline": "2026-12-01T00:00:00"}, "deadline"),
        ({"deadline": "tomorrow"}, "deadline"),
        ({"estimated_runtime_s": 0}, "estimated_runtime_s"),
        ({"estimated_runtime_s": "10"}, "estimated_runtime_s"),
        ({"iterations": 0}, "iterations"),
        ({"labels": {"k": 3}}, "labels"),
        ({"surprise": True}, "surprise"),
        ({"gpu_memory_mib": -5}, "gpu_memory_mib"),
    ],
)
def test_bad_field_is_named(fields: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(body(**fields))
    assert err.value.field == field, err.value


@pytest.mark.parametrize("raw", [b"{", b"[]", b'"x"', b"null", b"\xff\xfe"])
def test_not_a_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(SpecError):
        parse_spec(raw)
