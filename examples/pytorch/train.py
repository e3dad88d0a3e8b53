"""Federated MNIST with PyTorch clients and a model the server does not know.

The clients train McMahan et al. 2017's CNN (two 5x5 convolutions of 32 and 64 channels, each
followed by 2x2 max pooling, a dense layer of 512, 10 logits), with batch normalisation after the
first convolution, with their own PyTorch code; BatchNorm's integer `num_batches_tracked` is not
a parameter: `flatten` leaves it out, `unflatten` keeps each client's own, and the server leaves
it out of `model.init`; the server only sees the tensors' names and shapes (`model.kind = "external"`, the
starting `state_dict` in `model.init`) and aggregates. The clients evaluate each round's global
model on their own examples (federated evaluation), and at the end this script loads the server's
`model.safetensors` with `safetensors.torch.load_file` and evaluates it on MNIST's test set.

    pip install ./python torch safetensors && python examples/pytorch/train.py

K = 100 clients on IID shares of the training set run as threads in this process; they share one
network and train one at a time, each with all of torch's threads.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "numpy"))
from numpy_mlp import REPO, iid_share, load_mnist  # noqa: E402

import fl_client  # noqa: E402


class Net(nn.Module):
    """McMahan et al. 2017's CNN for MNIST."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load(net: nn.Module, weights: np.ndarray):
    """Puts the flat vector the server sent into `net`."""
    tensors = fl_client.unflatten(weights, net.state_dict())
    net.load_state_dict({name: torch.from_numpy(v) for name, v in tensors.items()})


class TorchClient:
    """One client's examples, with the network and the lock all clients share."""

    def __init__(self, net: nn.Module, lock: threading.Lock, x: np.ndarray, y: np.ndarray):
        self.net, self.lock = net, lock
        self.x = torch.from_numpy(x).reshape(-1, 1, 28, 28)
        self.y = torch.from_numpy(y)

    def train(self, weights: np.ndarray, config: dict):
        with self.lock:
            load(self.net, weights)
            self.net.train()
            opt = torch.optim.SGD(self.net.parameters(), lr=config["learning_rate"])
            order = torch.Generator().manual_seed(config["seed"])
            losses = []
            for _ in range(config["epochs"]):
                losses = []
                for idx in torch.randperm(len(self.y), generator=order).split(config["batch_size"]):
                    opt.zero_grad()
                    loss = F.cross_entropy(self.net(self.x[idx]), self.y[idx])
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
            return fl_client.flatten(self.net.state_dict()), float(np.mean(losses))

    def evaluate(self, weights: np.ndarray):
        with self.lock, torch.no_grad():
            load(self.net, weights)
            return evaluate(self.net, self.x, self.y)


def evaluate(net: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """(mean cross-entropy, accuracy, n) of `net` on (x, y)."""
    net.eval()  # BatchNorm with its running statistics
    with torch.no_grad():
        logits = torch.cat([net(batch) for batch in x.split(1000)])
    loss = float(F.cross_entropy(logits, y))
    return loss, float((logits.argmax(1) == y).float().mean()), len(y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100, help="K")
    p.add_argument("--per-round", type=int, default=10, help="m")
    p.add_argument("--rounds", type=int, default=20, help="T")
    p.add_argument("--epochs", type=int, default=1, help="E")
    p.add_argument("--batch-size", type=int, default=10, help="B")
    p.add_argument("--learning-rate", type=float, default=0.05, help="eta")
    p.add_argument("--seed", type=int, default=0, help="the starting weights' seed")
    p.add_argument("--out", default="runs/pytorch-example", help="the server's run folder")
    args = p.parse_args()

    print("building fl-server (cargo's progress below; a few minutes the first time)", flush=True)
    subprocess.run(["cargo", "build", "--release", "-p", "fl-server"], cwd=REPO, check=True)
    torch.manual_seed(args.seed)
    net = Net()
    init = REPO / f"{args.out}-init.safetensors"
    init.parent.mkdir(parents=True, exist_ok=True)
    save_file(net.state_dict(), str(init))
    settings = {"model.init": init, "train.epochs": args.epochs,
                "train.batch_size": args.batch_size, "train.learning_rate": args.learning_rate}
    server = subprocess.Popen(
        [str(REPO / "target" / "release" / "fl-server"), "--listen", "127.0.0.1:0",
         "--config", str(REPO / "examples" / "pytorch" / "server.toml"),
         "--clients", str(args.clients), "--clients-per-round", str(args.per_round),
         "--rounds", str(args.rounds), "--out", args.out, "--overwrite",
         *(a for key, value in settings.items() for a in ("--set", f"{key}={value}"))],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn"},
    )
    url = "http://" + server.stdout.readline().split()[-1]
    started = time.monotonic()
    run_clients(url, net, args.clients)
    server.wait()
    elapsed = time.monotonic() - started
    report(REPO / args.out, elapsed)


def run_clients(url: str, net: nn.Module, clients: int):
    """K clients on threads: each waits on the network with the GIL released, and trains (one at
    a time) when it is sampled."""
    x, y = load_mnist("train")
    lock, errors = threading.Lock(), []

    def client(i):
        share = iid_share(len(y), clients, i)
        trainer = TorchClient(net, lock, x[share], y[share])
        try:
            fl_client.Client(url, name=f"torch-{i}").run(trainer.train, len(share),
                                                         evaluate=trainer.evaluate)
        except fl_client.ClientError as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"{len(errors)} clients failed, the first with: {errors[0]}")


def report(out: Path, elapsed: float):
    """Each round's federated evaluation and time, then the final model's test accuracy."""
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rounds:
        fed = r.get("federated_eval")
        figure = f"federated accuracy {fed['accuracy']:.4f} ({fed['clients']} clients)" if fed else ""
        print(f"round {r['round']:3d}  {r['seconds']:7.3f} s  {figure}")
    net = Net()
    # The server's model has no integer buffers (num_batches_tracked): this network keeps its own.
    net.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    x, y = load_mnist("t10k")
    loss, accuracy, n = evaluate(net, torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y))
    seconds = sorted(r["seconds"] for r in rounds)
    print(f"{len(rounds)} rounds in {elapsed:.1f} s; median round {seconds[len(seconds) // 2]:.3f} s;"
          f" the server's model.safetensors on the {n} test examples: accuracy {accuracy:.4f},"
          f" loss {loss:.4f}")


if __name__ == "__main__":
    main()
