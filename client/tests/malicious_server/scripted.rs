//! The scripted server and its fixtures: certified `fl-client` processes started against a tonic
//! server whose every message the test writes, and helpers to read what the clients answer.

use fl_common::authority::{Authority, Identity};
use fl_common::secagg::{
    AdvertisedKeys, ClientRound, Credentials, GraphKind, Member, Neighbourhood, Ring, RoundTag,
    ServerStage, StageMessage, Verifier, derive_graph,
};
use fl_common::task::Task;
use fl_proto::v1::federation_server::{Federation, FederationServer};
use fl_proto::v1::{
    ClientMessage, JoinReply, JoinRequest, LocalConfig, ModelSpec, PartitionReply,
    PartitionRequest, RoundTask, SecAggTask, ServerMessage, Shutdown, client_message,
    server_message,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

pub(crate) const FEATURES: usize = 4;
pub(crate) const CLASSES: usize = 3;
pub(crate) const PARAMS: usize = FEATURES * CLASSES + CLASSES;
/// How long the script waits for any one message.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// One client's session as the scripted server holds it.
pub(crate) struct Peer {
    pub(crate) id: u64,
    pub(crate) tx: mpsc::Sender<Result<ServerMessage, Status>>,
    pub(crate) inbound: Streaming<ClientMessage>,
}

/// The scripted server's gRPC face: it admits anyone and hands each session to the script.
pub(crate) struct Scripted {
    pub(crate) next_id: AtomicU64,
    pub(crate) sessions: mpsc::Sender<Peer>,
}

#[tonic::async_trait]
impl Federation for Scripted {
    async fn join(&self, _: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        Ok(Response::new(JoinReply {
            client_id: self.next_id.fetch_add(1, Ordering::SeqCst).to_string(),
            session_key: vec![7; 32],
        }))
    }

    async fn session(
        &self,
        request: Request<Streaming<ClientMessage>>,
    ) -> Result<Response<BoxStream<ServerMessage>>, Status> {
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(ClientMessage {
                body: Some(client_message::Body::Hello(h)),
            }) => h,
            _ => return Err(Status::invalid_argument("Hello first")),
        };
        let (tx, rx) = mpsc::channel(256);
        let id = hello.client_id.parse().unwrap();
        let _ = self.sessions.send(Peer { id, tx, inbound }).await;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn assign_partition(
        &self,
        _: Request<PartitionRequest>,
    ) -> Result<Response<PartitionReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// A federation authority, its files and the fl-client processes it certified.
pub(crate) struct Setup {
    pub(crate) dir: PathBuf,
    pub(crate) authority: Authority,
    pub(crate) sessions: mpsc::Receiver<Peer>,
    pub(crate) processes: Vec<Child>,
    pub(crate) server: tokio::task::JoinHandle<()>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.server.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the scripted server and `n` fl-client processes, certified (`signed`) or not, with
/// a few examples each.
pub(crate) async fn setup(test: &str, n: usize, signed: bool) -> Setup {
    let dir = std::env::temp_dir().join(format!("fl-malicious-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let authority = Authority::generate().unwrap();
    let authority_pub = dir.join("authority.pub");
    write_hex(&authority_pub, &authority.public().to_bytes());
    let mut rows = String::new();
    for i in 0..30 {
        let features: Vec<String> = (0..FEATURES)
            .map(|j| format!("{}", (i * 7 + j) % 5))
            .collect();
        rows.push_str(&format!("{},{}\n", i % CLASSES, features.join(",")));
    }
    let data = dir.join("data.csv");
    std::fs::write(&data, rows).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (sessions_tx, sessions) = mpsc::channel(64);
    let scripted = Scripted {
        next_id: AtomicU64::new(1),
        sessions: sessions_tx,
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(FederationServer::new(scripted))
            .serve_with_incoming(incoming)
            .await;
    });
    let mut processes = Vec::new();
    for i in 0..n {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fl-client"));
        command.args(["--server", &endpoint, "--connect-timeout", "30"]);
        command.arg("--data").arg(format!("csv:{}", data.display()));
        if signed {
            let name = format!("hospital-{i}");
            let identity = Identity::generate().unwrap();
            let key = dir.join(format!("{name}.key"));
            write_hex(&key, &identity.secret());
            let cert = dir.join(format!("{name}.cert"));
            let certificate = authority.certify(&name, &identity.public()).unwrap();
            std::fs::write(&cert, certificate.to_toml()).unwrap();
            command.arg("--authority").arg(&authority_pub);
            command
                .arg("--identity")
                .arg(&key)
                .arg("--certificate")
                .arg(&cert);
        }
        let log = std::fs::File::create(dir.join(format!("client-{i}.log"))).unwrap();
        command.stdout(Stdio::null()).stderr(log);
        processes.push(command.spawn().unwrap());
    }
    Setup {
        dir,
        authority,
        sessions,
        processes,
        server,
    }
}

pub(crate) fn write_hex(path: &Path, bytes: &[u8]) {
    std::fs::write(path, format!("{}\n", hex::encode(bytes))).unwrap();
}

impl Setup {
    /// The sessions of all `n` clients, by id.
    pub(crate) async fn peers(&mut self, n: usize) -> BTreeMap<u64, Peer> {
        let mut peers = BTreeMap::new();
        while peers.len() < n {
            let peer = tokio::time::timeout(PATIENCE, self.sessions.recv())
                .await
                .expect("every client connects")
                .unwrap();
            peers.insert(peer.id, peer);
        }
        peers
    }

    /// A client the server runs itself, certified by the authority as `name` (a compromised
    /// client), as two identical twins (same seed, same keys).
    pub(crate) fn sybil(
        &self,
        name: &str,
        tag: RoundTag,
        id: u64,
        signed: bool,
    ) -> [ClientRound; 2] {
        let credentials = signed.then(|| {
            let identity = Identity::generate().unwrap();
            let certificate = self.authority.certify(name, &identity.public()).unwrap();
            let verifier = Verifier::new(self.authority.public(), None).unwrap();
            Arc::new(Credentials::new(identity, certificate, verifier).unwrap())
        });
        let twin = || {
            let mut rng = StdRng::seed_from_u64(id);
            ClientRound::new((tag, id), ring(), credentials.clone(), &mut rng)
        };
        [twin(), twin()]
    }
}

pub(crate) fn ring() -> Ring {
    Ring::new(32).unwrap()
}

/// Round 1's task: logistic regression, one epoch, a secure round (`signed` or not).
pub(crate) fn task(signed: bool) -> RoundTask {
    RoundTask {
        round: 1,
        model: Some(ModelSpec {
            layer_sizes: vec![FEATURES as u32, CLASSES as u32],
            ..Default::default()
        }),
        config: Some(LocalConfig {
            epochs: 1,
            batch_size: 10,
            learning_rate: 0.1,
            random_shift: 0,
        }),
        num_values: PARAMS as u64,
        num_chunks: fl_proto::chunk_count(PARAMS),
        secagg: Some(SecAggTask {
            ring_bits: 32,
            clip_bound: 1.0,
            scale: 1000.0,
            noise_variance: 0,
            signed,
        }),
        ..Default::default()
    }
}

/// The round's key for a client sent `model`.
pub(crate) fn tag_of(task: &RoundTask, model: &[f32]) -> RoundTag {
    let digest = Task::try_from(task).unwrap().secure_digest(model).unwrap();
    RoundTag { round: 1, digest }
}

pub(crate) async fn send(peer: &Peer, body: server_message::Body) {
    let _ = peer.tx.send(Ok(ServerMessage { body: Some(body) })).await;
}

pub(crate) async fn send_stage(peer: &Peer, stage: &ServerStage) {
    send(peer, fl_proto::server_stage_body(1, stage)).await;
}

/// Sends `peer` the task and `model`.
pub(crate) async fn send_task(peer: &Peer, task: &RoundTask, model: &[f32]) {
    send(peer, server_message::Body::Task(task.clone())).await;
    for chunk in fl_proto::encode_chunks(1, model) {
        send(peer, server_message::Body::ModelChunk(chunk)).await;
    }
}

/// The next message `peer` sends (its stream ending is `None`).
pub(crate) async fn next(peer: &mut Peer) -> Option<client_message::Body> {
    let message = tokio::time::timeout(PATIENCE, peer.inbound.message())
        .await
        .expect("the client answers");
    message.ok().flatten().and_then(|m| m.body)
}

/// What a client answered to a stage: its stage message, or the reason it failed the round.
#[derive(Debug)]
pub(crate) enum Answer {
    Stage(StageMessage),
    Failed(String),
}

/// The next stage answer of `peer` (a masked input is read to its last chunk).
pub(crate) async fn answer(peer: &mut Peer) -> Answer {
    use client_message::Body;
    let id = peer.id;
    match next(peer).await.expect("an answer") {
        Body::TaskFailed(f) => Answer::Failed(f.reason),
        Body::SecaggKeys(k) => Answer::Stage(StageMessage::Keys(
            fl_proto::advertised_keys(id, &k).unwrap(),
        )),
        Body::SecaggShares(s) => Answer::Stage(StageMessage::Shares(
            (s.shares.iter()).map(|s| s.try_into().unwrap()).collect(),
        )),
        Body::SecaggCheck(c) => Answer::Stage(StageMessage::Check(c.refused)),
        Body::SecaggEndorse(e) => {
            Answer::Stage(StageMessage::Endorse(fl_proto::endorsement(&e).unwrap()))
        }
        Body::SecaggReveal(r) => Answer::Stage(StageMessage::Reveal(
            (r.shares.iter()).map(|s| s.try_into().unwrap()).collect(),
        )),
        Body::MaskedInputHeader(h) => {
            for _ in 0..h.num_chunks {
                next(peer).await.expect("a chunk");
            }
            Answer::Stage(StageMessage::Masked(Vec::new()))
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// Every peer's public keys after the task (and `model`, or `models` per peer).
pub(crate) async fn keys_of(
    peers: &mut BTreeMap<u64, Peer>,
    task: &RoundTask,
    model_of: impl Fn(u64) -> Vec<f32>,
) -> Vec<AdvertisedKeys> {
    for (&u, peer) in peers.iter() {
        send_task(peer, task, &model_of(u)).await;
    }
    let mut keys = Vec::new();
    for peer in peers.values_mut() {
        match answer(peer).await {
            Answer::Stage(StageMessage::Keys(k)) => keys.push(k),
            other => panic!("keys expected, got {other:?}"),
        }
    }
    keys
}

/// The neighbourhoods an honest server would send: U1 (with the certified names), the graph
/// derived from it, threshold t.
pub(crate) fn honest_hoods(
    tag: &RoundTag,
    adverts: &[AdvertisedKeys],
    kind: GraphKind,
    t: usize,
) -> BTreeMap<u64, Neighbourhood> {
    let mut members: Vec<Member> = (adverts.iter())
        .map(|a| Member {
            id: a.client,
            name: a.signed.as_ref().map(|s| s.certificate.name.clone()),
        })
        .collect();
    members.sort_by_key(|m| m.id);
    let keys: BTreeMap<u64, &AdvertisedKeys> = adverts.iter().map(|a| (a.client, a)).collect();
    (derive_graph(tag, kind, &members).into_iter())
        .map(|(u, ns)| {
            let neighbours = ns.iter().map(|v| keys[v].clone()).collect();
            let hood = Neighbourhood {
                threshold: t,
                members: members.clone(),
                neighbours,
            };
            (u, hood)
        })
        .collect()
}

/// Ends every session and waits for the processes.
pub(crate) async fn shut_down(setup: &mut Setup, peers: &BTreeMap<u64, Peer>) {
    for peer in peers.values() {
        let shutdown = Shutdown {
            round: 1,
            reason: "the script is over".into(),
        };
        send(peer, server_message::Body::Shutdown(shutdown)).await;
    }
    for p in &mut setup.processes {
        for _ in 0..100 {
            if p.try_wait().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
