#!/usr/bin/env bash
# Every replay behind the tables of docs/evaluation.md (and the ITP comparison of
# docs/simulator.md), one after another, each command as the doc gives it; the figures
# of each go to OUT/<name>.txt, plots under OUT/img. Hours on a 2-core machine: run it
# under nohup or tmux. Starts from a given step with FROM=<name> (steps: see `--list`).
#
#     bench/evaluation.sh TRACES OUT        # TRACES: the traces directory
#     bench/evaluation.sh --list            # the steps and their commands
set -euo pipefail

cd "$(dirname "$0")/.."
PY=.venv/bin/python
SCHEDCTL=.venv/bin/schedctl

steps() {
    # Quoted for the shell that runs each command, so that a path may hold spaces.
    local t o
    t=$(printf %q "$1")
    o=$(printf %q "$2")
    local mix2=$t/chronus/philly_MIX2.csv
    local elastic_six=cluster01,cluster02,cluster03,cluster05,cluster06,cluster10
    # Chronus on MIX2 (with the default and the default before it beside the peers).
    echo "chronus_mix2|$SCHEDCTL sim --trace $mix2 --format chronus --cluster 120x8 --model-info $t/chronus/model_info.json --compare chronus,tiresias,fifo,default-guaranteed,default --plot $o/img/chronus"
    for trace in MIX1 SLO; do
        echo "chronus_$trace|$SCHEDCTL sim --trace $t/chronus/philly_$trace.csv --format chronus --cluster 120x8 --model-info $t/chronus/model_info.json --compare chronus,tiresias,fifo,default-guaranteed,default"
    done
    # MIX2 with preemption overheads (60 s held, the work since a half-hourly checkpoint lost).
    echo "chronus_mix2_overheads|$SCHEDCTL sim --trace $mix2 --format chronus --cluster 120x8 --model-info $t/chronus/model_info.json --compare chronus,tiresias,default-guaranteed,default-deadlines --preempt-overhead 60 --checkpoint-interval 1800"
    # The default's order with Chronus's admission, alone and with the kinds over time.
    echo "default_deadlines_mix2|$SCHEDCTL sim --trace $mix2 --format chronus --cluster 120x8 --model-info $t/chronus/model_info.json --compare default-deadlines"
    echo "default_deadlines_kinds|$PY bench/tie_breaks.py --trace-dir $t --profiles default-deadlines+opportunistic --seeds 0,1,2"
    # The default and its variants over tie-break seeds and the three preemption models.
    echo "tie_breaks|$PY bench/tie_breaks.py --trace-dir $t --profiles default,default-deadlines --seeds 0,1,2,3"
    for overheads in none save; do
        echo "tie_breaks_$overheads|$PY bench/tie_breaks.py --trace-dir $t --profiles default,default-guaranteed,default-deadlines --seeds 0,1,2 --overheads $overheads"
    done
    echo "tie_breaks_lose|$PY bench/tie_breaks.py --trace-dir $t --profiles default --seeds 0 --overheads lose"
    echo "tie_breaks_lose_variants|$PY bench/tie_breaks.py --trace-dir $t --profiles default-deadlines,default-guaranteed --seeds 0,1 --overheads lose"
    # Liquid: the estimator's accuracy, what it buys, and the network-aware placement.
    echo "estimator_accuracy|$PY bench/estimator_accuracy.py --trace-dir $t"
    for order in sjf backfill; do
        for estimates in history forest oracle; do
            echo "estimates_${order}_$estimates|$SCHEDCTL sim --trace $mix2 --format chronus --cluster 120x8 --model-info $t/chronus/model_info.json --policy $order --estimates $estimates"
        done
    done
    # The five profiles the seed systems' issue names, side by side under one model.
    echo "seed_itp|$PY bench/seed_policies.py --trace-dir $t --profiles gandiva,antman,liquid,tiresias,default --locality 0.8 --rack-size 4 --cross-rack 0.8 --gpu-util 10-100 --plot $o/img/seed_itp"
    echo "liquid_itp|$PY bench/seed_policies.py --trace-dir $t --profiles liquid,liquid@best_fit,tiresias,default-guaranteed,default --locality 0.8 --rack-size 4 --cross-rack 0.8"
    echo "liquid_mix2|$PY bench/seed_policies.py --trace-dir $t --traces mix2 --profiles liquid,liquid@best_fit,default-guaranteed,default-guaranteed@network --locality 0.8 --rack-size 4 --cross-rack 0.8"
    # AntMan and Gandiva on the ITP traces, grow/shrink, Gandiva's mechanisms on the default's order.
    echo "antman_itp|$PY bench/seed_policies.py --trace-dir $t --profiles antman,drf,tiresias,default-guaranteed,default-guaranteed+opportunistic --gpu-util 10-100"
    echo "gandiva_itp|$PY bench/seed_policies.py --trace-dir $t --profiles gandiva,liquid@topology --gpu-util 10-100"
    echo "elastic_gandiva|$PY bench/seed_policies.py --trace-dir $t --elastic 0.5 --profiles gandiva --clusters $elastic_six --jobs 1 --gpu-util 10-100"
    echo "elastic_default_gandiva|$PY bench/seed_policies.py --trace-dir $t --elastic 0.5 --profiles default-gandiva --clusters $elastic_six --jobs 1 --gpu-util 10-100"
    echo "elastic_other_four|$PY bench/seed_policies.py --trace-dir $t --elastic 0.5 --profiles gandiva,default-gandiva --clusters cluster04,cluster07,cluster08,cluster09 --jobs 2 --gpu-util 10-100"
    echo "default_gandiva_itp|$PY bench/seed_policies.py --trace-dir $t --profiles default-gandiva,default-guaranteed --jobs 1 --gpu-util 10-100"
    # The default against fifo and tiresias on every ITP trace (docs/simulator.md).
    echo "itp_compare|$PY bench/itp_compare.py --trace-dir $t --plot $o/img/itp"
}

if [[ ${1:-} == --list ]]; then
    steps TRACES OUT | sed 's/|/\n    /'
    exit 0
fi
if [[ $# -ne 2 || -z $1 || -z $2 ]]; then
    echo "usage: $0 TRACES OUT  (or --list)" >&2
    exit 2
fi
traces=$(cd "$1" && pwd)
mkdir -p "$2/img"
out=$(cd "$2" && pwd)
[[ -f $traces/chronus/philly_MIX2.csv ]] || { echo "no chronus/philly_MIX2.csv under $traces" >&2; exit 2; }
started=${FROM:-}
while IFS='|' read -r name command; do
    if [[ -n $started && $name != "$started" ]]; then
        continue
    fi
    started=
    echo "== $name: $command"
    start=$(date +%s)
    eval "$command" >"$out/$name.txt" 2>&1 || { echo "   failed: see $out/$name.txt" >&2; exit 1; }
    echo "   $(($(date +%s) - start)) s, figures in $out/$name.txt"
done < <(steps "$traces" "$out")
