#!/usr/bin/env bash
# Runs a job (the quickstart unless CONFIG is given) on two revisions of this repository,
# alternately, and prints each run's median round time, final test accuracy, first round at
# >= 0.92 accuracy and, for a run that keeps a privacy ledger, its line count and chain head: the
# check that a refactoring left the figures unchanged (the ledger's lines do not depend on the
# noise drawn, so the heads of two runs of one plan are equal).
#
#   scripts/compare-revisions.sh REV_A REV_B [RUNS] [ROUNDS] [CONFIG]
#
# Each revision is built (release) in its own worktree and target folder under
# ${COMPARE_DIR:-target/compare}; RUNS runs of each (default 2), ROUNDS rounds each (default 100),
# CONFIG read from each revision's own tree (default configs/quickstart.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
a=${1:?usage: $0 REV_A REV_B [RUNS] [ROUNDS]}
b=${2:?usage: $0 REV_A REV_B [RUNS] [ROUNDS]}
runs=${3:-2}
rounds=${4:-100}
config=${5:-configs/quickstart.toml}
root=$(pwd)
dir=${COMPARE_DIR:-$root/target/compare}
mkdir -p "$dir"

build() {
  local rev=$1 tree="$dir/tree-$1"
  if [ ! -d "$tree" ]; then
    git worktree add --force --detach "$tree" "$rev" > /dev/null
  fi
  CARGO_TARGET_DIR="$dir/target-$rev" cargo build --release --quiet -p fl-cli --manifest-path "$tree/Cargo.toml"
}

summarise() {
  local ledger=""
  if [ -f "$1/ledger.jsonl" ]; then
    ledger=$("$2" privacy ledger --verify --json "$1/ledger.jsonl")
  fi
  python3 - "$1" "$ledger" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
secs = [r["seconds"] for r in rows]
first = next((r["round"] for r in rows if r["test_accuracy"] >= 0.92), None)
last = statistics.mean(r["test_accuracy"] for r in rows[-30:])
line = (f"{len(rows)} rounds, median round {statistics.median(secs):.3f} s, "
        f"final accuracy {rows[-1]['test_accuracy']:.4f}, mean of the last 30 {last:.4f}, "
        f"first >= 0.92 at round {first}")
if sys.argv[2]:
    ledger = json.loads(sys.argv[2])
    line += f", ledger {ledger['lines']} lines, head {ledger['head']}"
print(line)
PY
}

for rev in "$a" "$b"; do
  echo "building $rev"
  build "$rev"
done
for i in $(seq 1 "$runs"); do
  for rev in "$a" "$b"; do
    out="$dir/run-$(basename "$config" .toml)-$rev-$i"
    rm -rf "$out"
    # Run from the revision's own tree, with its own configs and data.
    (cd "$dir/tree-$rev" && "$dir/target-$rev/release/fl" sim --config "$config" \
      --rounds "$rounds" --out "$out" > /dev/null 2>&1)
    echo "$rev run $i: $(summarise "$out" "$dir/target-$rev/release/fl")"
  done
done
