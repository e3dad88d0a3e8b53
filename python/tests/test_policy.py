"""A Python client under a federation policy gives only what its policy lists (default deny),
as the Rust client does: the policy is the Rust library's, whoever trains."""

import math
import subprocess

import pytest
from conftest import run_clients

import fl_client


def federation(fl, tmp_path, allow):
    """An authority, one certified site ("site-1") and a policy allowing `allow`, made with
    `fl authority` as a federation's operators would; returns the Client keyword arguments."""
    authority, site = tmp_path / "authority", tmp_path / "site"

    def run(*args):
        subprocess.run([str(fl), "authority", *map(str, args)], check=True, capture_output=True)

    run("init", "--dir", authority)
    run("identity", "--dir", site)
    run("sign", "--key", authority / "authority.key", "--name", "site-1",
        "--identity", site / "identity.pub", "--out", site / "certificate.toml")
    run("policy", "--key", authority / "authority.key", "--federation", "hospitals",
        "--serial", "1", "--allow", allow, "--min-clients", "3", "--min-degree", "complete",
        "--min-noise-multiplier", "4", "--max-release-epsilon", "4", "--max-total-epsilon", "10",
        "--out", tmp_path / "policy.toml")
    return {
        "authority": str(authority / "authority.pub"),
        "identity": str(site / "identity.key"),
        "certificate": str(site / "certificate.toml"),
        "policy": str(tmp_path / "policy.toml"),
        "state_dir": str(tmp_path / "state"),
        "name": "site-1",
        "connect_timeout": 30,
    }


def test_a_policy_client_refuses_a_plain_round(start_server, binaries, tmp_path):
    """A plain round (privacy mode none: the raw update, loss and example count) sent to a
    Python client whose policy allows only secure aggregation is refused, naming the rule;
    its training code is never called, so nothing of its data is computed, let alone sent."""
    options = federation(binaries["fl"], tmp_path, "secagg")
    server = start_server(
        "--model", "logistic", "--clients", "1", "--clients-per-round", "1", "--rounds", "1",
    )
    calls = []

    def train(weights, config):
        calls.append(config)
        return weights

    [report] = run_clients([(fl_client.Client(server.url, **options), train, 100)])
    server.wait()
    assert not isinstance(report, Exception), report
    assert calls == []
    assert report["rounds_trained"] == 0, report
    assert report["tasks_refused"] >= 1, report
    assert "does not allow plain rounds" in report["last_refusal"], report


@pytest.mark.parametrize("cap", [math.nan, -1.0, 0.0, math.inf])
def test_an_unusable_total_cap_is_refused(cap):
    """max_total_epsilon is checked as fl-client's --max-total-epsilon is: a positive number."""
    with pytest.raises(ValueError, match="max_total_epsilon"):
        fl_client.Client("http://127.0.0.1:1", max_total_epsilon=cap)
