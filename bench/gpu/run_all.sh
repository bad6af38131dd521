#!/bin/sh
# Every GPU figure of docs/gpu.md in one go, on an otherwise idle GPU: the agent's NVML
# backend, the memory cap, a time-slicing switch, the coordinated pair once per
# coordinator cut factor (--decrease), then a history of training jobs' peak memory
# and utilisation for the estimator's accuracy. About 4 minutes plus 2.5 per factor
# with the defaults below, then the history (not yet timed on a GPU: 40 jobs of 6 s
# of steps each, 4 at a time).
#
#   bench/gpu/run_all.sh [OUT_DIR]        # default OUT_DIR: gpu-results
#
# PYTHON picks the interpreter (default .venv/bin/python); it needs a CUDA build of
# PyTorch and the project's dependencies. DECREASES lists the cut factors (default
# "0.5 0.8"); PAIR_ARGS adds flags to every coordinated_pair.py run; HISTORY_ARGS are
# memory_history.py's (default: 40 jobs, 4 at a time, memory only). Each script's
# table goes to OUT_DIR/NAME.txt and its JSON to OUT_DIR/NAME.json; a script that
# fails is reported and the rest still run. Exit status: the number that failed.
set -u
here=$(dirname "$0")
out=${1:-gpu-results}
python=${PYTHON:-.venv/bin/python}
decreases=${DECREASES:-0.5 0.8}
pair_args=${PAIR_ARGS:---seconds 90 --solo-seconds 20 --overhead-steps 100 --overhead-repeats 1}
history_args=${HISTORY_ARGS:---jobs 40 --parallel 4}
mkdir -p "$out"
failed=0

run() {
    name=$1
    script=$2
    shift 2
    started=$(date +%s)
    if PYTHONUNBUFFERED=1 "$python" "$here/$script" "$@" --json "$out/$name.json" >"$out/$name.txt" 2>&1; then
        echo "$name: done in $(($(date +%s) - started)) s"
    else
        echo "$name: FAILED (status $?); see $out/$name.txt"
        failed=$((failed + 1))
    fi
}

run nvml_backend nvml_backend.py
run memory_cap memory_cap.py --capped-seconds 25
run suspend_resume suspend_resume.py
first=yes
for d in $decreases; do
    # The shim's overhead is measured once, in the first run.
    if [ "$first" = yes ]; then extra=""; else extra="--overhead-steps 0"; fi
    # shellcheck disable=SC2086  # the flags are meant to split
    run "pair_decrease_$d" coordinated_pair.py $pair_args $extra --decrease "$d"
    first=no
done
# shellcheck disable=SC2086  # the flags are meant to split
run memory_history memory_history.py $history_args --history "$out/memory_history.csv"
exit "$failed"
