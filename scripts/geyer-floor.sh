#!/usr/bin/env bash
# The Geyer K = 1000 private round against its compute floor (docs/src/results/speed.md).
# RUNS runs of `fl sim --config configs/geyer-k1000.toml --rounds 8`, each between two runs of
# the floor's benchmark (`cargo bench -p fl-model --bench training -- gemm/B=20`: the matrix
# products of one client's epoch, alone on one core, and at once on every core). Prints per run
# the milliseconds per client (sum of `seconds` over sum of `sampled` in metrics.jsonl, rounds 2
# to 8) and its ratio to the floor per client (criterion's median divided by the core count,
# averaged over the benches before and after the run), then the medians.
#
#   scripts/geyer-floor.sh [RUNS]    (default 5; on an otherwise idle machine)
#
# With FL_BASE=DIR (the release folder of another build, e.g. one made in a worktree as in
# scripts/compare-revisions.sh), every run of this build is paired with a run of DIR/fl just
# before it, and the base's figures are printed beside.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
cores=$(nproc)
cargo build --release --quiet -p fl-cli
bench_bin=$(cargo bench -p fl-model --bench training --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "training":
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "ONE_CORE_NS EVERY_CORE_NS" from criterion's bencher output (its medians).
bench() {
  "$bench_bin" --bench 'gemm/B=20' --warm-up-time 2 --measurement-time 6 --output-format bencher \
    2> /dev/null | awk '/bench:/ { gsub(",", "", $5); if (/every-core/) e = $5; else o = $5 }
                        END { print o, e }'
}

# Milliseconds per client of rounds 2 to 8 of a run of `$1/fl`.
round() {
  rm -rf "$out/run"
  "$1/fl" sim --config configs/geyer-k1000.toml --rounds 8 --set server.out="$out/run" \
    > /dev/null 2>&1
  python3 - "$out/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in rows if r["round"] >= 2]
print(1000 * sum(r["seconds"] for r in rows) / sum(r["sampled"] for r in rows))
PY
}

before=$(bench)
for i in $(seq "$runs"); do
  base=-
  if [ -n "${FL_BASE:-}" ]; then base=$(round "$FL_BASE"); fi
  this=$(round target/release)
  after=$(bench)
  echo "$before $after $this $base" >> "$out/log"
  before=$after
done

python3 - "$out/log" "$cores" <<'PY'
import statistics, sys
cores = int(sys.argv[2])
rows = [line.split() for line in open(sys.argv[1])]
print(f"{cores} cores; floor = criterion's median of gemm/B=20 / {cores}, mean of the benches around the run")
print("run  floor one-core  floor every-core  ms/client  x one-core  x every-core"
      "  (base: ms/client  x one-core  x every-core)")
table = []
for i, (o1, e1, o2, e2, this, base) in enumerate(rows, 1):
    one = (float(o1) + float(o2)) / 2 / cores / 1e6
    every = (float(e1) + float(e2)) / 2 / cores / 1e6
    figures = [one, every, float(this), float(this) / one, float(this) / every]
    if base != "-":
        figures += [float(base), float(base) / one, float(base) / every]
    table.append(figures)
    print(f"{i:3}  " + "  ".join(f"{x:.3f}" for x in figures))
medians = [statistics.median(column) for column in zip(*table)]
print("median " + "  ".join(f"{x:.3f}" for x in medians))
PY
