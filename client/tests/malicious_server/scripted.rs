//! The scripted server and its fixtures: certified `fl-client` processes started against a tonic
//! server whose every message the test writes, and helpers to read what the clients answer.

use fl_authority::policy::{FederationPolicy, MinDegree, PolicyMode};
use fl_authority::{Authority, Identity};
use fl_proto::v1::federation_server::{Federation, FederationServer};
use fl_proto::v1::{
    ClientMessage, JoinReply, JoinRequest, LocalConfig, ModelSpec, PartitionReply,
    PartitionRequest, RoundTask, SecAggTask, ServerMessage, Shutdown, client_message,
    server_message,
};
use fl_secagg::task::Task;
use fl_secagg::{
    AdvertisedKeys, ClientRound, Credentials, GraphKind, Member, Neighbourhood, Ring, RoundTag,
    ServerStage, StageMessage, Verifier, derive_graph,
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
    /// Each process's arguments, to start it again.
    commands: Vec<Vec<std::ffi::OsString>>,
    pub(crate) server: tokio::task::JoinHandle<()>,
}

/// How the clients of a setup are started.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fleet {
    /// Each holds an identity certified by the setup's authority.
    pub(crate) signed: bool,
    /// The federation policy, which the setup's authority signs and every client loads
    /// (`--policy`, with a state folder of its own); needs `signed`.
    pub(crate) policy: Option<FederationPolicy>,
}

/// A policy for these tests, serial 1, allowing every mode: at least 4 clients and 3
/// neighbours, t >= 0.7 k, each client's noise at least z = 4 times S (a secure round then
/// costs each client epsilon 2.18), 4 per release and 10 in all, at delta 1e-5.
pub(crate) fn policy() -> FederationPolicy {
    FederationPolicy {
        federation: "hospitals".into(),
        serial: 1,
        modes: PolicyMode::all().into_iter().collect(),
        min_clients: 4,
        min_degree: MinDegree::AtLeast(3),
        min_threshold: 0.7,
        min_noise_multiplier: 4.0,
        max_release_epsilon: 4.0,
        max_total_epsilon: 10.0,
        max_delta: 1e-5,
        max_model_magnitude: 1e4,
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.server.abort();
        if std::thread::panicking() {
            // What the clients said, beside the failure.
            for i in 0..self.commands.len() {
                let log = std::fs::read_to_string(self.dir.join(format!("client-{i}.log")));
                eprintln!("client {i}'s log:\n{}", log.unwrap_or_default());
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the scripted server and `n` fl-client processes, certified (`signed`) or not, with
/// a few examples each.
pub(crate) async fn setup(test: &str, n: usize, signed: bool) -> Setup {
    setup_fleet(
        test,
        n,
        Fleet {
            signed,
            policy: None,
        },
    )
    .await
}

/// Starts the scripted server and `n` fl-client processes as `fleet` says, each with a few
/// examples of its own (process i's differ from process j's).
pub(crate) async fn setup_fleet(test: &str, n: usize, fleet: Fleet) -> Setup {
    let dir = std::env::temp_dir().join(format!("fl-malicious-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let authority = Authority::generate().unwrap();
    let authority_pub = dir.join("authority.pub");
    write_hex(&authority_pub, &authority.public().to_bytes());
    let policy_file = fleet.policy.map(|p| {
        let file = dir.join("policy.toml");
        std::fs::write(&file, authority.sign_policy(p).unwrap().to_toml()).unwrap();
        file
    });

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
    let mut commands = Vec::new();
    for i in 0..n {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fl-client"));
        command.args(["--server", &endpoint, "--connect-timeout", "30"]);
        command
            .arg("--data")
            .arg(format!("csv:{}", data_of(&dir, i).display()));
        command
            .arg("--state-dir")
            .arg(dir.join(format!("state-{i}")));
        if let Some(file) = &policy_file {
            command.arg("--policy").arg(file);
        }
        if fleet.signed {
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
        commands.push(command.get_args().map(|a| a.to_owned()).collect::<Vec<_>>());
    }
    let processes = (commands.iter().enumerate())
        .map(|(i, args)| spawn(&dir, i, args))
        .collect();
    Setup {
        dir,
        authority,
        sessions,
        processes,
        commands,
        server,
    }
}

/// Process `i`'s examples: 30 rows, its own.
fn data_of(dir: &Path, i: usize) -> PathBuf {
    let mut rows = String::new();
    for r in 0..30 {
        let features: Vec<String> = (0..FEATURES)
            .map(|j| format!("{}", (r * 7 + j + 3 * i) % 5))
            .collect();
        rows.push_str(&format!("{},{}\n", (r + i) % CLASSES, features.join(",")));
    }
    let data = dir.join(format!("data-{i}.csv"));
    std::fs::write(&data, rows).unwrap();
    data
}

/// Starts fl-client with `args`, its log in the setup's folder.
fn spawn(dir: &Path, i: usize, args: &[std::ffi::OsString]) -> Child {
    let log = (std::fs::OpenOptions::new().create(true).append(true))
        .open(dir.join(format!("client-{i}.log")))
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_fl-client"));
    command.args(args).stdout(Stdio::null()).stderr(log);
    command.spawn().unwrap()
}

pub(crate) fn write_hex(path: &Path, bytes: &[u8]) {
    std::fs::write(path, format!("{}\n", hex::encode(bytes))).unwrap();
}

impl Setup {
    /// Kills process `i` and starts it again as it was first started (same state folder).
    pub(crate) fn restart(&mut self, i: usize) {
        let p = &mut self.processes[i];
        let _ = p.kill();
        let _ = p.wait();
        *p = spawn(&self.dir, i, &self.commands[i]);
    }

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
    task_in(signed, "", 1)
}

/// Round 1's task (as [`task`]) in `federation`, of the server's `run`.
pub(crate) fn task_in(signed: bool, federation: &str, run: u64) -> RoundTask {
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
            federation: federation.into(),
            run,
            min_survivors: 0,
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
    for chunk in fl_proto::encode_chunks(task.round, model) {
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
            let mut words = fl_proto::TensorAssembler::new(h.round, h.num_words, h.num_chunks)
                .expect("a masked-input header");
            let mut received = None;
            for _ in 0..h.num_chunks {
                match next(peer).await.expect("a chunk") {
                    Body::UpdateChunk(c) => received = words.push_words(c).unwrap(),
                    other => panic!("a chunk expected, got {other:?}"),
                }
            }
            let y = fl_proto::ring_elements(ring(), &received.expect("every chunk")).unwrap();
            Answer::Stage(StageMessage::Masked(y))
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
        .map(|a| Member::of(a, a.signed.as_ref().map(|s| s.certificate.name.clone())))
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

/// Waits (up to [`PATIENCE`]) for `process` to exit by itself.
pub(crate) async fn wait_for_exit(process: &mut Child) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(status) = process.try_wait().unwrap() {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the process did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ends every session and waits for the processes.
pub(crate) async fn shut_down(setup: &mut Setup, peers: &BTreeMap<u64, Peer>) {
    for peer in peers.values() {
        let shutdown = Shutdown {
            round: 1,
            reason: "the script is over".into(),
            ..Shutdown::default()
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
