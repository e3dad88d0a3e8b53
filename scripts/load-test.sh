#!/usr/bin/env bash
# Load test (docs/src/results/speed.md, "Scale and memory"): one fl-server and N clients simulated by one fl-client process
# on loopback (N/100 HTTP/2 connections), rounds of M clients, default settings otherwise: the
# default MLP (or the logistic model), MNIST shards, the server's default join limiter (the
# clients retry until it lets them in). Prints each round's figures and both processes' peak
# memory.
#
#   scripts/load-test.sh [N] [M] [ROUNDS] [MODEL] [AGGREGATORS]
#   (defaults: 10000 1000 3 mlp 0; MODEL: mlp|logistic)
#
# With AGGREGATORS = A > 0 the server is a coordinator of A aggregator processes
# (docs/src/how-to/aggregators.md), each serving N/A clients of its own fl-client process; every
# process's peak memory is printed.
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
aggregators=${5:-0}
bin=${FL_BIN_DIR:-target/release}
if [ -z "${FL_BIN_DIR:-}" ]; then
  cargo build --release -p fl-server -p fl-client
fi
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
address() { # OUT_FILE: waits for its "listening on" line and prints the address
  until grep -q "listening on" "$1" 2>/dev/null; do sleep 0.2; done
  sed -n 's/^listening on //p' "$1"
}
clients_at() { # ADDRESS FIRST COUNT NAME
  /usr/bin/time -v "$bin/fl-client" --server "http://$1" --data mnist:data/mnist \
    --partition "shards:$clients:$2" --simulate "$3" > /dev/null 2> "$out/$4.err" &
}
tier=()
if [ "$aggregators" -gt 0 ]; then
  tier=(--aggregators "$aggregators")
  # A coordinator admits only aggregators that present its token.
  FL_AGGREGATOR_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  export FL_AGGREGATOR_TOKEN
fi
/usr/bin/time -v ${FL_SERVER_WRAP:-} "$bin/fl-server" --listen 127.0.0.1:0 --clients "$clients" \
  --clients-per-round "$per_round" --rounds "$rounds" --model "$model" "${tier[@]}" \
  --data mnist:data/mnist --out "$out/run" ${FL_SERVER_ARGS:-} > "$out/server.out" 2> "$out/server.err" &
server=$!
addr=$(address "$out/server.out")
start=$(date +%s.%N)
if [ "$aggregators" -eq 0 ]; then
  clients_at "$addr" 0 "$clients" clients
else
  per=$((clients / aggregators))
  for a in $(seq 1 "$aggregators"); do
    /usr/bin/time -v "$bin/fl-server" --role aggregator --upstream "http://$addr" --name "agg-$a" \
      --listen 127.0.0.1:0 > "$out/agg-$a.out" 2> "$out/agg-$a.err" &
  done
  for a in $(seq 1 "$aggregators"); do
    clients_at "$(address "$out/agg-$a.out")" $(((a - 1) * per)) "$per" "clients-$a"
  done
fi
wait "$server"
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
import glob, os
for path in sorted(glob.glob(f"{out}/*.err"), key=lambda p: (len(p), p)):
    who = os.path.basename(path)[:-4]
    text = open(path).read()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", text)
    print(f"{who} peak RSS {int(rss.group(1)) / 1024:.0f} MB, CPU {cpu.group(1)}%")
PY
echo "errors logged: $(cat "$out"/*.err | grep -c ERROR || true)"
