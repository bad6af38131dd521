"""A copy of the traces directory with each trace cut to its first N jobs.

`make evaluation` takes many hours on the whole traces; on traces cut short it runs
every step in a minute or two, which checks that each command still runs end to end
(its figures mean nothing). Every CSV under TRACES is copied with its header and its
first `--jobs` rows; every other file (model_info.json, licences) is copied whole.

    .venv/bin/python bench/cut_traces.py TRACES OUT [--jobs 119]
    make evaluation TRACES=OUT OUT=/tmp/evaluation-check
"""

from __future__ import annotations

import argparse
import itertools
import shutil
from pathlib import Path


def cut(traces: Path, out: Path, jobs: int) -> int:
    """Copies TRACES into OUT, each CSV cut to `jobs` rows; the number of CSVs cut."""
    cut_files = 0
    for source in sorted(p for p in traces.rglob("*") if p.is_file()):
        target = out / source.relative_to(traces)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.suffix != ".csv":
            shutil.copyfile(source, target)
            continue
        with source.open() as f, target.open("w") as g:
            g.writelines(itertools.islice(f, jobs + 1))  # the header, then `jobs` rows
        cut_files += 1
    return cut_files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path, help="the traces directory")
    ap.add_argument("out", type=Path, help="where the cut copy goes (created)")
    ap.add_argument("--jobs", type=int, default=119, help="rows kept of each trace")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if not args.traces.is_dir():
        ap.error(f"traces: {args.traces} is not a directory")
    if args.out.resolve() == args.traces.resolve():
        ap.error("out: must not be the traces directory itself")
    n = cut(args.traces, args.out, args.jobs)
    print(f"{n} traces cut to {args.jobs} jobs each under {args.out}")


if __name__ == "__main__":
    main()
