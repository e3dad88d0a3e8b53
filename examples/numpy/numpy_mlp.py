"""The pieces of the numpy example: MNIST from the repository's `data/mnist/`, IID shares of it,
and a trainer for the server's dense networks (`logistic`, `mlp`) written with numpy alone.

The server's parameter layout for a dense network of widths n_0-n_1-...-n_L: for each layer l, its
weight matrix W_l (n_{l-1} x n_l, row-major) then its bias b_l; ReLU between layers, softmax
cross-entropy on the logits.
"""

import gzip
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "data" / "mnist"


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_mnist(split: str = "train"):
    """MNIST's `train` or `t10k` split: features scaled to [0, 1] (n x 784 float32) and labels."""
    images = _idx(MNIST / f"{split}-images-idx3-ubyte.gz")
    labels = _idx(MNIST / f"{split}-labels-idx1-ubyte.gz")
    return images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int64)


def iid_share(n: int, clients: int, index: int, seed: int = 0) -> np.ndarray:
    """Client `index`'s indices among `clients` equal IID shares of n examples."""
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, clients)[index]


def widths(model: str) -> list:
    """The widths of a dense network from the server's description ("784-600-100-10")."""
    try:
        return [int(w) for w in model.split("-")]
    except ValueError:
        raise ValueError(f"this trainer runs dense networks only, not {model!r}") from None


def layers(weights: np.ndarray, sizes: list) -> list:
    """(W_l, b_l) views into the flat `weights`."""
    out, offset = [], 0
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        w = weights[offset : offset + fan_in * fan_out].reshape(fan_in, fan_out)
        offset += fan_in * fan_out
        out.append((w, weights[offset : offset + fan_out]))
        offset += fan_out
    if offset != weights.size:
        raise ValueError(f"{weights.size} weights for a network of {offset}")
    return out


def forward(params: list, x: np.ndarray) -> list:
    """The activations of every layer, the input first and the logits last."""
    acts = [x]
    for i, (w, b) in enumerate(params):
        z = acts[-1] @ w + b
        acts.append(np.maximum(z, 0.0) if i < len(params) - 1 else z)
    return acts


def softmax_loss(logits: np.ndarray, y: np.ndarray):
    """The mean cross-entropy and its gradient with respect to the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(np.maximum(p[np.arange(n), y], 1e-30)).mean())
    p[np.arange(n), y] -= 1.0
    return loss, p / n


def sgd_step(params: list, x: np.ndarray, y: np.ndarray, lr: float) -> float:
    """One mini-batch SGD step in place; returns the batch's loss."""
    acts = forward(params, x)
    loss, delta = softmax_loss(acts[-1], y)
    for l in range(len(params) - 1, -1, -1):
        w, b = params[l]
        grad_w, grad_b = acts[l].T @ delta, delta.sum(axis=0)
        if l > 0:
            delta = (delta @ w.T) * (acts[l] > 0)
        w -= lr * grad_w
        b -= lr * grad_b
    return loss


class DenseTrainer:
    """Local SGD on one client's examples: `train` and `evaluate` as `fl_client.Client.run` takes
    them."""

    def __init__(self, x: np.ndarray, y: np.ndarray, sizes: list):
        self.x, self.y, self.sizes = x, y, sizes

    def train(self, weights: np.ndarray, config: dict):
        if widths(config["model"]) != self.sizes:
            raise ValueError(f"the server trains {config['model']}, this client {self.sizes}")
        weights = weights.copy()
        params = layers(weights, self.sizes)
        rng = np.random.default_rng(config["seed"])
        batch, lr = config["batch_size"], config["learning_rate"]
        losses = []
        for _ in range(config["epochs"]):
            losses = []
            order = rng.permutation(len(self.y))
            for start in range(0, len(order), batch):
                idx = order[start : start + batch]
                losses.append(sgd_step(params, self.x[idx], self.y[idx], lr))
        return weights, float(np.mean(losses))

    def evaluate(self, weights: np.ndarray):
        params = layers(weights, self.sizes)
        logits = forward(params, self.x)[-1]
        loss, _ = softmax_loss(logits, self.y)
        accuracy = float((logits.argmax(axis=1) == self.y).mean())
        return loss, accuracy, len(self.y)
