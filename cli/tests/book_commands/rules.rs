//! What becomes of each command of the pages: run here (with the edits that shorten it or fill
//! in a placeholder), or run elsewhere, which the rule names. The first rule of a page whose
//! text is in the command is its rule.

use super::shell::Run;

/// How a command is tried.
pub enum How {
    /// Run here.
    Run(Run),
    /// Not run by this test: where it is run, or why it cannot be here.
    Elsewhere(&'static str),
}

/// A page's command and how it is tried.
pub struct Rule {
    /// The page's file name.
    pub page: &'static str,
    /// Text the command contains.
    pub command: &'static str,
    pub how: How,
}

/// The textual edits of a command before it runs: (from, to), each done once.
type Edits = &'static [(&'static str, &'static str)];

/// Run with `edits`.
const fn edited(edits: Edits) -> How {
    How::Run(Run {
        edits,
        background: false,
        until: None,
    })
}

/// Run with `edits`, side by side with the commands after it (another terminal).
const fn beside(edits: Edits) -> How {
    How::Run(Run {
        edits,
        background: true,
        until: None,
    })
}

/// Run with `edits`, stopped once a line contains `line`.
const fn stopped_at(edits: Edits, line: &'static str) -> How {
    How::Run(Run {
        edits,
        background: false,
        until: Some(line),
    })
}

/// Run as written.
const AS_IS: How = edited(&[]);

/// Run as written, side by side with the commands after it (another terminal).
const BESIDE: How = beside(&[]);

/// `cargo run --release -p fl-cli --` is the `fl` this test was built with.
const CARGO_RUN: (&str, &str) = ("cargo run --release -p fl-cli --", "fl");

/// The binaries are this build's, at `target/release` in the page's folder.
const BUILT: How = How::Elsewhere(
    "cargo test --workspace builds these binaries; the test links them at target/release",
);

/// A private run to check the ledger of (one round of the private tutorial's job).
const A_RUN: &str = "fl sim --config configs/geyer-k100.toml --set server.rounds=1 \
                     > /dev/null 2>&1 && fl privacy ledger";

/// The flags that make a page's server one of one client and one round, on the page's port.
macro_rules! one_round {
    () => {
        "--listen 127.0.0.1:50051 --set server.clients=1 --set server.clients_per_round=1 \
         --set server.rounds=1"
    };
}

/// A private run's server stopped by SIGTERM while it waits for its clients, in `runs/NAME`,
/// before the page's `fl-server --resume`.
const INTERRUPTED: &str = "fl-server --config configs/geyer-k100.toml --listen 127.0.0.1:0 \
    --out runs/NAME > interrupted.log 2>&1 &\n\
    until grep -q 'waiting for clients' interrupted.log; do sleep 0.1; done\n\
    kill -TERM $! && wait $!\n\
    fl-server --resume";

/// Docker is tried by `.ci/run`.
const COMPOSE: How = How::Elsewhere(
    "deploy/smoke.sh, which .ci/run runs where a Docker engine answers, builds the images, makes \
     the certificates and runs these compose files",
);

/// Kubernetes needs a cluster.
const CLUSTER: How = How::Elsewhere(
    "needs a Kubernetes cluster: .ci/run checks the manifests against the Kubernetes API schemas",
);

/// Every command of the pages, by page.
pub const RULES: &[Rule] = &[
    // README.md
    rule(
        "README.md",
        "sim --config configs/quickstart.toml",
        edited(&[
            CARGO_RUN,
            ("quickstart.toml", "quickstart.toml --set server.rounds=3"),
        ]),
    ),
    rule(
        "README.md",
        "cargo test --workspace",
        How::Elsewhere("the command that runs this test"),
    ),
    rule(
        "README.md",
        "python3 -m venv .venv",
        How::Elsewhere(".ci/run makes a fresh virtual environment (target/ci-venv)"),
    ),
    rule(
        "README.md",
        "pip install ./python",
        How::Elsewhere(
            ".ci/run installs ./python with pip into its environment and runs \
             examples/numpy/train.py, short (10 clients, 2 rounds)",
        ),
    ),
    // privacy-in-five-minutes.md
    rule(
        "privacy-in-five-minutes.md",
        "fl privacy ledger runs/latest --verify",
        edited(&[("fl privacy ledger", A_RUN)]),
    ),
    rule(
        "privacy-in-five-minutes.md",
        "fl privacy ledger runs/latest",
        AS_IS,
    ),
    // tutorials/first-run.md
    rule(
        "first-run.md",
        "clients_per_round=20",
        edited(&[CARGO_RUN, ("epochs=1", "epochs=1 --set server.rounds=3")]),
    ),
    rule(
        "first-run.md",
        "sim --config configs/quickstart.toml",
        stopped_at(&[CARGO_RUN], "round 3/100"),
    ),
    // tutorials/own-model.md
    rule("own-model.md", "cargo build --release", BUILT),
    rule(
        "own-model.md",
        "target/release/fl-server",
        beside(&[("server.toml", "server.toml --listen 127.0.0.1:50051")]),
    ),
    rule(
        "own-model.md",
        "own-trainer --site",
        edited(&[("--sites 3", "--sites 3 --server http://127.0.0.1:50051")]),
    ),
    // tutorials/private-run.md
    rule("private-run.md", "cargo build --release", BUILT),
    rule("private-run.md", "export PATH", AS_IS),
    rule(
        "private-run.md",
        "fl sim --config configs/geyer-k100.toml",
        AS_IS,
    ),
    rule("private-run.md", "fl privacy", AS_IS),
    // tutorials/processes.md
    rule("processes.md", "cargo build --release", BUILT),
    rule("processes.md", "export PATH", AS_IS),
    rule("processes.md", "od -An -tx1 -N32 /dev/urandom", AS_IS),
    rule(
        "processes.md",
        "fl-server --config configs/geyer-k100.toml",
        BESIDE,
    ),
    rule("processes.md", "--simulate 25 &", AS_IS),
    rule("processes.md", "fl privacy ledger runs/latest", AS_IS),
    rule("processes.md", "--connect-timeout 4", AS_IS),
    // how-to/accuracy-per-epsilon.md: one round of a few clients, the same settings
    rule(
        "accuracy-per-epsilon.md",
        "geyer-k1000.toml",
        edited(&[(
            "epochs=3",
            "epochs=3 --set server.rounds=1 --set server.clients_per_round=10",
        )]),
    ),
    rule(
        "accuracy-per-epsilon.md",
        "geyer-cnn-k1000.toml",
        edited(&[(
            "random_shift=1",
            "random_shift=1 --set server.rounds=1 --set server.clients_per_round=5",
        )]),
    ),
    // how-to/aggregators.md
    rule("aggregators.md", "export", AS_IS),
    rule("aggregators.md", "fl-server", AS_IS),
    rule("aggregators.md", "fl-client", AS_IS),
    rule("aggregators.md", "wait", AS_IS),
    // how-to/async.md
    rule(
        "async.md",
        "quickstart-async.toml",
        edited(&[
            CARGO_RUN,
            ("async.toml", "async.toml --set server.rounds=5"),
        ]),
    ),
    // how-to/compose.md
    rule("compose.md", "deploy/", COMPOSE),
    rule("compose.md", "export FL_TOKEN", COMPOSE),
    // how-to/flower.md
    rule(
        "flower.md",
        "scripts/flower-compare.sh",
        How::Elsewhere(
            "a comparison with Flower installed, minutes long: its figures and command are in \
         docs/src/results/speed.md",
        ),
    ),
    // how-to/kubernetes.md
    rule("kubernetes.md", "deploy/build-images.sh", COMPOSE),
    rule("kubernetes.md", "deploy/make-certs.sh", AS_IS),
    rule("kubernetes.md", "fl enroll", AS_IS),
    rule("kubernetes.md", "kubectl", CLUSTER),
    // how-to/resume.md: a server stopped while it waits for its clients, resumed; each resumed
    // server is stopped once it waits for its clients again
    rule(
        "resume.md",
        "--listen 0.0.0.0:50052",
        stopped_at(&[("0.0.0.0:50052", "127.0.0.1:0")], "waiting for clients"),
    ),
    rule(
        "resume.md",
        "fl-server --resume runs/NAME",
        stopped_at(
            &[("fl-server --resume", INTERRUPTED)],
            "waiting for clients",
        ),
    ),
    rule("resume.md", "fl privacy ledger runs/NAME --verify", AS_IS),
    // how-to/tls-enrollment.md
    rule("tls-enrollment.md", "export FL_TOKEN", AS_IS),
    rule(
        "tls-enrollment.md",
        "fl-server --config configs/quickstart.toml",
        beside(&[("quickstart.toml", ONE_ROUND_QUICKSTART)]),
    ),
    rule(
        "tls-enrollment.md",
        "--data csv:site.csv",
        edited(&[
            ("SERVER", "127.0.0.1"),
            ("csv:site.csv", "mnist:data/mnist --partition shards:100:0"),
        ]),
    ),
    rule("tls-enrollment.md", "deploy/make-certs.sh", AS_IS),
    rule("tls-enrollment.md", "fl enroll", AS_IS),
    rule("tls-enrollment.md", "fl revoke", AS_IS),
    rule(
        "tls-enrollment.md",
        "FL_TOKEN=<hospital-1's token>",
        How::Elsewhere(
            "a client with its enrolled token: server/tests/enrollment.rs runs one against a server \
         with an enrollment file",
        ),
    ),
    rule(
        "tls-enrollment.md",
        "fl-server --tls-cert",
        beside(&[("ca.pem ...", TLS_SERVER)]),
    ),
    rule(
        "tls-enrollment.md",
        "fl-client --server https://HOST:50051",
        edited(&[
            ("HOST", "127.0.0.1"),
            (
                "client-0.key ...",
                "client-0.key --data mnist:data/mnist --partition shards:100:0",
            ),
        ]),
    ),
    // how-to/watch.md
    rule(
        "watch.md",
        "fl sim --config configs/geyer-k100.toml --page-listen",
        edited(&[(
            "--page-listen",
            "--page-listen 127.0.0.1:0 --set server.rounds=1",
        )]),
    ),
    rule(
        "watch.md",
        "fl-server --config run.toml",
        stopped_at(
            &[("run.toml", "configs/quickstart.toml --listen 127.0.0.1:0")],
            "live run page url=",
        ),
    ),
];

/// The quickstart's server for one client and one round.
const ONE_ROUND_QUICKSTART: &str = concat!("quickstart.toml ", one_round!());

/// The TLS how-to's server: the quickstart's, for one client and one round.
const TLS_SERVER: &str = concat!("ca.pem --config configs/quickstart.toml ", one_round!());

/// A rule (short, for the table).
const fn rule(page: &'static str, command: &'static str, how: How) -> Rule {
    Rule { page, command, how }
}
