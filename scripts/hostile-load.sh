#!/usr/bin/env bash
# Resources held by hostile peers (docs/src/results/reliability.md, "Hostile peers"): one fl-server waiting for
# clients (K = 100000, so training never starts), then
#   1. a flood of JOINS Join requests (default 40000) from one address with no Session after them,
#      the join limiter's burst raised so that the flood reaches the registry: the server's memory
#      before, right after, and after server.forget_after_secs (FORGET, default 120 s);
#   2. 500 TCP connections that send nothing: how many the server closed within
#      server.handshake_timeout_secs (10 s), and its open file descriptors before and after.
# Usage: scripts/hostile-load.sh [JOINS] [FORGET]   (about FORGET + 40 s after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
joins=${1:-40000}
forget=${2:-120}
cargo build --release -p fl-server --bin fl-server --example join_flood
out=$(mktemp -d)
./target/release/fl-server --config configs/quickstart.toml --listen 127.0.0.1:0 \
  --clients 100000 --out "$out/run" --set server.join_timeout_secs=3600 \
  --set server.join_burst=100000 --set "server.forget_after_secs=$forget" \
  > "$out/server.out" 2> "$out/server.err" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until grep -q "listening on" "$out/server.out" 2>/dev/null; do sleep 0.2; done
addr=$(sed -n 's/^listening on //p' "$out/server.out")
rss() { awk '/VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$server/status"; }
fds() { ls "/proc/$server/fd" | wc -l; }
sleep 2
echo "server RSS at rest: $(rss), open fds: $(fds)"
./target/release/examples/join_flood "http://$addr" "$joins" 64
echo "server RSS after the flood: $(rss)"
sleep $((forget + 10))
echo "server RSS ${forget} s + 10 s later: $(rss) ($(grep -c 'forgot clients' "$out/server.err" || true) sweep lines logged)"
python3 - "$addr" "$server" <<'PY'
import os, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
pid = sys.argv[2]
fds = lambda: len(os.listdir(f"/proc/{pid}/fd"))
before = fds()
socks = [socket.create_connection((host, int(port))) for _ in range(500)]
time.sleep(0.5)
during = fds()
start = time.monotonic()
closed_at = []
for s in socks:
    s.settimeout(max(0.1, 15 - (time.monotonic() - start)))
    try:
        data = s.recv(1)
        closed_at.append(time.monotonic() - start if data == b"" else None)
    except ConnectionResetError:
        closed_at.append(time.monotonic() - start)
    except socket.timeout:
        closed_at.append(None)
closed = [t for t in closed_at if t is not None]
print(f"silent connections: 500 opened, server fds {before} -> {during}; "
      f"{len(closed)} closed by the server, the last {max(closed):.1f} s after the first was "
      f"checked (connections opened {0.5:.1f} s before); server fds now {fds()}")
PY
