"""`schedctl sim` in-process: bad input names the option and the reason, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedd.cli import main

TRACE = (
    "job_id,submit_time,duration,num_gpu,queue\na,0,60,1,x\nb,0,120,2,y\nc,30,60,1,x\nz,0,5,0,x\n"
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text(TRACE)
    return path


def sim(*args: str) -> list[str]:
    return ["sim", *args]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "12"], "--cluster: expected NODESxGPUS, e.g. 120x8"),
        (["--policy", "nope"], "--policy: unknown profile 'nope'; known: "),
        (["--compare", "fifo,nope"], "--compare: unknown profile 'nope'"),
        (["--format", "swf"], "--format: invalid choice: 'swf'"),
        (["--limit", "0"], "--limit: expected a whole number >= 1"),
        (["--preempt-overhead", "-1"], "--preempt-overhead: expected seconds >= 0"),
        (["--suspend-overhead", "-1"], "--suspend-overhead: expected seconds >= 0"),
        (["--migrate-overhead", "soon"], "--migrate-overhead: expected seconds, got 'soon'"),
        (["--elastic", "2"], "--elastic: expected a fraction in [0, 1], got '2'"),
        (["--elastic", "some"], "--elastic: expected a fraction, got 'some'"),
        (["--resize-overhead", "-1"], "--resize-overhead: expected seconds >= 0"),
        (["--pack-slowdown", "1"], "--pack-slowdown: expected 0 <= x < 1, got '1'"),
        (["--checkpoint-interval", "0"], "--checkpoint-interval: expected seconds > 0"),
        (["--locality-default", "2"], "--locality-default: expected a relative speed in (0, 1]"),
        (["--model-info", "MISSING"], "--model-info: "),
        (["--queues", "MISSING"], "--queues: MISSING: No such file"),
        (["--json", "NO/SUCH/DIR/out.json"], "--json: NO/SUCH/DIR: no such directory"),
    ],
)
def test_bad_option(
    trace: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    base = {"--trace": str(trace), "--format": "csv", "--cluster": "1x2"}
    for option, value in zip(args[::2], args[1::2], strict=True):
        base[option] = value
    argv = sim(*[x for pair in base.items() for x in pair])
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(SystemExit) as exit_info:
        main(sim("--trace", str(missing), "--format", "csv", "--cluster", "1x1"))
    assert exit_info.value.code == 2
    assert f"--trace: {missing}: no such file" in capsys.readouterr().err


def test_malformed_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,duration,num_gpu\na,0,soon,1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(sim("--trace", str(bad), "--format", "csv", "--cluster", "1x1"))
    assert exit_info.value.code == 2
    assert "--trace: " in (err := capsys.readouterr().err)
    assert "bad.csv:2: column 'duration'" in err


def test_a_run_prints_the_table_and_writes_json(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    main(sim("--trace", str(trace), "--format", "csv", "--cluster", "1x2", "--json", str(out)))
    text = capsys.readouterr().out
    assert "tiny.csv (csv, 3 jobs) on 1x2 GPUs; times in s" in text
    assert "1 jobs with 0 GPUs dropped" in text
    data = json.loads(out.read_text())
    assert data["trace"]["dropped_zero_gpu"] == 1
    [run] = data["runs"]
    # FIFO on 2 GPUs: a 0-60, b (2 GPUs) 60-180, c 180-240.
    assert run["policy"] == "fifo"
    assert run["jct_avg_s"] == pytest.approx((60 + 180 + 210) / 3)
    assert run["makespan_s"] == 240
    assert {q["name"] for q in run["queues"]} == {"x", "y"}


def test_live_commands_do_not_import_matplotlib() -> None:
    code = (
        "import sys, schedd.main, schedd.cli, agentd.main\n"
        "from schedd.sim import cli, engine, report, replay\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_queues_come_from_the_live_config_format(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queues = tmp_path / "schedd.toml"
    queues.write_text('[queues."x"]\nguarantee_gpus = 2\nweight = 2.0\n')
    out = tmp_path / "out.json"
    main(
        sim(
            "--trace", str(trace), "--format", "csv", "--cluster", "1x2",
            "--queues", str(queues), "--json", str(out),
        )
    )  # fmt: skip
    [run] = json.loads(out.read_text())["runs"]
    x = next(q for q in run["queues"] if q["name"] == "x")
    assert (x["weight"], x["guarantee_gpus"]) == (2.0, 2)
    # x waits behind b (queue y, both GPUs) from 30 (c's arrival) to 180, under 2 GPUs.
    assert x["below_guarantee_s"] == 150
    assert "below guarantee (s)" in capsys.readouterr().out


def test_a_bad_queue_file_names_the_key(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queues = tmp_path / "schedd.toml"
    queues.write_text('[queues."x"]\nguarantee = 2\n')
    argv = sim(
        "--trace", str(trace), "--format", "csv", "--cluster", "1x2", "--queues", str(queues)
    )
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert 'queues."x".guarantee: unknown key' in capsys.readouterr().err


def test_deadlines_racks_and_estimates_reach_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "slo.csv"
    # `a` has a deadline; `b` and the 2-GPU gang `c` (two 1-GPU nodes in two racks: at
    # half speed, 10 s of work take 20) are best-effort.
    trace.write_text("job_id,submit_time,duration,num_gpu,deadline\na,0,60,1,1000\nb,0,120,1,\n"
                     "c,200,10,2,\n")  # fmt: skip
    out = tmp_path / "out.json"
    args = ["--trace", str(trace), "--format", "csv", "--cluster", "2x1", "--rack-size", "1",
            "--cross-rack-speed", "0.5", "--estimates", "history", "--suspend-overhead", "0.25",
            "--migrate-overhead", "12.5", "--json", str(out)]  # fmt: skip
    main(sim(*args))
    assert "best-effort avg JCT (s)" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["options"]["cross_rack_speed"], data["options"]["estimates"]) == (0.5, "history")
    options = data["options"]
    assert (options["suspend_overhead_s"], options["migrate_overhead_s"]) == (0.25, 12.5)
    [run] = data["runs"]
    assert run["deadline_miss_rate"] == 0.0
    assert run["jct_best_effort_avg_s"] == pytest.approx((120 + 20) / 2)
