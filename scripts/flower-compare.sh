#!/usr/bin/env bash
# The quickstart job side by side with Flower 1.41 (simulation engine, PyTorch 2.15 client,
# scripts/flower_mnist.py): 100 clients of two label shards, 10 per round, the server evaluating
# on the 10,000 test examples every round. MODEL `mlp`: the 784-600-100-10 MLP, E = 1, B = 50,
# lr 0.1, target 0.92 test accuracy; `cnn`: configs/quickstart-cnn.toml, McMahan et al.'s CNN,
# E = 5, B = 10, lr 0.05, target 0.99; `secure`: the MLP job with all 100 clients in every round
# and the sum through secure aggregation, SecAgg+ on both sides with no dropouts: fl's
# configs/secagg-plain.toml on the regular graph (k = 20 neighbours, t = ceil(0.7 k) = 14) against
# Flower's SecAggPlusWorkflow with 21 shares (its own and one per neighbour) and a threshold of 15
# shares; fl's signed variant (malicious-server protections, configs/secagg-signed.toml's
# sim_signed) runs beside them as `fl-signed`. Runs are alternated; prints each run's median round
# time and time to the target, and the ratios of the means.
#
#   scripts/flower-compare.sh [RUNS] [ROUNDS] [MODEL]   (defaults 3 100 mlp; on an idle machine)
#
# With COMPETING_LOAD=1 a busy loop (one Python process spinning) runs on the side for the whole
# comparison: both systems then share the two cores with it.
#
# The first run makes a venv in ${FLOWER_VENV:-target/flower-venv} with flwr[simulation]==1.41.0
# and torch==2.15.0 from PyPI (about 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rounds=${2:-100}
model=${3:-mlp}
case "$model" in
  mlp) config=configs/quickstart.toml; target=0.92
       export FLOWER_EPOCHS=1 FLOWER_BATCH=50 FLOWER_LR=0.1 ;;
  cnn) config=configs/quickstart-cnn.toml; target=0.99
       export FLOWER_EPOCHS=5 FLOWER_BATCH=10 FLOWER_LR=0.05 ;;
  secure) config=configs/secagg-plain.toml; target=0.92
       export FLOWER_EPOCHS=1 FLOWER_BATCH=50 FLOWER_LR=0.1 FLOWER_SECURE=1 FLOWER_SHARES=21 \
         FLOWER_THRESHOLD=15 ;;
  *) echo "MODEL is mlp, cnn or secure" >&2; exit 2 ;;
esac
export FLOWER_MODEL=${model/secure/mlp}
secure=(--set server.clients_per_round=100 --set secagg.graph=regular --set secagg.threshold=0.7)
fl_job() { # OUT SETTINGS...: the fl side of one run
  local out=$1
  shift
  ./target/release/fl sim --config "$config" --set train.epochs="$FLOWER_EPOCHS" \
    --set train.batch_size="$FLOWER_BATCH" --set train.learning_rate="$FLOWER_LR" \
    --rounds "$rounds" --out "$out" "$@" > /dev/null 2>&1
  cp "$out/metrics.jsonl" "$out.jsonl"
}
venv=${FLOWER_VENV:-target/flower-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "flwr[simulation]==1.41.0" "torch==2.15.0"
fi
cargo build --release --quiet -p fl-cli
out=$(mktemp -d)
if [ "${COMPETING_LOAD:-0}" = 1 ]; then
  python3 -c 'while True: pass' &
  load=$!
  trap 'kill $load' EXIT
fi
for i in $(seq 1 "$runs"); do
  if [ "$model" = secure ]; then
    fl_job "$out/fl-$i" "${secure[@]}"
    fl_job "$out/fl-signed-$i" "${secure[@]}" --set secagg.sim_signed=true
  else
    fl_job "$out/fl-$i"
  fi
  PYTHONPATH=scripts "$venv/bin/python" scripts/flower_mnist.py "$out/flower-$i.jsonl" "$rounds" > "$out/flower-$i.log" 2>&1
done
python3 - "$out" "$runs" "$target" <<'PY'
import json, os, statistics, sys
out, runs, target = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def run(path):
    rows = [json.loads(l) for l in open(path)]
    elapsed, reached = 0.0, None
    for r in rows:
        elapsed += r["seconds"]
        if reached is None and r["test_accuracy"] >= target:
            reached = (r["round"], elapsed)
    return statistics.median(r["seconds"] for r in rows), reached
summary = {}
for who in ("fl", "fl-signed", "flower"):
    if not os.path.exists(f"{out}/{who}-1.jsonl"):
        continue
    summary[who] = [run(f"{out}/{who}-{i}.jsonl") for i in range(1, runs + 1)]
    for median, reached in summary[who]:
        when = f"round {reached[0]} after {reached[1]:.1f} s" if reached else "not reached"
        print(f"{who:9} median round {median:.3f} s, {target} at {when}")
mean = lambda xs: sum(xs) / len(xs)
ratio = mean([m for m, _ in summary["flower"]]) / mean([m for m, _ in summary["fl"]])
print(f"Flower / fl, mean of median round times: {ratio:.2f}x")
if "fl-signed" in summary:
    signed = mean([m for m, _ in summary["fl-signed"]])
    print(f"Flower / fl-signed, mean of median round times: {mean([m for m, _ in summary['flower']]) / signed:.2f}x")
reached = {w: [t[1] for _, t in summary[w] if t] for w in summary}
if all(len(reached[w]) == runs for w in reached):
    print(f"Flower / fl, mean time to {target}: {mean(reached['flower']) / mean(reached['fl']):.2f}x")
PY
