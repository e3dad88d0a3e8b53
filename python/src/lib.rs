//! `fl_client._core`: the Python package's Rust core. A `client::Client` runs the same client
//! library as the `fl-client` binary ([`fl_client::run`]): the protocol, TLS and enrollment,
//! reconnection, clipping, local DP, SignDS and the secure-aggregation masks. Python brings only
//! its training code, wrapped as a [`fl_client::Trainer`] (`trainer::PyTrainer`); this crate
//! has no protocol or privacy logic of its own.

mod client;
mod errors;
mod trainer;

use pyo3::prelude::*;

/// The module: `Client`, its exceptions, and the version.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<client::Client>()?;
    m.add("ClientError", py.get_type::<errors::ClientError>())?;
    m.add("ServerError", py.get_type::<errors::ServerError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
