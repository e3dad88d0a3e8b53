"""The quickstart job on Flower's simulation engine with a PyTorch client, for a side-by-side
comparison with `fl sim` (scripts/flower-compare.sh): 100 clients holding two label shards of
300 MNIST training examples each, 10 sampled per round, the 784-600-100-10 ReLU MLP, E = 1,
B = 50, SGD at lr 0.1, FedAvg weighted by example counts, and the server evaluating the global
model on the 10,000 test examples after every round (as fl-server does).

Writes one JSON line per round (round, seconds since the previous round ended, test accuracy)
to the file given as its first argument.
"""

import gzip
import json
import sys
import time

import numpy as np
import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation

CLIENTS, PER_ROUND, ROUNDS = 100, 10, int(sys.argv[2]) if len(sys.argv) > 2 else 100
EPOCHS, BATCH, LR = 1, 50, 0.1
DATA = "data/mnist"
torch.set_num_threads(1)


def idx(name):
    with gzip.open(f"{DATA}/{name}.gz") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape).copy()


train_x = torch.tensor(idx("train-images-idx3-ubyte").reshape(-1, 784) / 255.0, dtype=torch.float32)
train_y = torch.tensor(idx("train-labels-idx1-ubyte"), dtype=torch.long)
test_x = torch.tensor(idx("t10k-images-idx3-ubyte").reshape(-1, 784) / 255.0, dtype=torch.float32)
test_y = torch.tensor(idx("t10k-labels-idx1-ubyte"), dtype=torch.long)
# McMahan et al.'s pathological non-IID split: sort by label, 200 shards of 300, two per client.
order = np.argsort(train_y.numpy(), kind="stable")
shards = np.random.default_rng(0).permutation(200)
parts = [np.concatenate([order[s * 300 : (s + 1) * 300] for s in shards[2 * k : 2 * k + 2]]) for k in range(CLIENTS)]


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(784, 600), torch.nn.ReLU(),
        torch.nn.Linear(600, 100), torch.nn.ReLU(),
        torch.nn.Linear(100, 10),
    )


def get(model):
    return [p.detach().numpy().copy() for p in model.state_dict().values()]


def put(model, arrays):
    model.load_state_dict({k: torch.tensor(v) for k, v in zip(model.state_dict().keys(), arrays)})


class Client(NumPyClient):
    def __init__(self, part):
        self.x, self.y, self.model = train_x[part], train_y[part], mlp()

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
    return Client(parts[int(context.node_config["partition-id"])]).to_client()


log = open(sys.argv[1], "w")
last = [None]


def evaluate(server_round, parameters, config):
    model = mlp()
    put(model, parameters)
    with torch.no_grad():
        logits = model(test_x)
    accuracy = (logits.argmax(1) == test_y).float().mean().item()
    now = time.monotonic()
    if server_round > 0:
        log.write(json.dumps({"round": server_round, "seconds": now - last[0], "test_accuracy": accuracy}) + "\n")
        log.flush()
    last[0] = now
    return torch.nn.functional.cross_entropy(logits, test_y).item(), {"accuracy": accuracy}


def server_fn(context: Context):
    strategy = FedAvg(
        fraction_fit=PER_ROUND / CLIENTS, fraction_evaluate=0.0, min_fit_clients=PER_ROUND,
        min_available_clients=CLIENTS, evaluate_fn=evaluate,
        initial_parameters=ndarrays_to_parameters(get(mlp())),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ROUNDS))


run_simulation(
    server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
    num_supernodes=CLIENTS, backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
)
