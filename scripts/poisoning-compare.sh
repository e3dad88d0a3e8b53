#!/usr/bin/env bash
# The model-replacement attack on secure rounds, then the defence (docs/src/results/reliability.md,
# "Poisoned secure rounds"). Runs configs/verified.toml (the MNIST MLP, K = 100, m = 10 per round,
# S = 1) three ways, RUNS times each:
#   secagg, no attacker;
#   secagg, server.sim_attackers = 10 compromised clients (one per round on average), each
#     sending gamma (0 - w_t) with gamma = m = 10 and no clip: the model is replaced by zero;
#   verified, the same attackers: each upload is proved within S, the poisoned ones excluded.
# Prints one JSON line per run: mode, attacker, final test accuracy, poisoned uploads sent (counted
# from the compromised clients' log lines), uploads excluded, and the median round time.
# Usage: scripts/poisoning-compare.sh RUNS [ROUNDS] [FL_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:?usage: $0 RUNS [ROUNDS] [FL_BINARY]}
rounds=${2:-30}
FL=${3:-target/release/fl}
[ -x "$FL" ] || cargo build --release -p fl-cli
OUT=${POISONING_DIR:-runs/poisoning}
mkdir -p "$OUT"

run() { # mode attacker index
  local mode=$1 attacker=$2 name="$OUT/$1-$2-$3"
  local sets=(--set "server.rounds=$rounds" --set "privacy.mode=$mode")
  if [ "$attacker" = true ]; then sets+=(--set server.sim_attackers=10); fi
  "$FL" sim --config configs/verified.toml --out "$name" --overwrite "${sets[@]}" \
    > "$name.log" 2>&1
  python3 - "$name" "$mode" "$attacker" <<'PY'
import json, statistics, sys
run, mode, attacker = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
summary = json.load(open(f"{run}/summary.json"))
poisoned = sum("simulated attack: poisoned upload" in l for l in open(f"{run}.log"))
excluded = sum(sum((r.get("verified") or {}).get("excluded", {}).values()) for r in rows)
print(json.dumps({
    "mode": mode,
    "attacker": attacker,
    "test_accuracy": summary["test_accuracy"],
    "poisoned": poisoned,
    "excluded": excluded,
    "median_round_seconds": round(statistics.median(r["seconds"] for r in rows), 3),
}))
PY
}

for i in $(seq 1 "$runs"); do
  run secagg false "$i"
  run secagg true "$i"
  run verified true "$i"
done
