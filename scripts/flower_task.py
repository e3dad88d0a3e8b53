"""The client side of the Flower comparison (scripts/flower_mnist.py): MNIST shards, the model
(FLOWER_MODEL: `mlp`, the default, or `cnn`) and the PyTorch client. A module of its own, imported
by name in the simulation's worker processes, so that each worker loads the training set once
from disk instead of receiving it pickled with every task (Flower's app layout: the client app
lives in an importable module). FLOWER_EPOCHS, FLOWER_BATCH and FLOWER_LR set E, B and lr
(default 1, 50, 0.1).
"""

import gzip
import os

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import Context

CLIENTS = 100
MODEL = os.environ.get("FLOWER_MODEL", "mlp")
EPOCHS = int(os.environ.get("FLOWER_EPOCHS", "1"))
BATCH = int(os.environ.get("FLOWER_BATCH", "50"))
LR = float(os.environ.get("FLOWER_LR", "0.1"))
DATA = "data/mnist"
torch.set_num_threads(1)


def idx(name):
    with gzip.open(f"{DATA}/{name}.gz") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape).copy()


def images(name):
    """Pixels in [0, 1]: flat rows for the MLP, 1 x 28 x 28 images for the CNN."""
    shape = (-1, 784) if MODEL == "mlp" else (-1, 1, 28, 28)
    return torch.tensor(idx(name).reshape(shape) / 255.0, dtype=torch.float32)


_train = None


def train_set():
    """(x, y, parts), loaded once per process: McMahan et al.'s pathological non-IID split, sort
    by label, 200 shards of 300, two per client."""
    global _train
    if _train is None:
        x = images("train-images-idx3-ubyte")
        y = torch.tensor(idx("train-labels-idx1-ubyte"), dtype=torch.long)
        order = np.argsort(y.numpy(), kind="stable")
        shards = np.random.default_rng(0).permutation(200)
        parts = [
            np.concatenate([order[s * 300 : (s + 1) * 300] for s in shards[2 * k : 2 * k + 2]])
            for k in range(CLIENTS)
        ]
        _train = (x, y, parts)
    return _train


def test_set():
    return images("t10k-images-idx3-ubyte"), torch.tensor(idx("t10k-labels-idx1-ubyte"), dtype=torch.long)


def model():
    """The 784-600-100-10 MLP, or McMahan et al. 2017's CNN (configs/quickstart-cnn.toml)."""
    nn = torch.nn
    if MODEL == "mlp":
        return nn.Sequential(
            nn.Linear(784, 600), nn.ReLU(), nn.Linear(600, 100), nn.ReLU(), nn.Linear(100, 10),
        )
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 512), nn.ReLU(), nn.Linear(512, 10),
    )


def get(model):
    return [p.detach().numpy().copy() for p in model.state_dict().values()]


def put(model, arrays):
    model.load_state_dict({k: torch.tensor(v) for k, v in zip(model.state_dict().keys(), arrays)})


class Client(NumPyClient):
    def __init__(self, k):
        x, y, parts = train_set()
        self.x, self.y, self.model = x[parts[k]], y[parts[k]], model()

    def fit(self, parameters, config):
        put(self.model, parameters)
        opt = torch.optim.SGD(self.model.parameters(), lr=LR)
        for _ in range(EPOCHS):
            perm = torch.randperm(len(self.y))
            for i in range(0, len(perm), BATCH):
                b = perm[i : i + BATCH]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(self.model(self.x[b]), self.y[b]).backward()
                opt.step()
        return get(self.model), len(self.y), {}


def client_fn(context: Context):
    return Client(int(context.node_config["partition-id"])).to_client()
