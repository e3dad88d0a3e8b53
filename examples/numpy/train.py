"""Federated MNIST with numpy clients: starts an `fl-server` (built by cargo if needed), runs K
Python clients on IID shares of MNIST's training set in this process, and prints each round's
test accuracy and time from the server's `metrics.jsonl`.

    pip install ./python && python examples/numpy/train.py

The job is the quickstart's (784-600-100-10 MLP, 100 clients, 10 per round, E = 2, B = 20,
eta = 0.1) on IID shares; `--rust` runs the same job with `fl-client --simulate K` instead of the
Python clients, and `--no-training` has the Python clients return the model they receive (what the
protocol and the Python boundary cost without numpy's training), for comparison
(docs/src/results/speed.md, "Python clients").
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from numpy_mlp import REPO, DenseTrainer, iid_share, load_mnist

import fl_client


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100, help="K")
    p.add_argument("--per-round", type=int, default=10, help="m")
    p.add_argument("--rounds", type=int, default=20, help="T")
    p.add_argument("--hidden", default="600,100", help="hidden widths of the MLP")
    p.add_argument("--out", default="runs/numpy-example", help="the server's run folder")
    p.add_argument("--rust", action="store_true", help="Rust clients instead of Python ones")
    p.add_argument("--no-training", action="store_true",
                   help="Python clients that return the model they receive")
    args = p.parse_args()

    print("building fl-server and fl-client (cargo's progress below; a few minutes the first time)",
          flush=True)
    subprocess.run(["cargo", "build", "--release", "-p", "fl-server", "-p", "fl-client"],
                   cwd=REPO, check=True)
    target = REPO / "target" / "release"
    server = subprocess.Popen(
        [str(target / "fl-server"), "--listen", "127.0.0.1:0", "--config",
         str(REPO / "configs" / "quickstart.toml"), "--clients", str(args.clients),
         "--clients-per-round", str(args.per_round), "--rounds", str(args.rounds),
         "--hidden", args.hidden, "--data", f"mnist:{REPO / 'data/mnist'}", "--out", args.out, "--overwrite"],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn"},
    )
    url = "http://" + server.stdout.readline().split()[-1]
    print(f"server listening at {url}; {args.clients} clients joining, {args.rounds} rounds",
          flush=True)
    started = time.monotonic()
    follower = threading.Thread(target=follow, daemon=True,
                                args=(REPO / args.out / "metrics.jsonl", args.rounds))
    follower.start()
    if args.rust:
        subprocess.run([str(target / "fl-client"), "--server", url, "--data",
                        f"mnist:{REPO / 'data/mnist'}", "--simulate", str(args.clients),
                        "--partition", f"iid:{args.clients}:0"], cwd=REPO, check=True,
                       env={**os.environ, "RUST_LOG": "warn"})
    else:
        run_python_clients(url, args)
    server.wait()
    elapsed = time.monotonic() - started
    follower.join(timeout=5)
    report(REPO / args.out, elapsed)


def run_python_clients(url, args):
    """K clients on threads: each waits on the network with the GIL released and trains with
    numpy when sampled."""
    x, y = load_mnist("train")
    sizes = [784, *(int(w) for w in args.hidden.split(",")), 10]
    errors = []

    def client(i):
        share = iid_share(len(y), args.clients, i)
        trainer = DenseTrainer(x[share], y[share], sizes)
        train = (lambda weights, config: weights) if args.no_training else trainer.train
        try:
            fl_client.Client(url, name=f"numpy-{i}").run(train, len(share),
                                                         evaluate=trainer.evaluate)
        except fl_client.ClientError as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"{len(errors)} clients failed, the first with: {errors[0]}")


def round_line(r):
    return f"round {r['round']:3d}  test accuracy {r['test_accuracy']:.4f}  {r['seconds']:.3f} s"


def follow(metrics: Path, rounds: int):
    """Prints each round's line as the server records it, until `rounds` were printed."""
    printed = 0
    while printed < rounds:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        for line in lines[printed:]:
            print(round_line(json.loads(line)), flush=True)
        printed = max(printed, len(lines))
        time.sleep(0.2)


def report(out: Path, elapsed: float):
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = sorted(r["seconds"] for r in rounds)
    print(f"{len(rounds)} rounds in {elapsed:.1f} s; median round {seconds[len(seconds) // 2]:.3f} s;"
          f" final test accuracy {rounds[-1]['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
