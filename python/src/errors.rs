//! The client library's errors as Python exceptions: a refusal or failure of the server is a
//! `ServerError` carrying the gRPC status (`code`, `message`); anything else a `ClientError`.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

create_exception!(
    _core,
    ClientError,
    PyRuntimeError,
    "The client stopped: it could not reach the server, the server broke the protocol, or the \
     server went away."
);
create_exception!(
    _core,
    ServerError,
    ClientError,
    "The server answered with an error status (a refused token, a refused update): `code` is \
     the gRPC status code's name, `message` the server's reason."
);

/// `e` as the Python exception that says what happened.
pub(crate) fn to_py(e: fl_client::ClientError) -> PyErr {
    match &e {
        fl_client::ClientError::Status(status) => {
            let err = ServerError::new_err(e.to_string());
            Python::attach(|py| {
                let value = err.value(py);
                let code = format!("{:?}", status.code());
                value
                    .setattr("code", code)
                    .and_then(|()| value.setattr("message", status.message()))
                    .map_or_else(|set| set, |()| err.clone_ref(py))
            })
        }
        _ => ClientError::new_err(e.to_string()),
    }
}
