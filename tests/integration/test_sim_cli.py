"""`schedctl sim` as a real process: a tiny trace, JSON, PNG plots, exit status on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
TRACE = (
    "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,"
    "expect_time_list,expect_value_list,best_effort,job_type\n"
    "0,vc_a,1,0,10,vgg16,10,5,15-20,10-5,0,soft\n"
    "1,vc_b,2,0,10,bert,5,5,100,10,0,strict\n"
    "2,vc_a,4,1,10,vgg16,3,5,9,10,1,best\n"
    "3,vc_a,0,1,10,vgg16,3,5,9,10,1,best\n"
)


def schedctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDCTL, "sim", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_compare_writes_json_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "philly_tiny.csv"
    trace.write_text(TRACE)
    out, plots = tmp_path / "runs.json", tmp_path / "plots"
    model_info = tmp_path / "model_info.json"
    model_info.write_text(json.dumps({"vgg16": {"4": {"2": 0.5}}}))
    result = schedctl(
        "--trace", str(trace), "--format", "chronus", "--cluster", "2x2",
        "--compare", "fifo,fifo", "--model-info", str(model_info),
        "--json", str(out), "--plot", str(plots),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "times in min" in result.stdout
    data = json.loads(out.read_text())
    assert [r["policy"] for r in data["runs"]] == ["fifo"]  # a profile named twice runs once
    [run] = data["runs"]
    # Minutes: job 0 (1 GPU) 0-10; job 1 (2 GPUs) 0-5; job 2 (4 GPUs, 2 nodes at half
    # speed) starts at 10 when job 0 leaves, runs 6 minutes.
    assert run["jct_avg_s"] == (10 + 5 + 15) * 60 / 3
    assert run["deadline_jobs"] == 2 and run["deadline_missed"] == 0
    assert run["dropped_zero_gpu"] == 1
    for name in ("jct_cdf.png", "allocation.png"):
        png = plots / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_compare_puts_each_profile_in_one_table_with_its_own_figures(tmp_path: Path) -> None:
    """Comparing is the point of --compare: each profile must replay on its own, not
    every row the first profile's run under another name."""
    trace = tmp_path / "long_first.csv"
    # One GPU; a 600 s job ahead of two of 60 s, all at 0. FIFO: 600, 660, 720;
    # shortest first: 60, 120, 720.
    trace.write_text("job_id,submit_time,duration,num_gpu\nlong,0,600,1\ns1,0,60,1\ns2,0,60,1\n")
    out = tmp_path / "runs.json"
    result = schedctl(
        "--trace", str(trace), "--format", "csv", "--cluster", "1x1",
        "--compare", "fifo,sjf", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert "avg JCT (s)" in lines[header]
    rows = [line.split() for line in lines[header + 2 :]]
    rows = rows[: rows.index([])]  # the table ends at the first blank line
    assert [(row[0], row[3]) for row in rows] == [("fifo", "660.0"), ("sjf", "300.0")]
    runs = {r["policy"]: r["jct_avg_s"] for r in json.loads(out.read_text())["runs"]}
    assert runs == {"fifo": 660.0, "sjf": 300.0}


def test_bad_input_exits_2_naming_the_option(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    result = schedctl("--trace", str(trace), "--format", "chronus", "--cluster", "12")
    assert result.returncode == 2
    assert "--cluster: expected NODESxGPUS, e.g. 120x8" in result.stderr
    result = schedctl("--trace", str(tmp_path / "none.csv"), "--format", "csv", "--cluster", "1x1")
    assert result.returncode == 2
    assert "--trace: " in result.stderr and "no such file" in result.stderr
