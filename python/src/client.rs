//! `Client`: the options of one federated client, and `run`, which joins the server and trains
//! with a Python callable until the server ends training. The session runs on a tokio runtime
//! with the GIL released; Python is re-entered only to train, to evaluate, and every
//! [`SIGNAL_POLL`] to deliver signals (Ctrl-C stops the client with `KeyboardInterrupt`).

use crate::errors::to_py;
use crate::trainer::PyTrainer;
use fl_authority::policy::{FederationPolicy, SignedPolicy};
use fl_client::{ClientOptions, ClientPrivacy, ClientReport, ClientTls, state_file};
use fl_privacy::{ClientLimits, LocalKind};
use fl_secagg::Credentials;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the waiting client lets Python handle signals.
const SIGNAL_POLL: Duration = Duration::from_millis(200);

/// A federated-learning client of the server at `server` (`http://HOST:PORT`, or `https://` with
/// `ca`). `privacy` is the local mechanism this client insists on (`"follow"`: whatever the round
/// asks; `"ldp-gaussian"` or `"signds"`), and `epsilon`, `delta`, `clip_bound` its own limits,
/// which only tighten the round's mechanism. `authority` (the federation authority's public key
/// file), `identity` and `certificate` (this client's identity key and its certificate) make it
/// take part in signed secure-aggregation rounds only; `revocations` is the authority's list.
/// `policy` (with `authority`) is the federation policy the authority signed: the client refuses
/// any task outside it. `max_total_epsilon` caps the composed epsilon of all local releases (with
/// a policy, the smaller of the two); with either, the spend and the secure rounds taken part in
/// are remembered across restarts in `state_dir` (default `fl-client-state`), one file per
/// federation and `name`.
#[pyclass(module = "fl_client")]
pub(crate) struct Client {
    opts: ClientOptions,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (
        server, *, token=None, ca=None, cert=None, key=None, tls_domain=None,
        privacy="follow", epsilon=None, delta=None, clip_bound=None, name=None,
        connect_timeout=240.0, authority=None, identity=None, certificate=None, revocations=None,
        policy=None, max_total_epsilon=None, state_dir=None, helper_key=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, each optional.
    fn new(
        server: &str,
        token: Option<String>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        tls_domain: Option<String>,
        privacy: &str,
        epsilon: Option<f64>,
        delta: Option<f64>,
        clip_bound: Option<f64>,
        name: Option<String>,
        connect_timeout: f64,
        authority: Option<PathBuf>,
        identity: Option<PathBuf>,
        certificate: Option<PathBuf>,
        revocations: Option<PathBuf>,
        policy: Option<PathBuf>,
        max_total_epsilon: Option<f64>,
        state_dir: Option<PathBuf>,
        helper_key: Option<&str>,
    ) -> PyResult<Self> {
        let policy = federation_policy(policy, authority.as_deref())?;
        let credentials = match (authority, identity, certificate) {
            (None, None, None) if revocations.is_none() => None,
            (Some(authority), Some(identity), Some(certificate)) => {
                let anchor = (authority.as_path(), revocations.as_deref());
                let credentials = Credentials::from_files(&identity, &certificate, anchor);
                Some(Arc::new(credentials.map_err(value_error)?))
            }
            _ => {
                return Err(PyValueError::new_err(
                    "authority, identity and certificate go together (revocations with them)",
                ));
            }
        };
        let limits = ClientLimits {
            epsilon,
            delta,
            clip: clip_bound,
        };
        let mut privacy = client_privacy(privacy, limits, max_total_epsilon)?;
        let helper_key = helper_key.map(fl_client::helper_key).transpose();
        privacy.helper_key = helper_key.map_err(PyValueError::new_err)?;
        let tls = match (ca, cert, key) {
            (None, None, None) => None,
            (Some(ca), cert, key) => {
                let identity = match (&cert, &key) {
                    (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
                    (None, None) => None,
                    _ => return Err(PyValueError::new_err("cert and key go together")),
                };
                let tls = ClientTls::from_files(&ca, identity, tls_domain);
                Some(tls.map_err(|e| PyOSError::new_err(e.to_string()))?)
            }
            _ => return Err(PyValueError::new_err("cert and key need ca (TLS)")),
        };
        if !(connect_timeout.is_finite() && connect_timeout >= 0.0) {
            return Err(PyValueError::new_err(
                "connect_timeout must be seconds >= 0",
            ));
        }
        let name = name.unwrap_or_else(|| "python".into());
        let remembers = policy.is_some() || max_total_epsilon.is_some();
        let state_dir = state_dir.unwrap_or_else(|| "fl-client-state".into());
        let state = remembers.then(|| state_file(&state_dir, policy.as_deref(), &name));
        Ok(Self {
            opts: ClientOptions {
                token: token.unwrap_or_default(),
                name,
                policy,
                state,
                connect_timeout: Duration::from_secs_f64(connect_timeout),
                privacy,
                credentials,
                tls,
                ..ClientOptions::new(server)
            },
        })
    }

    /// Joins the server and trains until it ends training: each round this client is sampled
    /// into, `train(weights, config)` gets the global model as a flat float32 array and returns
    /// the new weights (or `(weights, loss)`); the update, its clipping, noise or masks are the
    /// library's. `num_examples` is the update's weight under a trusted curator. Returns the
    /// client's report as a dict; raises `ServerError` when the server refuses the client.
    #[pyo3(signature = (train, num_examples, evaluate=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        train: Py<PyAny>,
        num_examples: u64,
        evaluate: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if num_examples == 0 {
            return Err(PyValueError::new_err("num_examples must be at least 1"));
        }
        if !train.bind(py).is_callable() {
            return Err(PyValueError::new_err("train must be callable"));
        }
        let trainer = PyTrainer {
            train,
            evaluate,
            examples: num_examples,
        };
        fl_client::init_logging("warn");
        let opts = self.opts.clone();
        let report = py.detach(|| run_interruptible(opts, trainer))?;
        report_dict(py, &report)
    }
}

/// The federation policy in the file `policy`, verified under the authority's public key in
/// the file `authority`.
fn federation_policy(
    policy: Option<PathBuf>,
    authority: Option<&std::path::Path>,
) -> PyResult<Option<Arc<FederationPolicy>>> {
    match (policy, authority) {
        (None, _) => Ok(None),
        (Some(_), None) => Err(PyValueError::new_err("policy needs authority")),
        (Some(policy), Some(authority)) => (SignedPolicy::read_verified(&policy, authority))
            .map(|p| Some(Arc::new(p)))
            .map_err(value_error),
    }
}

/// The client's requirements from `privacy`'s name, its limits and its total cap, checked.
fn client_privacy(
    privacy: &str,
    limits: ClientLimits,
    max_total_epsilon: Option<f64>,
) -> PyResult<ClientPrivacy> {
    let require = match privacy {
        "follow" => None,
        name => Some(name.parse::<LocalKind>().map_err(PyValueError::new_err)?),
    };
    if let Some(kind) = require.filter(|k| k.needs_built_in_trainer()) {
        return Err(PyValueError::new_err(format!(
            "{kind} needs per-example L1 clipping inside training, which only the built-in \
             trainer (the fl-client binary) does"
        )));
    }
    let privacy = ClientPrivacy {
        require,
        limits,
        max_total_epsilon,
        helper_key: None,
    };
    privacy.check().map_err(PyValueError::new_err)?;
    Ok(privacy)
}

/// Runs the client on a runtime of its own, letting Python handle signals meanwhile.
fn run_interruptible(opts: ClientOptions, trainer: PyTrainer) -> PyResult<ClientReport> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("starting the client runtime: {e}")))?;
    runtime.block_on(async move {
        let mut client = tokio::spawn(fl_client::run(opts, trainer));
        let mut poll = tokio::time::interval(SIGNAL_POLL);
        loop {
            tokio::select! {
                done = &mut client => {
                    let done = done.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                    return done.map_err(to_py);
                }
                _ = poll.tick() => {
                    if let Err(interrupt) = Python::attach(|py| py.check_signals()) {
                        client.abort();
                        return Err(interrupt);
                    }
                }
            }
        }
    })
}

/// The report as a dict.
fn report_dict<'py>(py: Python<'py>, r: &ClientReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("rounds_trained", r.rounds_trained)?;
    d.set_item("shutdown_reason", &r.shutdown_reason)?;
    d.set_item("local_releases", r.local_releases)?;
    d.set_item("local_epsilon", r.local_epsilon)?;
    d.set_item("tasks_refused", r.tasks_refused)?;
    d.set_item("last_refusal", &r.last_refusal)?;
    Ok(d)
}

/// A Rust error as Python's `ValueError`, with its message.
fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}
