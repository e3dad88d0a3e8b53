#!/usr/bin/env bash
# The quickstart job side by side with Flower 1.41 (simulation engine, PyTorch 2.15 client,
# scripts/flower_mnist.py): 100 clients of two label shards, 10 per round, the 784-600-100-10 MLP,
# E = 1, B = 50, lr 0.1, the server evaluating on the 10,000 test examples every round. Runs are
# alternated; prints each run's median round time and time to 0.92 test accuracy, and the ratios
# of the means.
#
#   scripts/flower-compare.sh [RUNS] [ROUNDS]     (defaults 3 100; run on an otherwise idle machine)
#
# The first run makes a venv in ${FLOWER_VENV:-target/flower-venv} with flwr[simulation]==1.41.0
# and torch==2.15.0 from PyPI (about 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rounds=${2:-100}
venv=${FLOWER_VENV:-target/flower-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "flwr[simulation]==1.41.0" "torch==2.15.0"
fi
cargo build --release --quiet -p fl-cli
out=$(mktemp -d)
for i in $(seq 1 "$runs"); do
  ./target/release/fl sim --config configs/quickstart.toml --set train.epochs=1 \
    --set train.batch_size=50 --set train.learning_rate=0.1 --rounds "$rounds" \
    --out "$out/fl-$i" > /dev/null 2>&1
  cp "$out/fl-$i/metrics.jsonl" "$out/fl-$i.jsonl"
  PYTHONPATH=scripts "$venv/bin/python" scripts/flower_mnist.py "$out/flower-$i.jsonl" "$rounds" > "$out/flower-$i.log" 2>&1
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def run(path):
    rows = [json.loads(l) for l in open(path)]
    elapsed, to92 = 0.0, None
    for r in rows:
        elapsed += r["seconds"]
        if to92 is None and r["test_accuracy"] >= 0.92:
            to92 = (r["round"], elapsed)
    return statistics.median(r["seconds"] for r in rows), to92
summary = {}
for who in ("fl", "flower"):
    summary[who] = [run(f"{out}/{who}-{i}.jsonl") for i in range(1, runs + 1)]
    for median, to92 in summary[who]:
        reached = f"round {to92[0]} after {to92[1]:.1f} s" if to92 else "not reached"
        print(f"{who:7} median round {median:.3f} s, 0.92 at {reached}")
mean = lambda xs: sum(xs) / len(xs)
ratio = mean([m for m, _ in summary["flower"]]) / mean([m for m, _ in summary["fl"]])
print(f"Flower / fl, mean of median round times: {ratio:.2f}x")
reached = {w: [t[1] for _, t in summary[w] if t] for w in summary}
if all(len(reached[w]) == runs for w in reached):
    print(f"Flower / fl, mean time to 0.92: {mean(reached['flower']) / mean(reached['fl']):.2f}x")
PY
