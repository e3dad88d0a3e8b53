#!/usr/bin/env bash
# Makes a local base image with no registry: an empty root file system holding only the shared
# libraries that `ldd` lists for the given binaries (and the dynamic loader), imported with
# `docker import`. Nothing is pulled.
# Usage: deploy/make-base-image.sh TAG BINARY...
set -euo pipefail
tag=${1:?usage: make-base-image.sh TAG BINARY...}
shift
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for bin in "$@"; do
  # Lines look like "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
  # "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
  ldd "$bin" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' |
    while read -r lib; do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
done
mkdir -p "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
echo "nobody:x:65534:65534:nobody:/:/sbin/nologin" > "$root/etc/passwd"
tar -C "$root" -c . | docker import - "$tag" > /dev/null
echo "base image $tag: $(cd "$root" && find . -type f | wc -l) files"
