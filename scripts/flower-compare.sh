#!/usr/bin/env bash
# The quickstart job side by side with Flower 1.41 (simulation engine, PyTorch 2.15 client,
# scripts/flower_mnist.py): 100 clients of two label shards, 10 per round, the server evaluating
# on the 10,000 test examples every round. MODEL `mlp`: the 784-600-100-10 MLP, E = 1, B = 50,
# lr 0.1, target 0.92 test accuracy; `cnn`: configs/quickstart-cnn.toml, McMahan et al.'s CNN,
# E = 5, B = 10, lr 0.05, target 0.99. Runs are alternated; prints each run's median round time
# and time to the target, and the ratios of the means.
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
  *) echo "MODEL is mlp or cnn" >&2; exit 2 ;;
esac
export FLOWER_MODEL=$model
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
  ./target/release/fl sim --config "$config" --set train.epochs="$FLOWER_EPOCHS" \
    --set train.batch_size="$FLOWER_BATCH" --set train.learning_rate="$FLOWER_LR" \
    --rounds "$rounds" --out "$out/fl-$i" > /dev/null 2>&1
  cp "$out/fl-$i/metrics.jsonl" "$out/fl-$i.jsonl"
  PYTHONPATH=scripts "$venv/bin/python" scripts/flower_mnist.py "$out/flower-$i.jsonl" "$rounds" > "$out/flower-$i.log" 2>&1
done
python3 - "$out" "$runs" "$target" <<'PY'
import json, statistics, sys
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
for who in ("fl", "flower"):
    summary[who] = [run(f"{out}/{who}-{i}.jsonl") for i in range(1, runs + 1)]
    for median, reached in summary[who]:
        when = f"round {reached[0]} after {reached[1]:.1f} s" if reached else "not reached"
        print(f"{who:7} median round {median:.3f} s, {target} at {when}")
mean = lambda xs: sum(xs) / len(xs)
ratio = mean([m for m, _ in summary["flower"]]) / mean([m for m, _ in summary["fl"]])
print(f"Flower / fl, mean of median round times: {ratio:.2f}x")
reached = {w: [t[1] for _, t in summary[w] if t] for w in summary}
if all(len(reached[w]) == runs for w in reached):
    print(f"Flower / fl, mean time to {target}: {mean(reached['flower']) / mean(reached['fl']):.2f}x")
PY
