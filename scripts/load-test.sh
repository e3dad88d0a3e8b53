#!/usr/bin/env bash
# Load test (docs/results.md, "Deployment and reliability"): one fl-server and 1,000 clients
# simulated by one fl-client process (1,000 gRPC connections) on loopback, rounds of 100 clients,
# the default MLP on MNIST shards. Prints each round's figures and both processes' peak memory.
# Usage: scripts/load-test.sh [ROUNDS]   (about 35 s for 10 rounds on 2 cores, after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
cargo build --release -p fl-server -p fl-client
out=$(mktemp -d)
/usr/bin/time -v ./target/release/fl-server --listen 127.0.0.1:0 --clients 1000 \
  --clients-per-round 100 --rounds "$rounds" --data mnist:data/mnist --out "$out/run" \
  > "$out/server.out" 2> "$out/server.err" &
until grep -q "listening on" "$out/server.out" 2>/dev/null; do sleep 0.2; done
addr=$(sed -n 's/^listening on //p' "$out/server.out")
/usr/bin/time -v ./target/release/fl-client --server "http://$addr" --data mnist:data/mnist \
  --partition shards:1000:0 --simulate 1000 > /dev/null 2> "$out/clients.err"
wait
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
m = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
for r in m:
    print(f"round {r['round']}: sampled {r['sampled']}, completed {r['completed']}, "
          f"dropped {r['dropped']}, {r['seconds']:.2f} s, accuracy {r['test_accuracy']:.4f}")
print(f"median round time {statistics.median(r['seconds'] for r in m):.2f} s")
PY
grep -H "Maximum resident" "$out/server.err" "$out/clients.err"
echo "errors logged: $(grep -c ERROR "$out/server.err" "$out/clients.err" | paste -sd' ')"
