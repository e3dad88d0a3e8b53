#!/usr/bin/env bash
# From a clean checkout: builds the binaries and the image (no registry needed), makes test
# certificates, runs the compose file with 1 server and 4 clients for 3 rounds over TLS, and checks
# the run folder. Exits 0 only when the run succeeded.
# Usage: deploy/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
compose=(docker-compose)
command -v docker-compose > /dev/null || compose=(docker compose)
deploy/build-images.sh
work=$(mktemp -d)
project="flsmoke$$"
cleanup() {
  FL_RUNS="$work/runs" FL_CERTS="$work/certs" "${compose[@]}" -f deploy/docker-compose.yml \
    -p "$project" down -v > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
deploy/make-certs.sh "$work/certs" 1 > /dev/null
# The containers run as nobody: test keys readable, run folder writable.
chmod 644 "$work"/certs/*.key
mkdir -m 777 "$work/runs"
export FL_RUNS="$work/runs" FL_CERTS="$work/certs" FL_CLIENTS=4 FL_CLIENTS_PER_ROUND=3 FL_ROUNDS=3
FL_TOKEN=$(openssl rand -hex 32)
export FL_TOKEN
"${compose[@]}" -f deploy/docker-compose.yml -p "$project" up -d --scale client=4 > /dev/null
server=$("${compose[@]}" -f deploy/docker-compose.yml -p "$project" ps -q server)
status=$(timeout 300 docker wait "$server")
if [ "$status" != 0 ]; then
  "${compose[@]}" -f deploy/docker-compose.yml -p "$project" logs --tail 30
  echo "smoke: the server exited with $status" >&2
  exit 1
fi
python3 - "$work/runs/compose" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(f"{run}/summary.json"))
m = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert s["rounds_completed"] == 3 and s["stopped_by"] == "rounds", s
assert [r["round"] for r in m] == [1, 2, 3], m
assert all(r["completed"] == 3 for r in m), m
print(f"smoke: 3 rounds over TLS in containers, test accuracy {s['test_accuracy']:.4f}")
PY
