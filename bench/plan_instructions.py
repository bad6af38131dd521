"""Instructions of one plan on the planning benchmark's snapshots, counted by callgrind.

A cycle's time on a shared VM moves by a fifth and more from one hour to the next; the
count of instructions the interpreter runs for one `plan()` call came out the same run
after run, so two commits compare by it on any machine. Needs valgrind.
Each case runs in its own `valgrind --tool=callgrind` child with PYTHONHASHSEED=0 that
builds the snapshot of `bench/planning_speed.py` (for the backlog cases, with the jobs
the plan before made opportunistic turned so), and counts only inside the plan call:
collection is on inside `functools.reduce`, which calls the plan and nothing else does.

    .venv/bin/python bench/plan_instructions.py [--profile default]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.planning_speed import build
from schedd import policy
from schedd.policy.actions import SetKind
from schedd.policy.snapshot import OPPORTUNISTIC, Snapshot

CASES = (
    ("empty", 0.0, False),
    ("empty, backlog opportunistic", 0.0, True),
    ("half full", 0.5, False),
    ("half full, backlog opportunistic", 0.5, True),
)
NOW = 100_000.0  # as in bench/planning_speed.py


def window(prof: policy.Profile, busy: float) -> Snapshot:
    snap = build(1000, 8, 10_000, 20, busy, seed=1)
    return Snapshot(
        snap.nodes, snap.placed, snap.pending[: prof.pending_window], queues=snap.queues
    )


def turned(prof: policy.Profile, snap: Snapshot) -> set[str]:
    """The jobs the plan of `snap` makes opportunistic."""
    return {
        a.job_id
        for a in prof.plan(snap, NOW).actions
        if isinstance(a, SetKind) and a.kind == OPPORTUNISTIC
    }


def child(profile: str, busy: float, backlog: bool) -> None:
    prof = policy.profile(profile)
    snap = window(prof, busy)
    if backlog:
        made = turned(prof, snap)
        pending = tuple(
            dataclasses.replace(j, kind=OPPORTUNISTIC if j.job_id in made else j.kind)
            for j in snap.pending
        )
        # New objects, as bench/planning_speed.py plans: what the policy keeps between
        # plans of the same objects must not flatter this one.
        snap = Snapshot(
            tuple(dataclasses.replace(n) for n in snap.nodes),
            tuple(dataclasses.replace(j) for j in snap.placed),
            pending,
            queues=snap.queues,
        )
    gc.collect()
    gc.disable()  # as schedd's cycle runs (`schedd.collector`)
    functools.reduce(lambda _a, _b: prof.plan(snap, NOW).with_recheck_found(), (0, 1))


def count(profile: str, busy: float, backlog: bool) -> int:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--toggle-collect=functools_reduce",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        f"{busy}",
        *(["--backlog"] if backlog else []),
        "--profile",
        profile,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no count in callgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="default")
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backlog", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.profile, args.child, args.backlog)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    print(f"instructions of one plan, profile {args.profile}; python {sys.version.split()[0]}")
    prof = policy.profile(args.profile)
    for label, busy, backlog in CASES:
        if backlog and not turned(prof, window(prof, busy)):
            continue  # a profile without AntMan's kinds over time has no backlog case
        print(f"{label:<36} {count(args.profile, busy, backlog) / 1e6:>8,.0f} M", flush=True)


if __name__ == "__main__":
    main()
