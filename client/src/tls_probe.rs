//! Whether a server answers TLS: the check behind the advice to write `https://` when a client
//! speaks plain HTTP/2 to a TLS server.
//!
//! HTTP/2 sent to a TLS server fails in several ways, by timing: an HTTP/2 frame-size error
//! (the server's TLS alert read as a frame), a cancelled request, or a reset connection. None of
//! them names the cause, so a failed plain connection is followed by one TLS handshake with no
//! trusted roots: a TLS server answers it with its certificate, which that handshake refuses as
//! unknown, while a plain HTTP/2 server answers with something that is not TLS at all.

use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long the probe waits for the server's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// True when the server at `url` (an `http://` address) completes the first half of a TLS
/// handshake: it sent a certificate, which this probe cannot and does not trust. False when it
/// does not answer, answers something other than TLS, or `url` names no host and port.
pub(crate) async fn speaks_tls(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::codegen::http::Uri>() else {
        return false;
    };
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let Ok(name) = ServerName::try_from(host.clone()) else {
        return false;
    };
    let handshake = async {
        let tcp = TcpStream::connect((host.as_str(), port)).await.ok()?;
        Some(connector().connect(name, tcp).await)
    };
    match tokio::time::timeout(PROBE_TIMEOUT, handshake).await {
        Ok(Some(Err(e))) => presented_a_certificate(&e),
        _ => false,
    }
}

/// A TLS client that trusts no certificate: every handshake it makes fails, at the latest when
/// the server presents its certificate.
fn connector() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// True when the handshake failed on the server's certificate (or on a TLS alert the server
/// sent), that is, after the server had spoken TLS.
fn presented_a_certificate(e: &std::io::Error) -> bool {
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return false;
    };
    matches!(
        tls,
        rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plain_listener_or_no_listener_is_not_tls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // A server that answers every connection with bytes that are not TLS.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket.write_all(b"\0\0\x08\x07\0\0\0\0\0").await;
            }
        });
        assert!(!speaks_tls(&format!("http://127.0.0.1:{port}")).await);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nobody = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        assert!(!speaks_tls(&nobody).await);
        assert!(!speaks_tls("http://").await);
    }
}
