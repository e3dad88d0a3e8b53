#!/usr/bin/env bash
# Accuracy against epsilon: for each epsilon, the noise multiplier that keeps ROUNDS rounds of
# sampling rate Q within (epsilon, DELTA) (`fl privacy sigma`), then `fl sim` of CONFIG with that
# budget and multiplier (training stops when the ledger reaches the budget). Each run's figures
# are appended to $SWEEP_DIR/results.tsv under LABEL (SWEEP_DIR defaults to runs/sweep), the whole
# table is printed as markdown and drawn into $SWEEP_DIR/accuracy-vs-epsilon.svg (`fl sweep-plot`).
# Q = tree:N plans DP-FTRL's trees of N rounds instead of a sampling rate, Q = banded:B banded
# DP-FTRL with each client at most once every B rounds (the config sets privacy.noise = "banded").
#
#   scripts/epsilon-sweep.sh LABEL CONFIG Q ROUNDS DELTA "EPSILONS" [ACCOUNTANT] [-- fl sim args]
#
# e.g. central DP with FedAvg and with FedAdam, and distributed noise under zero-out neighbours
# (accounted without sampling, q = 1, by RDP, which its bound approaches for wide noise):
#   scripts/epsilon-sweep.sh central-fedavg configs/geyer-k1000.toml 0.22 100 1e-5 "1 2 4 8"
#   scripts/epsilon-sweep.sh central-fedadam configs/geyer-k1000.toml 0.22 100 1e-5 "1 2 4 8" pld \
#     -- --set train.server_optimizer=fedadam --set train.server_learning_rate=0.01
#   scripts/epsilon-sweep.sh ddg-zero-out configs/secagg-ddg.toml 1 8 1e-3 "1 2 4 8" rdp \
#     -- --set secagg.neighbours=zero-out --set secagg.sim_dropout=0.0 --set secagg.min_survivors=1.0
#   scripts/epsilon-sweep.sh dp-ftrl configs/dp-ftrl.toml tree:4 100 1e-5 "1 2 4 8"
#   scripts/epsilon-sweep.sh dp-ftrl-mf configs/dp-ftrl-mf.toml banded:4 50 1e-5 "1 2 4 8"
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 6 ]; then
  sed -n '2,21p' "$0" >&2
  exit 2
fi
label=$1 config=$2 q=$3 rounds=$4 delta=$5 epsilons=$6
accountant=${7:-pld}
shift $(( $# >= 7 ? 7 : 6 ))
[ "${1:-}" = "--" ] && shift
cargo build --release --quiet -p fl-cli
fl=target/release/fl
dir=${SWEEP_DIR:-runs/sweep}
mkdir -p "$dir"
table=$dir/results.tsv
[ -f "$table" ] || printf 'label\tepsilon\tdelta\tsigma\trounds\ttest_accuracy\n' > "$table"
field() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
case "$q" in
  tree:*) plan=(--noise "tree:rounds=${q#tree:}") ;;
  banded:*) plan=(--noise "banded:min_separation=${q#banded:}") ;;
  *) plan=(--q "$q") ;;
esac
for eps in $epsilons; do
  sigma=$("$fl" privacy sigma "${plan[@]}" --rounds "$rounds" --eps "$eps" --delta "$delta" \
    --accountant "$accountant" --json | python3 -c "import json, sys; print(json.load(sys.stdin)['sigma'])")
  out="$dir/$label-eps$eps"
  "$fl" sim --config "$config" --out "$out" --overwrite --set privacy.epsilon="$eps" \
    --set privacy.delta="$delta" --set privacy.noise_multiplier="$sigma" "$@" > /dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$eps" "$delta" "$sigma" \
    "$(field "$out/summary.json" rounds_completed)" "$(field "$out/summary.json" test_accuracy)" \
    >> "$table"
  tail -1 "$table"
done
python3 - "$table" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("| run | epsilon | delta | sigma | rounds | test accuracy |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    print(f"| {r['label']} | {r['epsilon']} | {r['delta']} | {float(r['sigma']):.4f} | "
          f"{r['rounds']} | {float(r['test_accuracy']):.4f} |")
PY
"$fl" sweep-plot "$table" --title "accuracy against epsilon" --out "$dir/accuracy-vs-epsilon.svg"
