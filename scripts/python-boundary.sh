#!/usr/bin/env bash
# What the Python boundary costs: the numpy example (examples/numpy/train.py: 100 Python clients,
# 10 per round, the quickstart's MLP, E = 2, B = 20) against the same job with Rust clients
# (`--rust`: fl-client --simulate 100), and with Python clients that do not train
# (`--no-training`: the protocol and the boundary alone), alternated RUNS times each, ROUNDS
# rounds per run, on this machine. Prints each run's median round and final accuracy, then the
# medians over runs.
# Usage: scripts/python-boundary.sh [RUNS] [ROUNDS]   (needs `pip install ./python` first;
# PYTHON=path/to/python picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
rounds=${2:-10}
python=${PYTHON:-python3}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
declare -a py rs noop
for i in $(seq "$runs"); do
  for kind in python rust no-training; do
    flag=""
    [ "$kind" != python ] && flag="--$kind"
    line=$("$python" examples/numpy/train.py --rounds "$rounds" --out "runs/python-boundary-$kind" $flag | tail -1)
    echo "run $i $kind: $line"
    median=$(sed -n 's/.*median round \([0-9.]*\) s.*/\1/p' <<< "$line")
    case "$kind" in
      python) py+=("$median") ;;
      rust) rs+=("$median") ;;
      *) noop+=("$median") ;;
    esac
  done
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p=$(med "${py[@]}"); r=$(med "${rs[@]}"); n=$(med "${noop[@]}")
ratio=$(awk -v p="$p" -v r="$r" 'BEGIN {printf "%.1f", p/r}')
echo "median round over runs: python $p s, rust $r s (python/rust ${ratio}x), python without training $n s"
