"""The quickstart job on Flower's simulation engine with a PyTorch client, for a side-by-side
comparison with `fl sim` (scripts/flower-compare.sh): 100 clients holding two label shards of
300 MNIST training examples each, 10 sampled per round, the 784-600-100-10 ReLU MLP (or the CNN,
and E, B and lr, as scripts/flower_task.py reads them from the environment), SGD, FedAvg weighted
by example counts, and the server evaluating the global
model on the 10,000 test examples after every round (as fl-server does). The client side is in
scripts/flower_task.py (run with scripts/ on PYTHONPATH).

    python scripts/flower_mnist.py OUT.jsonl [ROUNDS]

Writes one JSON line per round (round, seconds since the previous round ended, test accuracy)
to OUT.jsonl.
"""

import json
import sys
import time

import torch
from flwr.client import ClientApp
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation

import flower_task as task

PER_ROUND, ROUNDS = 10, int(sys.argv[2]) if len(sys.argv) > 2 else 100
test_x, test_y = task.test_set()
log = open(sys.argv[1], "w")
last = [None]


def evaluate(server_round, parameters, config):
    model = task.model()
    task.put(model, parameters)
    with torch.no_grad():
        logits = torch.cat([model(x) for x in test_x.split(1000)])
    accuracy = (logits.argmax(1) == test_y).float().mean().item()
    now = time.monotonic()
    if server_round > 0:
        log.write(json.dumps({"round": server_round, "seconds": now - last[0], "test_accuracy": accuracy}) + "\n")
        log.flush()
    last[0] = now
    return torch.nn.functional.cross_entropy(logits, test_y).item(), {"accuracy": accuracy}


def server_fn(context: Context):
    strategy = FedAvg(
        fraction_fit=PER_ROUND / task.CLIENTS, fraction_evaluate=0.0, min_fit_clients=PER_ROUND,
        min_available_clients=task.CLIENTS, evaluate_fn=evaluate,
        initial_parameters=ndarrays_to_parameters(task.get(task.model())),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ROUNDS))


run_simulation(
    server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=task.client_fn),
    num_supernodes=task.CLIENTS, backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
)
