#!/usr/bin/env bash
# From a clean checkout: builds the binaries and the image (no registry needed), makes test
# certificates, and runs two federations in containers over TLS, checking each run folder:
#   1. deploy/docker-compose.yml: 1 server and 4 replicas of one client service, 3 rounds;
#   2. deploy/docker-compose.signed.yml: signed secure aggregation under a federation policy,
#      4 sites with their own identities, set up with `fl authority` as
#      docs/src/explanation/secure-aggregation.md gives it, 3 rounds;
#   3. deploy/docker-compose.tier.yml: a coordinator, 2 aggregator replicas and 4 client
#      replicas, 3 rounds.
# Exits 0 only when all three runs succeeded.
# Usage: deploy/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
compose=(docker-compose)
command -v docker-compose > /dev/null || compose=(docker compose)
deploy/build-images.sh
cargo build --release -q -p fl-cli
fl=target/release/fl
work=$(mktemp -d)
project="flsmoke$$"
in_compose() { # FILE ARGS...: compose with this smoke test's project and folders
  local file=$1
  shift
  "${compose[@]}" -f "$file" -p "$project" "$@"
}
cleanup() {
  for file in deploy/docker-compose.yml deploy/docker-compose.signed.yml \
    deploy/docker-compose.tier.yml; do
    in_compose "$file" down -v > /dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
deploy/make-certs.sh "$work/certs" 1 > /dev/null
# The containers run as nobody: test keys readable, run folder writable.
chmod 644 "$work"/certs/*.key
mkdir -m 777 "$work/runs"
export FL_RUNS="$work/runs" FL_CERTS="$work/certs" FL_CLIENTS=4 FL_CLIENTS_PER_ROUND=3 FL_ROUNDS=3
FL_TOKEN=$(openssl rand -hex 32)
FL_AGGREGATOR_TOKEN=$(openssl rand -hex 32)
export FL_TOKEN FL_AGGREGATOR_TOKEN

run_to_end() { # FILE UP_ARGS...: starts the file's services and waits for the server's exit
  local file=$1
  shift
  in_compose "$file" up -d "$@" > /dev/null
  local server status
  server=$(in_compose "$file" ps -q server)
  status=$(timeout 300 docker wait "$server")
  if [ "$status" != 0 ]; then
    in_compose "$file" logs --tail 30
    echo "smoke: the server of $file exited with $status" >&2
    exit 1
  fi
}

check_run() { # RUN_FOLDER CLIENTS_PER_ROUND WHAT
  python3 - "$@" <<'PY'
import json, sys
run, m, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = json.load(open(f"{run}/summary.json"))
rounds = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert s["rounds_completed"] == 3 and s["stopped_by"] == "rounds", s
assert [r["round"] for r in rounds] == [1, 2, 3], rounds
assert all(r["completed"] == m for r in rounds), rounds
print(f"smoke: {what}, test accuracy {s['test_accuracy']:.4f}")
PY
}

run_to_end deploy/docker-compose.yml --scale client=4
check_run "$work/runs/compose" 3 "3 rounds over TLS in containers"

# The authority, on the host (its secret key never enters a container), certifies four sites
# and signs the federation's policy.
fed="$work/federation"
$fl authority init --dir "$work/authority" > /dev/null
mkdir -p "$fed"
cp "$work/authority/authority.pub" "$fed/"
for i in 1 2 3 4; do
  $fl authority identity --dir "$fed/site-$i" > /dev/null
  $fl authority sign --key "$work/authority/authority.key" --name "site-$i" \
    --identity "$fed/site-$i/identity.pub" --out "$fed/site-$i/certificate.toml" > /dev/null
  $fl authority verify --authority "$fed/authority.pub" --cert "$fed/site-$i/certificate.toml" \
    > /dev/null
  mkdir -m 777 -p "$work/state/site-$i"
done
$fl authority policy --key "$work/authority/authority.key" --federation smoke \
  --serial 1 --allow secagg --min-clients 3 --min-degree 2 --min-threshold 0.7 \
  --max-release-epsilon 4 --max-total-epsilon 50 --out "$fed/policy.toml" > /dev/null
cat > "$fed/server.toml" <<'TOML'
[server]
clients = 4
clients_per_round = 4
rounds = 3

[model]
kind = "logistic"

[data]
source = "mnist:/data/mnist"

[privacy]
mode = "secagg"
clip = "fixed"
clip_bound = 10.0

[secagg]
graph = "complete"
threshold = 0.7
min_survivors = 0.75
authority = "/federation/authority.pub"
policy = "/federation/policy.toml"
TOML
# The containers run as nobody: the sites' test identities readable.
chmod -R a+rX "$fed"
export FL_FEDERATION="$fed" FL_STATE="$work/state"
run_to_end deploy/docker-compose.signed.yml
check_run "$work/runs/signed" 4 "3 signed secure rounds under the policy of federation smoke"
for i in 1 2 3 4; do
  compgen -G "$work/state/site-$i/smoke--*.json" > /dev/null || {
    echo "smoke: site-$i kept no state" >&2
    exit 1
  }
done

run_to_end deploy/docker-compose.tier.yml --scale aggregator=2 --scale client=4
joined=$(in_compose deploy/docker-compose.tier.yml logs server | grep -c "aggregator joined" || true)
if [ "$joined" -lt 2 ]; then
  echo "smoke: $joined aggregators joined the coordinator, not 2" >&2
  exit 1
fi
check_run "$work/runs/tier" 3 "3 rounds through 2 aggregators in containers"
