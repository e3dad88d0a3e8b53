//! TLS with client certificates: clients with a certificate from the federation's CA train; a
//! client with a certificate from another CA, one with no certificate, and one speaking plain
//! HTTP/2 are refused before they can join, sample themselves into a round or read the model.
//! A client that was not sampled cannot submit for the round. With certificates enrolled by
//! fingerprint, a certificate of the federation's CA that is not enrolled, or is revoked, is
//! refused too.

use crate::support;

use fl_client::{ClientError, ClientOptions, ClientTls, LocalData, run_client};
use fl_server::credentials::{Digest, EnrollmentList};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// A CA: its PEM certificate and an issuer for leaf certificates.
fn ca() -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

/// A leaf certificate for `names`, signed by `issuer`: (certificate PEM, key PEM).
fn leaf(names: &[&str], issuer: &Issuer<'static, KeyPair>) -> (Vec<u8>, Vec<u8>) {
    fingerprinted_leaf(names, issuer).0
}

/// [`leaf`] and the certificate's fingerprint.
fn fingerprinted_leaf(
    names: &[&str],
    issuer: &Issuer<'static, KeyPair>,
) -> ((Vec<u8>, Vec<u8>), Digest) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, issuer)
        .unwrap();
    let fingerprint = Digest::of(cert.der());
    let pems = (cert.pem().into_bytes(), key.serialize_pem().into_bytes());
    (pems, fingerprint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_the_federations_certificate_get_in() {
    let dir = std::env::temp_dir().join(format!("fl-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_pem, issuer) = ca();
    let (other_ca_pem, other_issuer) = ca();
    let (server_cert, server_key) = leaf(&["localhost"], &issuer);
    for (name, bytes) in [
        ("ca.pem", ca_pem.as_bytes()),
        ("server.pem", &server_cert),
        ("server.key", &server_key),
    ] {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let mut config = support::evil_config(&dir.join("run"));
    config.server.tls_cert = Some(dir.join("server.pem"));
    config.server.tls_key = Some(dir.join("server.key"));
    config.server.tls_client_ca = Some(dir.join("ca.pem"));
    let data = Arc::new(support::blobs(300));
    let support::TestServer {
        port,
        handle: server,
        stop: _stop_tx,
        ..
    } = support::start_server(config, data.clone(), None, None).await;

    let https = format!("https://127.0.0.1:{port}");
    let tls = |ca: &str, identity| ClientTls {
        ca: ca.as_bytes().to_vec(),
        identity,
        domain: Some("localhost".into()),
    };
    // Refused: a certificate from another CA, no certificate, plain HTTP/2.
    let intruder = |endpoint: &str, tls: Option<ClientTls>| {
        let opts = ClientOptions {
            name: "intruder".into(),
            connect_timeout: Duration::from_secs(2),
            tls,
            ..ClientOptions::new(endpoint)
        };
        let local = LocalData {
            data: data.clone(),
            indices: (0..100).collect(),
        };
        tokio::spawn(run_client(opts, local))
    };
    let intruders = [
        intruder(
            &https,
            Some(tls(&ca_pem, Some(leaf(&["c"], &other_issuer)))),
        ),
        intruder(&https, Some(tls(&ca_pem, None))),
        intruder(&format!("http://127.0.0.1:{port}"), None),
    ];
    let mut said = Vec::new();
    for (i, handle) in intruders.into_iter().enumerate() {
        let refused = handle.await.unwrap();
        assert!(refused.is_err(), "intruder {i} got in: {refused:?}");
        said.push(refused.unwrap_err().to_string());
    }
    // Plain HTTP/2 to a TLS server is said as its fix, on one line.
    assert!(
        said[2].contains("https://") && said[2].contains("--ca"),
        "{}",
        said[2]
    );
    // So are an https:// address without a CA certificate and an address without a scheme,
    // both at once: neither can succeed on a retry (the client would wait 600 s).
    for (endpoint, fix) in [
        (https.clone(), "--ca"),
        (format!("127.0.0.1:{port}"), "http://127.0.0.1"),
    ] {
        let opts = ClientOptions {
            connect_timeout: Duration::from_secs(600),
            ..ClientOptions::new(&endpoint)
        };
        let local = LocalData {
            data: data.clone(),
            indices: (0..100).collect(),
        };
        let at_once = tokio::time::timeout(Duration::from_secs(60), run_client(opts, local));
        let error = at_once.await.expect("retried").unwrap_err().to_string();
        assert!(error.contains(fix) && !error.contains('\n'), "{error}");
    }
    for line in &said {
        assert!(!line.contains('\n'), "{line}");
    }
    // Nothing listening: retried until the timeout (the server may be starting), then said so.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        ..ClientOptions::new(&nobody)
    };
    let local = LocalData {
        data: data.clone(),
        indices: (0..100).collect(),
    };
    let error = run_client(opts, local).await.unwrap_err().to_string();
    assert!(error.contains("start the server"), "{error}");
    // The other CA's certificate does not let a client check the server either.
    let wrong_ca = intruder(
        &https,
        Some(tls(&other_ca_pem, Some(leaf(&["c"], &issuer)))),
    );
    assert!(wrong_ca.await.unwrap().is_err());

    // Admitted: three clients with certificates from the federation's CA.
    let honest = (0..3)
        .map(|_| Some(tls(&ca_pem, Some(leaf(&["client"], &issuer)))))
        .flat_map(|t| support::spawn_clients_with(&https, &data, 1, None, t))
        .collect::<Vec<_>>();
    let summary = support::finished(server).await;
    for h in honest {
        h.await
            .unwrap()
            .expect("clients with the CA's certificate train");
    }
    assert_eq!(summary.rounds_completed, 2);
    assert_eq!(summary.client_updates, 6, "no intruder took part");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolled_certificates_get_in_and_revoked_or_unknown_ones_do_not() {
    let dir = std::env::temp_dir().join(format!("fl-tls-enrolled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_pem, issuer) = ca();
    let (server_cert, server_key) = leaf(&["localhost"], &issuer);
    std::fs::write(dir.join("ca.pem"), &ca_pem).unwrap();
    std::fs::write(dir.join("server.pem"), server_cert).unwrap();
    std::fs::write(dir.join("server.key"), server_key).unwrap();
    let certs: Vec<_> = (0..4)
        .map(|_| fingerprinted_leaf(&["c"], &issuer))
        .collect();
    // Clients 0 and 1 are enrolled, 2 is revoked, 3 holds a valid certificate of the CA that
    // nobody enrolled.
    let mut list = EnrollmentList::default();
    for (i, (_, fingerprint)) in certs.iter().take(3).enumerate() {
        list.enroll(&format!("site-{i}"), None, Some(*fingerprint))
            .unwrap();
    }
    list.revoke("site-2").unwrap();
    std::fs::write(dir.join("clients.toml"), list.to_toml()).unwrap();
    let mut config = support::evil_config(&dir.join("run"));
    config.server.clients = 2;
    config.server.clients_per_round = 2.0.into();
    config.server.tls_cert = Some(dir.join("server.pem"));
    config.server.tls_key = Some(dir.join("server.key"));
    config.server.tls_client_ca = Some(dir.join("ca.pem"));
    config.server.enrollment = Some(dir.join("clients.toml"));
    let data = Arc::new(support::blobs(300));
    let server = support::start_server(config, data.clone(), None, None).await;
    let https = format!("https://127.0.0.1:{}", server.port);
    let mut clients = certs.into_iter().map(|(identity, _)| {
        let tls = ClientTls {
            ca: ca_pem.as_bytes().to_vec(),
            identity: Some(identity),
            domain: Some("localhost".into()),
        };
        support::spawn_clients_with(&https, &data, 1, None, Some(tls)).remove(0)
    });
    let admitted: Vec<_> = clients.by_ref().take(2).collect();
    let code = |result: Result<_, ClientError>| match result {
        Err(ClientError::Status(s)) => s.code(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        code(clients.next().unwrap().await.unwrap()),
        Code::PermissionDenied
    );
    assert_eq!(
        code(clients.next().unwrap().await.unwrap()),
        Code::Unauthenticated
    );
    let summary = support::finished(server.handle).await;
    for h in admitted {
        h.await.unwrap().expect("enrolled certificates train");
    }
    assert_eq!(
        summary.client_updates, 4,
        "only the two enrolled clients took part"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One client per round of three: when one hand-driven client is sampled, the other (surely not
/// sampled) uploads for that round and is refused; the sampled one answers and the round
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_not_sampled_cannot_submit() {
    let out = std::env::temp_dir().join(format!("fl-unsampled-{}", std::process::id()));
    let mut config = support::evil_config(&out);
    config.server.clients_per_round = 1.0.into();
    config.server.rounds = 6;
    let data = Arc::new(support::blobs(300));
    let support::TestServer {
        endpoint,
        handle: server,
        stop: _stop_tx,
        ..
    } = support::start_server(config, data.clone(), None, None).await;
    let honest = support::spawn_clients(&endpoint, &data, 1, None);
    let mut sessions = [
        support::raw_session(&endpoint, "a").await,
        support::raw_session(&endpoint, "b").await,
    ];
    let upload = |round: u64, n: usize| {
        support::dense_upload(round, &vec![0.0; n], None)
            .into_iter()
            .map(|body| fl_proto::v1::ClientMessage { body: Some(body) })
    };
    let refusal = loop {
        let [a, b] = &mut sessions;
        let (sampled, task) = tokio::select! {
            m = a.2.message() => (0, m),
            m = b.2.message() => (1, m),
        };
        let Ok(Some(fl_proto::v1::ServerMessage {
            body: Some(fl_proto::v1::server_message::Body::Task(task)),
        })) = task
        else {
            continue;
        };
        let other = 1 - sampled;
        for m in upload(task.round, task.num_values as usize) {
            // The server refuses at the header and may close the stream before the rest.
            if sessions[other].1.send(m).await.is_err() {
                break;
            }
        }
        let status = loop {
            match sessions[other].2.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("stream ended without a status"),
                Err(status) => break status,
            }
        };
        for m in upload(task.round, task.num_values as usize) {
            sessions[sampled].1.send(m).await.unwrap();
        }
        break status;
    };
    assert_eq!(refusal.code(), Code::FailedPrecondition, "{refusal:?}");
    assert!(refusal.message().contains("was not sampled"), "{refusal:?}");
    drop(sessions);
    let _ = tokio::time::timeout(Duration::from_secs(60), server).await;
    for h in honest {
        let _ = h.await;
    }
    let _ = std::fs::remove_dir_all(&out);
}
