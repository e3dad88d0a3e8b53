#!/usr/bin/env python3
"""Where the CPU time of an `fl sim` run goes, from `perf script` output with call stacks.

Usage (docs/src/results/speed.md, "The private round against its floor"):

    perf record -e cpu-clock -F 297 --call-graph dwarf,16384 -o perf.data -- \
        target/release/fl sim --config configs/geyer-k1000.toml --rounds 6 --set server.out=runs/prof --overwrite
    perf script -i perf.data -F comm,tid,time,ip,sym | python3 scripts/perf-breakdown.py --skip 0.35

Each sample goes to the first category, in the order of CATEGORIES, that one of its frames
names; `--skip F` leaves out the first fraction F of the run's time (start-up and the first
rounds, whose page faults a long run does not repeat).
"""

import argparse
import collections
import sys

# (category, groups of frame substrings): a sample's stack must name one substring of every
# group; the first category that matches takes the sample.
CATEGORIES = [
    ("training: matrix products (gemm)", [["train_local"], ["gemm"]]),
    ("training: the rest", [["train_local"]]),
    ("test evaluation", [["evaluat"]]),
    (
        "server: per-update passes (check, norm, clip, sums, moments)",
        [["UpdateMoments", "WeightedMean", "all_finite", "check_update", "clip_l2", "l2_norm",
          "clip_into", "CentralDp"]],
    ),
    (
        "transport: HTTP/2, tonic, chunks",
        [["h2::", "hyper", "tonic", "TensorAssembler", "Deframer", "prost",
          "encode_chunks", "send_outgoing", "Framer"]],
    ),
    ("client: model copy and update", [["SgdTrainer::sgd", "fl_client::round"]]),
    ("scheduling and wake-ups", [["schedule", "futex", "park", "epoll"]]),
]


def samples(lines):
    """Yields (time, frames) per sample of `perf script -F comm,tid,time,ip,sym`."""
    time, frames = None, []
    for line in lines:
        if not line.strip():
            if time is not None:
                yield time, frames
            time, frames = None, []
        elif not line[0].isspace():
            time = float(line.split()[-1].rstrip(":"))
        else:
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                frames.append(parts[1])
    if time is not None:
        yield time, frames


def category(frames):
    def names(keys):
        return any(k in f for f in frames for k in keys)

    for name, groups in CATEGORIES:
        if all(names(keys) for keys in groups):
            return name
    return "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", type=float, default=0.0, help="fraction of the run left out")
    args = parser.parse_args()
    all_samples = list(samples(sys.stdin))
    if not all_samples:
        sys.exit("no samples on stdin")
    start, end = all_samples[0][0], all_samples[-1][0]
    cutoff = start + args.skip * (end - start)
    kept = [frames for time, frames in all_samples if time >= cutoff]
    counts = collections.Counter(category(frames) for frames in kept)
    print(f"{len(kept)} samples")
    for name, n in counts.most_common():
        print(f"{100 * n / len(kept):5.1f}%  {name}")


if __name__ == "__main__":
    main()
