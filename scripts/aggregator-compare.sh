#!/usr/bin/env bash
# The same private job run flat and through the aggregator tier, with real processes on loopback
# (docs/src/how-to/aggregators.md): `fl-server` and one `fl-client --simulate K` process, then a
# coordinator (`--aggregators A`), A aggregators and A client processes of K/A clients each, the
# same partition indices. Runs alternate; each prints one JSON line: mode, run, rounds,
# test_accuracy, median_round_seconds, epsilon and the ledger's chain head (`fl privacy ledger
# --verify`). A last line compares the modes: mean accuracies and the ratio of the median round
# times (tier / flat).
#
#   scripts/aggregator-compare.sh [RUNS] [AGGREGATORS]   (defaults 3 4; CONFIG: configs/geyer-k1000.toml)
#
# FL_CONFIG runs another configuration; FL_BIN_DIR runs other binaries (e.g. another checkout's
# target/release) instead of building; COMPARE_DIR keeps the run folders and logs there.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
aggregators=${2:-4}
config=${FL_CONFIG:-configs/geyer-k1000.toml}
bin=${FL_BIN_DIR:-target/release}
if [ -z "${FL_BIN_DIR:-}" ]; then
  cargo build --release -p fl-server -p fl-client -p fl-cli
fi
clients=$(sed -n 's/^clients *= *\([0-9][0-9]*\).*/\1/p' "$config" | head -n 1)
if [ $((clients % aggregators)) -ne 0 ]; then
  echo "the config's $clients clients do not split evenly over $aggregators aggregators" >&2
  exit 2
fi
out=${COMPARE_DIR:-$(mktemp -d)}
mkdir -p "$out"
FL_AGGREGATOR_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export FL_AGGREGATOR_TOKEN
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

address() { # OUT_FILE: waits for the server's "listening on" line and prints its address
  until grep -q "^listening on" "$1" 2>/dev/null; do sleep 0.2; done
  sed -n 's/^listening on //p' "$1"
}

clients_at() { # ADDRESS FIRST COUNT LOG: COUNT simulated clients from partition index FIRST
  "$bin/fl-client" --server "http://$1" --data mnist:data/mnist --partition "shards:$clients:$2" \
    --simulate "$3" > /dev/null 2> "$4" &
}

flat() { # DIR
  "$bin/fl-server" --config "$config" --listen 127.0.0.1:0 --out "$1/run" \
    > "$1/server.out" 2> "$1/server.err" &
  local server=$!
  clients_at "$(address "$1/server.out")" 0 "$clients" "$1/clients.err"
  wait "$server"
  wait
}

tier() { # DIR
  "$bin/fl-server" --config "$config" --listen 127.0.0.1:0 --out "$1/run" \
    --aggregators "$aggregators" > "$1/server.out" 2> "$1/server.err" &
  local server=$! upstream per=$((clients / aggregators))
  upstream=$(address "$1/server.out")
  for a in $(seq 1 "$aggregators"); do
    "$bin/fl-server" --role aggregator --upstream "http://$upstream" --name "agg-$a" \
      --listen 127.0.0.1:0 > "$1/agg-$a.out" 2> "$1/agg-$a.err" &
  done
  for a in $(seq 1 "$aggregators"); do
    clients_at "$(address "$1/agg-$a.out")" $(((a - 1) * per)) "$per" "$1/clients-$a.err"
  done
  wait "$server"
  wait
}

report() { # MODE RUN DIR: the run's JSON line
  local head
  head=$("$bin/fl" privacy ledger "$3/run" --verify | sed -n 's/.*head = "\(sha256:[0-9a-f]*\)".*/\1/p')
  python3 - "$1" "$2" "$3/run" "$head" <<'PY'
import json, statistics, sys
mode, run, folder, head = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [json.loads(l) for l in open(f"{folder}/metrics.jsonl")]
print(json.dumps({
    "mode": mode,
    "run": run,
    "rounds": len(rows),
    "test_accuracy": rows[-1]["test_accuracy"],
    "median_round_seconds": round(statistics.median(r["seconds"] for r in rows), 4),
    "epsilon": rows[-1]["epsilon"],
    "chain_head": head,
}))
PY
}

for i in $(seq 1 "$runs"); do
  for mode in flat tier; do
    dir="$out/$mode-$i"
    mkdir -p "$dir"
    "$mode" "$dir"
    report "$mode" "$i" "$dir" | tee -a "$out/runs.jsonl"
  done
done
python3 - "$out/runs.jsonl" "$aggregators" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {m: [r for r in rows if r["mode"] == m] for m in ("flat", "tier")}
acc = {m: statistics.mean(r["test_accuracy"] for r in by[m]) for m in by}
sec = {m: statistics.median(r["median_round_seconds"] for r in by[m]) for m in by}
heads = {r["chain_head"] for r in rows}
print(json.dumps({
    "aggregators": int(sys.argv[2]),
    "flat_mean_accuracy": round(acc["flat"], 4),
    "tier_mean_accuracy": round(acc["tier"], 4),
    "round_time_ratio": round(sec["tier"] / sec["flat"], 3),
    "same_ledger": len(heads) == 1,
}))
PY
