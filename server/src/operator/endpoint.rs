//! The operator's HTTP endpoints, the Prometheus metrics and the live run page: each is an axum
//! router served on its own address until the run ends, behind the operator's token when one is
//! set (`server.operator_token`), with a warning when it is reachable beyond this host.
//!
//! The token is taken as the password of HTTP Basic authentication (what a browser asks for, and
//! sends again with the page's own requests) or as `Authorization: Bearer TOKEN` (what Prometheus
//! and scripts send). Like the clients' token, it is compared by its SHA-256 digest in constant
//! time, and never kept in clear.

use crate::error::ServerError;
use crate::identity::credentials::Digest;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use std::future::Future;
use tokio::net::TcpListener;

/// What the realm of a refused request says to the browser.
const REALM: &str = "Basic realm=\"fl operator\", charset=\"UTF-8\"";

/// Serves `app` at `addr` until `done`, requiring `token` when set; `what` names the endpoint in
/// the log. Returns once the address is bound.
pub(crate) async fn spawn_endpoint(
    what: &'static str,
    addr: &str,
    app: axum::Router,
    token: Option<Digest>,
    done: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let bind = |source| ServerError::Bind {
        what,
        addr: addr.to_owned(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind)?;
    let bound = listener.local_addr()?;
    tracing::info!(%what, url = %format!("http://{bound}/"), "operator endpoint");
    if !bound.ip().is_loopback() {
        tracing::warn!(
            %what,
            address = %bound,
            authenticated = token.is_some(),
            "the endpoint is reachable beyond this host: its figures (clients connected, \
             dropped, updates) are curator-side figures the privacy guarantee does not cover"
        );
    }
    let app = app.layer(axum::middleware::from_fn_with_state(token, authenticate));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(done)
            .await
        {
            tracing::warn!(%what, error = %e, "operator endpoint failed");
        }
    });
    Ok(())
}

/// Passes a request on when no token is set or it presents the token; otherwise 401, with the
/// challenge that makes a browser ask for it.
async fn authenticate(
    State(token): State<Option<Digest>>,
    request: Request,
    next: Next,
) -> Response {
    let admitted = token.is_none_or(|expected| {
        presented(request.headers()).is_some_and(|given| Digest::of(&given).matches(&expected))
    });
    if admitted {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, REALM)],
        "the operator token is required\n",
    )
        .into_response()
}

/// The token a request presents: a Bearer token, or the password of Basic credentials.
fn presented(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    let credentials = credentials.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(credentials.as_bytes().to_vec());
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    // RFC 7617: base64 of "user-id:password"; the user name is not checked.
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials)
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, authorization.parse().unwrap());
        h
    }

    #[test]
    fn bearer_and_basic_credentials_present_the_token() {
        assert_eq!(presented(&headers("Bearer s3cret")).unwrap(), b"s3cret");
        // base64("ops:s3:cret"): the password is everything after the first colon.
        assert_eq!(
            presented(&headers("Basic b3BzOnMzOmNyZXQ=")).unwrap(),
            b"s3:cret"
        );
        assert!(presented(&headers("Basic not-base64!")).is_none());
        assert!(presented(&headers("Digest s3cret")).is_none());
        assert!(presented(&HeaderMap::new()).is_none());
    }
}
