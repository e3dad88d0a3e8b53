#!/usr/bin/env bash
# Load test (docs/src/results/speed.md, "Scale and memory"): one fl-server and N clients simulated by one fl-client process
# on loopback (N/100 HTTP/2 connections), rounds of M clients, default settings otherwise: the
# default MLP (or the logistic model), MNIST shards, the server's default join limiter (the
# clients retry until it lets them in). Prints each round's figures and both processes' peak
# memory.
#
#   scripts/load-test.sh [N] [M] [ROUNDS] [MODEL]   (defaults: 10000 1000 3 mlp; MODEL: mlp|logistic)
#
# FL_BIN_DIR runs other binaries (e.g. another revision's target/release) instead of building;
# FL_SERVER_ARGS adds arguments to fl-server's (e.g. "--config my.toml"); FL_SERVER_WRAP runs the server
# under a tool (e.g. "heaptrack -o FILE", how the server's heap was profiled).
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-10000}
per_round=${2:-1000}
rounds=${3:-3}
model=${4:-mlp}
bin=${FL_BIN_DIR:-target/release}
if [ -z "${FL_BIN_DIR:-}" ]; then
  cargo build --release -p fl-server -p fl-client
fi
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
/usr/bin/time -v ${FL_SERVER_WRAP:-} "$bin/fl-server" --listen 127.0.0.1:0 --clients "$clients" \
  --clients-per-round "$per_round" --rounds "$rounds" --model "$model" \
  --data mnist:data/mnist --out "$out/run" ${FL_SERVER_ARGS:-} > "$out/server.out" 2> "$out/server.err" &
until grep -q "listening on" "$out/server.out" 2>/dev/null; do sleep 0.2; done
addr=$(sed -n 's/^listening on //p' "$out/server.out")
start=$(date +%s.%N)
/usr/bin/time -v "$bin/fl-client" --server "http://$addr" --data mnist:data/mnist \
  --partition "shards:$clients:0" --simulate "$clients" > /dev/null 2> "$out/clients.err"
wait
end=$(date +%s.%N)
python3 - "$out" "$start" "$end" <<'PY'
import json, re, statistics, sys
out, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
m = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
for r in m:
    print(f"round {r['round']}: sampled {r['sampled']}, completed {r['completed']}, "
          f"dropped {r['dropped']}, {r['seconds']:.2f} s, accuracy {r['test_accuracy']:.4f}")
if m:
    print(f"median round time {statistics.median(r['seconds'] for r in m):.2f} s")
print(f"whole run (joins included) {end - start:.1f} s")
for who in ("server", "clients"):
    text = open(f"{out}/{who}.err").read()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", text)
    print(f"{who} peak RSS {int(rss.group(1)) / 1024:.0f} MB, CPU {cpu.group(1)}%")
PY
echo "errors logged: $(grep -c ERROR "$out/server.err" "$out/clients.err" | paste -sd' ')"
