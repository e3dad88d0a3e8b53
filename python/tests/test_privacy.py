"""The round's protection is the Rust library's, whoever trains: secure aggregation from Python
clients releases the exact sum, and ldp-gaussian from Python adds the noise it claims."""

import math

import numpy as np
import pytest
from conftest import run_clients

import fl_client

D = 784 * 10 + 10  # the logistic model's parameters


def recording(deltas, seen):
    """A trainer that records each global model it receives and returns it moved by `deltas`."""

    def train(weights, config):
        seen.append(weights.copy())
        return weights + deltas

    return train


def test_secure_aggregation_of_python_clients_releases_the_exact_mean(start_server):
    server = start_server(
        "--model", "logistic", "--clients", "3", "--clients-per-round", "3", "--rounds", "2",
        config='[privacy]\nmode = "secagg"\nclip = "fixed"\nclip_bound = 1.0\n'
        '[secagg]\nnoise = "none"\nbits = 32\n',
    )
    rng = np.random.default_rng(7)
    deltas = [rng.uniform(-0.01, 0.01, D).astype(np.float32) for _ in range(3)]
    seen = [[] for _ in range(3)]
    clients = [(fl_client.Client(server.url), recording(d, s), 100) for d, s in zip(deltas, seen)]
    reports = run_clients(clients)
    assert server.wait() == 0
    assert [r["rounds_trained"] for r in reports] == [2, 2, 2], reports
    w1, w2 = seen[0]
    assert all(np.array_equal(s[0], w1) and np.array_equal(s[1], w2) for s in seen)
    # Each update (L2 norm about 0.5, under S = 1: not clipped) is coded as gamma u rounded
    # stochastically, gamma = 2^24 / S (the quantizer's cap; 32 bits leave room for it), so each
    # code is within one level, 1/gamma, of gamma u, and so is the decoded mean; f32 arithmetic
    # on |w| < 0.125 adds at most two half-ulps (2^-28 each). A mask left in the sum would be of the
    # ring's size.
    expected = w1 + np.mean(deltas, axis=0, dtype=np.float64)
    assert np.max(np.abs(w2 - expected)) <= 2**-24 + 2**-26


def analytic_gaussian_sigma(epsilon, delta, sensitivity):
    """The smallest sigma for which N(0, sigma^2) is (epsilon, delta)-DP at `sensitivity`
    (Balle and Wang 2018, Thm 8), by bisection; written here independently of the Rust one."""
    phi = lambda t: 0.5 * math.erfc(-t / math.sqrt(2))  # noqa: E731

    def delta_at(sigma):
        a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
        return phi(a - b) - math.exp(epsilon) * phi(-a - b)

    lo, hi = 1e-6, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > delta else (lo, mid)
    return hi


def test_ldp_gaussian_from_python_adds_the_claimed_noise(start_server):
    epsilon, delta, clip, m = 8.0, 1e-5, 1.0, 3
    server = start_server(
        "--model", "logistic", "--clients", str(m), "--clients-per-round", str(m),
        "--rounds", "2",
        config=f'[privacy]\nmode = "ldp-gaussian"\n[local]\nepsilon = {epsilon}\n'
        f"delta = {delta}\nclip_bound = {clip}\n",
    )
    seen = [[] for _ in range(m)]
    zero = np.zeros(D, dtype=np.float32)
    clients = [(fl_client.Client(server.url), recording(zero, s), 100) for s in seen]
    reports = run_clients(clients)
    assert server.wait() == 0
    assert [r["local_releases"] for r in reports] == [2] * m, reports
    w1, w2 = seen[0]
    # Every client's update is 0, so w2 - w1 is the mean of m noise vectors: per coordinate
    # N(0, sigma^2 / m), sigma calibrated for (epsilon, delta) at sensitivity 2C.
    sigma = analytic_gaussian_sigma(epsilon, delta, 2 * clip)
    noise = (w2.astype(np.float64) - w1) * math.sqrt(m) / sigma
    # The sample variance of D standard normals has standard deviation sqrt(2 / D) = 0.016:
    # five of them bound it; the mean has standard deviation 1 / sqrt(D) = 0.011.
    assert abs(noise.var() - 1) < 5 * math.sqrt(2 / D), noise.var()
    assert abs(noise.mean()) < 5 / math.sqrt(D), noise.mean()


def test_the_total_epsilon_cap_holds_across_a_restart(start_server, tmp_path):
    config = '[privacy]\nmode = "ldp-gaussian"\n[local]\nepsilon = 4.0\ndelta = 1e-5\n'
    zero = np.zeros(D, dtype=np.float32)

    def capped():
        client = fl_client.Client(
            server.url, max_total_epsilon=5.0, state_dir=str(tmp_path), connect_timeout=30
        )
        return (client, recording(zero, []), 100)

    # Two releases at epsilon 4 compose past 5: the first is made, the second refused.
    server = start_server(
        "--model", "logistic", "--clients", "1", "--clients-per-round", "1", "--rounds", "2",
        config=config,
    )
    [first] = run_clients([capped()])
    server.wait()
    assert (first["local_releases"], first["tasks_refused"]) == (1, 1), first
    assert (tmp_path / "local--python.json").exists()
    # A restarted client reads what it spent (its one release): it refuses from the first round.
    server = start_server(
        "--model", "logistic", "--clients", "1", "--clients-per-round", "1", "--rounds", "1",
        config=config,
    )
    [again] = run_clients([capped()])
    server.wait()
    assert (again["rounds_trained"], again["tasks_refused"]) == (0, 1), again
    assert (again["local_releases"], again["local_epsilon"]) == (1, 4.0), again


def test_a_policy_needs_its_authority():
    with pytest.raises(ValueError, match="policy needs authority"):
        fl_client.Client("http://127.0.0.1:1", policy="policy.toml")
