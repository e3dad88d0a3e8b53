#!/usr/bin/env bash
# Makes a test CA, a server certificate and N client certificates for a federation, with openssl.
# For trials and the compose demo only: a real deployment uses its organisation's CA.
# Usage: deploy/make-certs.sh OUT_DIR [N_CLIENTS] [SERVER_NAMES]
#   SERVER_NAMES: comma-separated DNS names of the server (default: server,aggregator,localhost).
# Writes OUT_DIR/ca.pem (give it to every client and, for client certificates, to the server),
# OUT_DIR/server.pem + server.key, and OUT_DIR/client-I.pem + client-I.key for I in 0..N-1.
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR [N_CLIENTS] [SERVER_NAMES]}
n=${2:-4}
names=${3:-server,aggregator,localhost}
mkdir -p "$out"
cd "$out"
umask 077
san="subjectAltName=$(echo "$names" | sed 's/\([^,]*\)/DNS:\1/g'),IP:127.0.0.1"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
  -subj "/CN=fl test CA" -keyout ca.key -out ca.pem 2>/dev/null

leaf() { # name subject extension
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
    -extfile <(printf '%s\n' "$3") -out "$1.pem" 2>/dev/null
  rm -f "$1.csr"
}
leaf server "${names%%,*}" "$san"
for i in $(seq 0 $((n - 1))); do
  leaf "client-$i" "client-$i" "extendedKeyUsage=clientAuth"
done
chmod 644 ./*.pem
echo "CA, server and $n client certificates in $out"
