#!/usr/bin/env bash
# Client-side privacy on MNIST at several privacy levels, K = 100 and K = 1000 (docs/src/results/accuracy.md,
# "Client-side privacy"). Runs the shipped configs with overrides, writes each run under
# runs/sweep/NAME and prints one line per run: name, final accuracy, best accuracy, composed
# epsilon of the busiest client, bytes uploaded per client per round.
# Usage: scripts/local-privacy-sweep.sh [FL_BINARY]   (about 12 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
FL=${1:-target/release/fl}
[ -x "$FL" ] || cargo build --release -p fl-cli
OUT=runs/sweep

run() { # name config overrides...
  local name=$1 config=$2
  shift 2
  local sets=()
  for o in "$@"; do sets+=(--set "$o"); done
  "$FL" sim --config "configs/$config.toml" --out "$OUT/$name" --overwrite "${sets[@]}" > /dev/null
  python3 - "$OUT/$name" "$name" <<'PY'
import json, sys
run, name = sys.argv[1], sys.argv[2]
m = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
s = json.load(open(f"{run}/summary.json"))
eps = (s.get("local_privacy") or {}).get("max_epsilon")
per = sum(r["bytes_up"] for r in m) / max(1, sum(r["completed"] for r in m))
print(f"{name}\t{m[-1]['test_accuracy']:.4f}\t{max(r['test_accuracy'] for r in m):.4f}\t"
      f"{'-' if eps is None else f'{eps:.2f}'}\t{per:.0f}")
PY
}

printf 'run\tfinal\tbest\tmax client eps\tbytes up/client/round\n'
for k in 100 1000; do
  K=(server.clients=$k server.clients_per_round=$k)
  run "gaussian-k$k-none" ldp-gaussian "${K[@]}" privacy.mode=none
  for e in 2 8 32; do
    run "gaussian-k$k-eps$e" ldp-gaussian "${K[@]}" local.epsilon=$e
  done
  batch=$((60000 / k))
  rho=$(python3 -c "print(1 / (5 * $k))")
  run "laplace-k$k-none" ldp-laplace "${K[@]}" train.batch_size=$batch privacy.mode=none
  run "iadmm-k$k-none" iadmm "${K[@]}" admm.rho=$rho privacy.mode=none
  for e in 0.1 1 10; do
    run "laplace-k$k-eps$e" ldp-laplace "${K[@]}" train.batch_size=$batch local.epsilon=$e
    run "iadmm-k$k-eps$e" iadmm "${K[@]}" admm.rho=$rho local.epsilon=$e
  done
  for e in 1 8 32; do
    run "signds-k$k-eps$e" signds "${K[@]}" local.epsilon=$e
  done
done
# SignDS on the 784-600-100-10 MLP (d = 532,110): 100 of 1000 clients per round, h = 2000.
run signds-mlp-k1000-eps8 signds model.kind=mlp 'model.hidden=[600, 100]' \
  server.clients_per_round=100 server.rounds=20 local.output_dimensions=2000
