"""A model the server does not know: the user's starting tensors in a safetensors file define it,
Python clients train it by name through `flatten`/`unflatten`, federated evaluation gives its
figures, and the server's `model.safetensors` keeps the user's names and shapes."""

import json
import struct

import numpy as np
from conftest import run_clients

import fl_client

ROUNDS = 2


def write_safetensors(path, tensors):
    """The safetensors format by hand (numpy only): a little-endian u64 header length, the JSON
    header of dtypes, shapes and byte ranges, then the data."""
    header, data = {}, b""
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    """name -> (dtype, array) of a safetensors file."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    body = raw[8 + size :]
    return {
        name: (h["dtype"], np.frombuffer(body[h["data_offsets"][0] : h["data_offsets"][1]],
                                         dtype="<f4").reshape(h["shape"]))
        for name, h in header.items()
    }


def test_an_external_model_trains_by_name_and_comes_back_under_its_names(start_server, tmp_path):
    init = {
        "fc.weight": np.arange(6, dtype=np.float32).reshape(3, 2) / 8,
        "conv.bias": np.array([-1.0, 1.5], dtype=np.float32),
    }
    write_safetensors(tmp_path / "init.safetensors", init)
    server = start_server(config=f"""
[server]
clients = 3
clients_per_round = 3
rounds = {ROUNDS}
[model]
kind = "external"
init = "{tmp_path / 'init.safetensors'}"
[eval]
federated = true
""")
    seen = []

    def train(weights, config):
        seen.append(config["model"])
        tensors = fl_client.unflatten(weights, init)
        tensors["fc.weight"] += 1.0
        tensors["conv.bias"] -= 1.0
        return fl_client.flatten(tensors)

    def evaluate(weights):
        return 0.25, 0.75, 20

    clients = [(fl_client.Client(server.url), train, 20, evaluate) for _ in range(3)]
    results = run_clients(clients)
    assert server.wait() == 0, "".join(server.log)
    assert all(isinstance(r, dict) and r["rounds_trained"] == ROUNDS for r in results), results
    assert set(seen) == {"external: 2 tensors, 8 parameters"}
    for line in server.metrics():
        assert line["test_accuracy"] is None and line["completed"] == 3, line
        assert line["federated_eval"] == {"clients": 3, "examples": 60, "accuracy": 0.75,
                                          "loss": 0.25}, line
    out = read_safetensors(server.out / "model.safetensors")
    assert set(out) == set(init)
    for name, sign in [("fc.weight", 1.0), ("conv.bias", -1.0)]:
        dtype, values = out[name]
        assert dtype == "F32" and values.shape == init[name].shape
        np.testing.assert_array_equal(values, init[name] + sign * ROUNDS)
