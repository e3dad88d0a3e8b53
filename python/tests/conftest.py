"""Fixtures: the project's `fl-server`, `fl-client` and `fl` binaries (built once per test session with
cargo), a server started on a free loopback port, and the numpy example's MNIST trainer."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "numpy"))

# Seconds any one test may wait for its server: every test ends by itself.
TIMEOUT = 300


@pytest.fixture(scope="session")
def binaries():
    """Paths of fl-server, fl-client and fl, built by cargo (debug profile, as `cargo test`
    builds)."""
    subprocess.run(
        ["cargo", "build", "--quiet", "-p", "fl-server", "-p", "fl-client", "-p", "fl-cli"],
        cwd=REPO,
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug"
    return {"server": target / "fl-server", "client": target / "fl-client", "fl": target / "fl"}


class Server:
    """An fl-server process listening on a free loopback port, writing its run folder `out`."""

    def __init__(self, binary, out, args):
        self.out = Path(out)
        self.proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--data", f"mnist:{REPO / 'data/mnist'}",
             "--out", str(out), *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"fl-server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = "http://" + line.split()[-1]
        # Drain stderr so that the server never blocks on a full pipe.
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def wait(self):
        """Waits for the server to end training; returns its exit code."""
        try:
            return self.proc.wait(timeout=TIMEOUT)
        finally:
            self.proc.kill()

    def metrics(self):
        """The run's metrics.jsonl lines."""
        import json

        lines = (self.out / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def start_server(binaries, tmp_path):
    """Starts fl-server with extra flags (and `config`, the text of a TOML run configuration);
    kills whatever is left at the end."""
    started = []

    def start(*args, config=None):
        name = f"run{len(started)}"
        if config is not None:
            (tmp_path / f"{name}.toml").write_text(config)
            args = ("--config", str(tmp_path / f"{name}.toml"), *args)
        server = Server(binaries["server"], tmp_path / name, args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.proc.kill()


def run_clients(clients):
    """Runs `(client, train, num_examples[, evaluate])` tuples on threads; returns their reports
    or exceptions in order."""
    results = [None] * len(clients)

    def go(i, client, train, n, evaluate=None):
        try:
            results[i] = client.run(train, n, evaluate=evaluate)
        except Exception as e:  # noqa: BLE001 - handed to the test
            results[i] = e

    threads = [threading.Thread(target=go, args=(i, *c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    return results
