"""Python clients train with the Rust server and a Rust client, and a misbehaving Python trainer
costs only its own rounds."""

import subprocess

import numpy as np
import pytest
from conftest import REPO, TIMEOUT, run_clients
from numpy_mlp import DenseTrainer, iid_share, load_mnist

import fl_client

LOGISTIC = [784, 10]


@pytest.fixture(scope="module")
def mnist():
    return load_mnist("train")


def trainers(mnist, count, per_client=2000):
    x, y = mnist
    shares = [iid_share(count * per_client, count, i) for i in range(count)]
    return [DenseTrainer(x[s], y[s], LOGISTIC) for s in shares]


def test_python_and_rust_clients_train_together(binaries, start_server, mnist):
    server = start_server(
        "--model", "logistic", "--clients", "4", "--clients-per-round", "4", "--rounds", "3",
        "--epochs", "1", "--batch-size", "10", "--lr", "0.1",
    )
    rust = subprocess.Popen(
        [str(binaries["client"]), "--server", server.url, "--data", f"mnist:{REPO / 'data/mnist'}",
         "--partition", "shards:30:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    python = [(fl_client.Client(server.url, name=f"py{i}"), t.train, len(t.y))
              for i, t in enumerate(trainers(mnist, 3))]
    reports = run_clients(python)
    assert rust.wait(timeout=TIMEOUT) == 0
    assert server.wait() == 0
    for report in reports:
        assert isinstance(report, dict), report
        assert report["rounds_trained"] == 3
        assert report["tasks_refused"] == 0
        assert report["local_releases"] == 0
    metrics = server.metrics()
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert all(m["completed"] == 4 for m in metrics), metrics
    # Logistic regression on 6,600 MNIST examples reaches about 0.88 after three rounds of E = 1.
    assert metrics[-1]["test_accuracy"] > 0.8, metrics[-1]


def test_a_failing_trainer_costs_only_its_own_rounds(start_server, mnist):
    server = start_server(
        "--model", "logistic", "--clients", "3", "--clients-per-round", "3", "--min-clients", "2",
        "--rounds", "3", "--epochs", "1", "--batch-size", "20", "--lr", "0.1",
    )
    faults = iter([
        lambda w: (_ for _ in ()).throw(RuntimeError("out of GPU memory")),
        lambda w: np.full_like(w, np.nan),
        lambda w: w[:-1],
    ])

    def bad(weights, config):
        return next(faults)(weights)

    good = trainers(mnist, 2)
    clients = [(fl_client.Client(server.url), t.train, len(t.y)) for t in good]
    clients.append((fl_client.Client(server.url, name="bad"), bad, 100))
    reports = run_clients(clients)
    assert server.wait() == 0
    assert [r["rounds_trained"] for r in reports[:2]] == [3, 3]
    assert [r["tasks_refused"] for r in reports[:2]] == [0, 0]
    assert reports[2]["tasks_refused"] == 3, reports[2]
    assert "values for a model of 7850 parameters" in reports[2]["last_refusal"]
    metrics = server.metrics()
    assert [(m["round"], m["completed"]) for m in metrics] == [(1, 2), (2, 2), (3, 2)]
    assert metrics[-1]["test_accuracy"] > 0.7


def test_options_are_checked_before_connecting():
    with pytest.raises(ValueError, match="built-in trainer"):
        fl_client.Client("http://127.0.0.1:1", privacy="ldp-laplace")
    with pytest.raises(ValueError, match="unknown local mechanism"):
        fl_client.Client("http://127.0.0.1:1", privacy="ldp-magic")
    with pytest.raises(ValueError, match="need ca"):
        fl_client.Client("http://127.0.0.1:1", cert="c.pem", key="k.pem")
    with pytest.raises(ValueError, match="go together"):
        fl_client.Client("http://127.0.0.1:1", authority="authority.pub")
    with pytest.raises(ValueError, match="reading"):
        fl_client.Client(
            "http://127.0.0.1:1",
            authority="missing.pub",
            identity="identity.key",
            certificate="certificate.toml",
        )


def test_a_refused_token_is_a_server_error(start_server):
    server = start_server("--model", "logistic", "--clients", "1", "--clients-per-round", "1",
                          "--rounds", "1",
                          "--token", "a" * 32)
    client = fl_client.Client(server.url, token="wrong", connect_timeout=5)
    with pytest.raises(fl_client.ServerError) as refused:
        client.run(lambda w, c: w, 10)
    assert refused.value.code == "Unauthenticated"
    server.proc.kill()


def test_federated_evaluation_reports_the_weighted_means(start_server):
    server = start_server(
        "--model", "logistic", "--clients", "3", "--clients-per-round", "3", "--rounds", "3",
        config="[eval]\nfederated = true\nevery = 2\n",
    )
    figures = [(0.5, 0.9, 100), (1.0, 0.6, 300), (2.0, 0.1, 0)]  # the last one is unusable

    clients = [(fl_client.Client(server.url), lambda w, c: w, 50, lambda w, f=f: f)
               for f in figures]
    results = run_clients(clients)
    assert server.wait() == 0
    assert [r["rounds_trained"] for r in results] == [3, 3, 3]
    metrics = server.metrics()
    # Rounds 1 and 3 ask (every = 2); n = 0 is not reported, so two clients count.
    assert "federated_eval" not in metrics[1]
    for m in (metrics[0], metrics[2]):
        fe = m["federated_eval"]
        assert (fe["clients"], fe["examples"]) == (2, 400)
        assert fe["accuracy"] == pytest.approx((0.9 * 100 + 0.6 * 300) / 400, rel=1e-12)
        assert fe["loss"] == pytest.approx((0.5 * 100 + 1.0 * 300) / 400, rel=1e-12)


def test_federated_evaluation_is_refused_under_a_privacy_mode(binaries, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[eval]\nfederated = true\n[privacy]\nmode = "ldp-gaussian"\n')
    out = subprocess.run([str(binaries["server"]), "--config", str(config), "--listen",
                          "127.0.0.1:0"], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode != 0
    assert "eval.federated" in out.stderr
