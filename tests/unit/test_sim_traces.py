"""Trace readers: units, deadlines, 0-GPU rows dropped, order, and errors that say where."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedd.sim.traces import TraceError, TraceJob, read_trace

ITP = """job_id,submission_time,duration,num_gpu
a,100,600,1
b,50,1200,8
z,60,30,0
"""

ITP_DEADLINE = (
    "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
    """a,100,10,vgg16,5000,64,2,600
b,200,10,bert,9000,32,0,100
"""
)

CHRONUS = (
    "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,"
    "expect_time_list,expect_value_list,best_effort,job_type\n"
    """0,vc_a,1,5,10,resnet101,20,5,30-40-50,10-8-5,0,soft
1,vc_b,4,2,10,alexnet,7,6,900,10,1,best
2,vc_a,0,3,10,vgg16,1,6,5,10,0,strict
"""
)

PLAIN = """job_id,submit_time,duration,num_gpu,user,queue,name,deadline
x,10,100,2,alice,org/team,bert,500
y,10,50,1,,,,
"""

PLAIN_MINIMAL = """job_id,submit_time,duration,num_gpu
only,0,1,1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("fmt", "text", "jobs", "dropped"),
    [
        (
            "itp",
            ITP,
            [TraceJob("b", 50, 1200, 8), TraceJob("a", 100, 600, 1)],
            1,
        ),
        (
            "itp-deadline",
            ITP_DEADLINE,
            [TraceJob("a", 100, 600, 2, name="vgg16", deadline_s=5000)],
            1,
        ),
        (
            "chronus",
            CHRONUS,
            [
                # Minutes become seconds; best-effort jobs have no deadline.
                TraceJob("1", 120, 420, 4, "vc_b", "vc_b", "alexnet", None),
                # The first deadline: submission + the first expected time.
                TraceJob("0", 300, 1200, 1, "vc_a", "vc_a", "resnet101", (5 + 30) * 60),
            ],
            1,
        ),
        (
            "csv",
            PLAIN,
            [
                TraceJob("x", 10, 100, 2, "alice", "org/team", "bert", 500),
                TraceJob("y", 10, 50, 1),  # empty optional cells take the defaults
            ],
            0,
        ),
        ("csv", PLAIN_MINIMAL, [TraceJob("only", 0, 1, 1)], 0),
    ],
    ids=["itp", "itp-deadline", "chronus", "csv", "csv-minimal"],
)
def test_reader(tmp_path: Path, fmt: str, text: str, jobs: list[TraceJob], dropped: int) -> None:
    trace = read_trace(write(tmp_path, text), fmt)
    assert list(trace.jobs) == jobs
    assert trace.dropped_zero_gpu == dropped
    assert trace.has_deadlines == any(j.deadline_s is not None for j in jobs)


def test_limit_takes_the_earliest_rows_zero_gpu_ones_included(tmp_path: Path) -> None:
    trace = read_trace(write(tmp_path, ITP), "itp", limit=2)  # b (50) and z (60, 0 GPUs)
    assert [j.job_id for j in trace.jobs] == ["b"]
    assert trace.dropped_zero_gpu == 1


def test_equal_submission_times_keep_file_order(tmp_path: Path) -> None:
    text = "job_id,submit_time,duration,num_gpu\nfirst,5,1,1\nsecond,5,1,1\nearly,1,1,1\n"
    trace = read_trace(write(tmp_path, text), "csv")
    assert [j.job_id for j in trace.jobs] == ["early", "first", "second"]


@pytest.mark.parametrize(
    ("fmt", "text", "message"),
    [
        ("itp", "job_id,duration,num_gpu\na,1,1\n", "missing columns submission_time"),
        ("csv", "job_id,submit_time,duration,num_gpu\na,x,1,1\n", ":2: column 'submit_time'"),
        ("csv", "job_id,submit_time,duration,num_gpu\na,1,-5,1\n", "expected a number >= 0"),
        ("csv", "job_id,submit_time,duration,num_gpu\na,1,1,1.5\n", "expected a whole number"),
        ("csv", "job_id,submit_time,duration,num_gpu\na,1,1,1\na,2,1,1\n", "appears twice"),
        (
            "chronus",
            CHRONUS.replace("30-40-50", "soon"),
            "column 'expect_time_list'",
        ),
        ("chronus", CHRONUS.replace(",0,soft", ",2,soft"), "expected 0 or 1"),
        ("swf", PLAIN, "unknown trace format 'swf'"),
    ],
)
def test_bad_traces_say_where(tmp_path: Path, fmt: str, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, text), fmt)
