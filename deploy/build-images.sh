#!/usr/bin/env bash
# Builds the release binaries and the `fl:local` image on a registry-less base made from the
# binaries' shared libraries. Set BASE=debian:bookworm-slim to build on a normal base instead.
# Usage: deploy/build-images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p fl-server -p fl-client
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp target/release/fl-server target/release/fl-client "$stage/"
cp -r data/mnist "$stage/mnist"
base=${BASE:-}
if [ -z "$base" ]; then
  base=fl-base:local
  deploy/make-base-image.sh "$base" target/release/fl-server target/release/fl-client
fi
docker build -q --build-arg "BASE=$base" -t fl:local -f deploy/Dockerfile "$stage" > /dev/null
echo "image fl:local built on $base"
