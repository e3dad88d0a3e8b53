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

With FLOWER_SECURE=1, every client of the 100 takes part in every round and the sum goes through
Flower's SecAgg+ (`SecAggPlusWorkflow` on the server, `secaggplus_mod` on the clients), each
client's key shared with FLOWER_SHARES - 1 neighbours and recovered from FLOWER_THRESHOLD shares.
"""

import json
import os
import sys
import time

import torch
from flwr.client import ClientApp
from flwr.common import Context, ndarrays_to_parameters
from flwr.client.mod import secaggplus_mod
from flwr.server import LegacyContext, ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.simulation import run_simulation

import flower_task as task

SECURE = os.environ.get("FLOWER_SECURE") == "1"
PER_ROUND = task.CLIENTS if SECURE else 10
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
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


def strategy():
    return FedAvg(
        fraction_fit=PER_ROUND / task.CLIENTS, fraction_evaluate=0.0, min_fit_clients=PER_ROUND,
        min_available_clients=task.CLIENTS, evaluate_fn=evaluate,
        initial_parameters=ndarrays_to_parameters(task.get(task.model())),
    )


def server_fn(context: Context):
    return ServerAppComponents(strategy=strategy(), config=ServerConfig(num_rounds=ROUNDS))


if SECURE:
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):
        legacy = LegacyContext(context, ServerConfig(num_rounds=ROUNDS), strategy())
        secure = SecAggPlusWorkflow(
            num_shares=int(os.environ["FLOWER_SHARES"]),
            reconstruction_threshold=int(os.environ["FLOWER_THRESHOLD"]),
        )
        DefaultWorkflow(fit_workflow=secure)(grid, legacy)

    client_app = ClientApp(client_fn=task.client_fn, mods=[secaggplus_mod])
else:
    server_app = ServerApp(server_fn=server_fn)
    client_app = ClientApp(client_fn=task.client_fn)

run_simulation(
    server_app=server_app, client_app=client_app, num_supernodes=task.CLIENTS,
    backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
)
