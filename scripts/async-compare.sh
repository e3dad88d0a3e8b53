#!/usr/bin/env bash
# Synchronous FedAvg against asynchronous buffered aggregation on the quickstart's task and the
# same simulated fleet, alternately, RUNS runs of each: wall-clock seconds (the sum of the
# metrics lines' `seconds`) until the test accuracy first reaches TARGET, and the medians.
#
#   scripts/async-compare.sh [RUNS] [SPEEDS] [TARGET]
#
# Defaults: 3 runs, `slow:0.2:10` (a fifth of the clients 10 times slower), 0.92. Both modes
# keep 10 clients training: the synchronous rounds sample m = 10 (configs/quickstart.toml), the
# asynchronous run has concurrency C = 10 and a buffer of 5 (configs/quickstart-async.toml).
# Builds the release `fl` first; runs go to target/async-compare.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
speeds=${2:-slow:0.2:10}
target=${3:-0.92}
out=target/async-compare
mkdir -p "$out"
cargo build --release --quiet -p fl-cli

seconds_to() {
  python3 - "$1" "$target" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
target, t = float(sys.argv[2]), 0.0
for r in rows:
    t += r["seconds"]
    if (r["test_accuracy"] or 0) >= target:
        print(f"{t:.1f} {r['round']}")
        break
else:
    print(f"nan {len(rows)}")
PY
}

declare -A times
for i in $(seq 1 "$runs"); do
  for mode in sync async; do
    case $mode in
      sync) config=configs/quickstart.toml; steps=80 ;;
      async) config=configs/quickstart-async.toml; steps=250 ;;
    esac
    dir="$out/$mode-$i"
    rm -rf "$dir"
    target/release/fl sim --config "$config" --set "server.sim_speeds=\"$speeds\"" \
      --rounds "$steps" --out "$dir" > /dev/null 2>&1
    read -r secs step < <(seconds_to "$dir")
    echo "$mode run $i: ${secs} s to $target (round or step $step)"
    times[$mode]+="$secs "
  done
done
python3 - "${times[sync]}" "${times[async]}" <<'PY'
import statistics, sys
sync, asyn = ([float(x) for x in a.split()] for a in sys.argv[1:3])
ms, ma = statistics.median(sync), statistics.median(asyn)
print(f"median: sync {ms:.1f} s, async {ma:.1f} s, async {ms / ma:.2f}x faster ({len(sync)} runs each)")
PY
