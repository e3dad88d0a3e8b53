//! An aggregator's stream to its coordinator (the aggregator tier): opened with AggregatorHello
//! and answered with Welcome; what the coordinator sends becomes [`Order`]s in the domain crates'
//! and [`crate::round`] types, and the group's population and partial aggregates go back.

use crate::error::ServerError;
use crate::identity::ids::{ClientId, GroupId};
use crate::round::events::GroupReport;
use crate::round::strategy::{GroupRule, SecureRule};
use fl_proto::v1::tier_client::TierClient;
use fl_proto::v1::{
    AggregatorHello, AggregatorMessage, CoordinatorMessage, GroupResult, GroupTask, Population,
    SecureGroup, ShutdownKind, TensorChunk, aggregator_message, coordinator_message,
};
use fl_proto::{MAX_MESSAGE_BYTES, TensorAssembler, chunk_count, encode_chunks};
use fl_secagg::task::Task;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// Messages queued towards the coordinator before the sender waits.
const OUTGOING: usize = 16;

/// Where an aggregator's coordinator is and how the aggregator introduces itself.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// The coordinator's address, `http://` or `https://`.
    pub url: String,
    /// The aggregator's name, the same across its restarts.
    pub name: String,
    /// The coordinator's token for aggregators.
    pub token: String,
    /// PEM CA certificate that signed the coordinator's (an `https://` address).
    pub ca: Option<Vec<u8>>,
}

impl UpstreamOptions {
    /// The options of an aggregator reaching `url` with `token`, named `name` (default:
    /// $HOSTNAME, the container's or the pod's name), trusting the CA in `ca` if given.
    pub fn read(
        url: String,
        (name, token): (Option<String>, String),
        ca: Option<&std::path::Path>,
    ) -> Result<Self, crate::error::ServerError> {
        let ca = ca.map(std::fs::read).transpose()?;
        let name = (name.or_else(|| std::env::var("HOSTNAME").ok()))
            .unwrap_or_else(|| "aggregator".into());
        Ok(Self {
            url,
            name,
            token,
            ca,
        })
    }
}

/// What the coordinator asks of the aggregator.
#[derive(Debug)]
pub(crate) enum Order {
    /// Run the group's part of a round.
    Round(Box<GroupOrder>),
    /// Training is over: tell the clients and stop.
    Finished,
}

/// The group's part of a round.
#[derive(Debug)]
pub(crate) struct GroupOrder {
    /// The round's task, as the clients get it.
    pub task: Task,
    /// w_t.
    pub model: Vec<f32>,
    /// The group's sampled clients, by the aggregator's ids.
    pub clients: BTreeSet<ClientId>,
    /// How their updates are summed.
    pub rule: GroupRule,
    /// How long the aggregator waits for their results.
    pub timeout: Duration,
}

/// An aggregator's open stream: the coordinator's orders as they are read, and the way back.
pub(crate) struct Upstream {
    /// The group the coordinator gave the aggregator.
    pub group: GroupId,
    /// The model's length: the only update size the group's clients may send.
    pub num_params: usize,
    /// The coordinator's orders, read by a task of their own (so that waiting for one can be
    /// given up without losing half of one); an error or the end of the stream comes last.
    pub orders: mpsc::Receiver<Result<Order, ServerError>>,
    /// Towards the coordinator.
    pub reports: Reports,
}

/// The aggregator's end of the stream towards its coordinator.
#[derive(Debug, Clone)]
pub(crate) struct Reports {
    url: String,
    outgoing: mpsc::Sender<AggregatorMessage>,
}

/// Reads the coordinator's messages into orders.
struct OrderReader {
    url: String,
    incoming: Streaming<CoordinatorMessage>,
    num_params: usize,
}

impl Upstream {
    /// Opens the stream and reads the coordinator's Welcome.
    pub(crate) async fn open(options: &UpstreamOptions) -> Result<Self, ServerError> {
        let url = options.url.clone();
        let fail = |reason: String| ServerError::Upstream {
            url: url.clone(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| fail(e.to_string()))?
            .http2_keep_alive_interval(fl_proto::KEEPALIVE_INTERVAL)
            .keep_alive_while_idle(true);
        if let Some(ca) = &options.ca {
            let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
            endpoint = endpoint.tls_config(tls).map_err(|e| fail(e.to_string()))?;
        }
        let channel = endpoint.connect().await.map_err(|e| fail(e.to_string()))?;
        let mut client = TierClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (outgoing, queue) = mpsc::channel(OUTGOING);
        let hello = AggregatorHello {
            name: options.name.clone(),
            token: options.token.clone(),
        };
        let _ = outgoing
            .send(body(aggregator_message::Body::Hello(hello)))
            .await;
        let response = (client.aggregate(ReceiverStream::new(queue)).await)
            .map_err(|s| fail(s.message().to_owned()))?;
        let mut incoming = response.into_inner();
        let first = incoming
            .message()
            .await
            .map_err(|s| fail(s.message().to_owned()))?;
        let Some(coordinator_message::Body::Welcome(welcome)) = first.and_then(|m| m.body) else {
            return Err(fail("the stream did not open with Welcome".into()));
        };
        let num_params = usize::try_from(welcome.num_values).map_err(|e| fail(e.to_string()))?;
        let reader = OrderReader {
            url: url.clone(),
            incoming,
            num_params,
        };
        let (orders_tx, orders) = mpsc::channel(1);
        tokio::spawn(reader.forward(orders_tx));
        Ok(Self {
            group: welcome.group,
            num_params,
            orders,
            reports: Reports { url, outgoing },
        })
    }
}

impl OrderReader {
    /// Reads orders into `orders` until the stream ends, fails, or says training is over.
    async fn forward(mut self, orders: mpsc::Sender<Result<Order, ServerError>>) {
        loop {
            let order = self.next().await.transpose();
            let last = !matches!(order, Some(Ok(Order::Round(_))));
            let Some(order) = order else {
                return;
            };
            if orders.send(order).await.is_err() || last {
                return;
            }
        }
    }

    /// The coordinator's next order; `None` when its stream ended (it restarts, or was lost).
    pub(crate) async fn next(&mut self) -> Result<Option<Order>, ServerError> {
        use coordinator_message::Body;
        let Some(message) = self.receive().await? else {
            return Ok(None);
        };
        match message {
            Body::Task(task) => (self.order(task).await).map(|o| Some(Order::Round(Box::new(o)))),
            Body::Shutdown(s) if s.kind() == ShutdownKind::Finished => Ok(Some(Order::Finished)),
            // The coordinator stops to be resumed: its stream ends next.
            Body::Shutdown(_) => Ok(None),
            Body::ModelChunk(_) | Body::Welcome(_) => Err(self.fail("a message out of place")),
        }
    }

    /// Reads a GroupTask's model chunks and its task.
    async fn order(&mut self, order: GroupTask) -> Result<GroupOrder, ServerError> {
        let Some(wire) = order.task else {
            return Err(self.fail("a GroupTask without its task"));
        };
        let task = Task::try_from(&wire).map_err(|e| self.fail(&e.to_string()))?;
        if wire.num_values != self.num_params as u64 {
            return Err(self.fail("a model of another length than Welcome said"));
        }
        let mut assembler = TensorAssembler::new(wire.round, wire.num_values, wire.num_chunks)
            .map_err(|e| self.fail(&e.to_string()))?;
        let model = loop {
            let chunk = match self.receive().await? {
                Some(coordinator_message::Body::ModelChunk(chunk)) => chunk,
                _ => return Err(self.fail("a GroupTask's model chunks were cut short")),
            };
            if let Some(model) = self.push(&mut assembler, chunk)? {
                break model;
            }
        };
        let timeout = self.seconds(order.timeout_secs, "the round's timeout")?;
        let secure = (order.secure.as_ref())
            .map(|s| self.secure_rule(s))
            .transpose()?;
        if secure.is_some() != task.secure.is_some() {
            return Err(self.fail("a secure group's task without its code, or the reverse"));
        }
        Ok(GroupOrder {
            task,
            model,
            clients: order.clients.into_iter().collect(),
            rule: GroupRule {
                clip_bound: (order.clip_bound > 0.0).then_some(order.clip_bound),
                weight_by_examples: order.weight_by_examples,
                secure,
            },
            timeout,
        })
    }

    /// A secure group's settings, checked.
    fn secure_rule(&self, wire: &SecureGroup) -> Result<SecureRule, ServerError> {
        let fraction = |f: f64, what: &str| match f > 0.0 && f <= 1.0 {
            true => Ok(f),
            false => Err(self.fail(&format!("{what} {f} is not in (0, 1]"))),
        };
        Ok(SecureRule {
            threshold: fraction(wire.threshold, "the threshold")?,
            min_survivor_fraction: fraction(wire.min_survivor_fraction, "the survivor fraction")?,
            min_survivors: usize::try_from(wire.min_survivors)
                .map_err(|e| self.fail(&e.to_string()))?,
            degree: (!wire.complete).then_some(wire.degree as usize),
            stage_timeout: self.seconds(wire.stage_timeout_secs, "the stage timeout")?,
        })
    }

    /// `secs` as a duration, or the error naming `what`.
    fn seconds(&self, secs: f64, what: &str) -> Result<Duration, ServerError> {
        Duration::try_from_secs_f64(secs).map_err(|e| self.fail(&format!("{what}: {e}")))
    }

    /// Adds a model chunk; the model once complete.
    fn push(
        &self,
        assembler: &mut TensorAssembler,
        chunk: TensorChunk,
    ) -> Result<Option<Vec<f32>>, ServerError> {
        assembler.push(chunk).map_err(|e| self.fail(&e.to_string()))
    }

    /// The next message's body; `None` once the stream ended.
    async fn receive(&mut self) -> Result<Option<coordinator_message::Body>, ServerError> {
        match self.incoming.message().await {
            Ok(Some(CoordinatorMessage { body: Some(body) })) => Ok(Some(body)),
            Ok(Some(_)) => Err(self.fail("an empty message")),
            Ok(None) => Ok(None),
            Err(status) => Err(self.fail(status.message())),
        }
    }

    /// The error that ends this stream.
    fn fail(&self, reason: &str) -> ServerError {
        ServerError::Upstream {
            url: self.url.clone(),
            reason: reason.to_owned(),
        }
    }
}

impl Reports {
    /// The error that says the stream towards the coordinator was lost, and why.
    pub(crate) fn lost(&self, reason: &str) -> ServerError {
        ServerError::Upstream {
            url: self.url.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Reports the clients with a live stream.
    pub(crate) async fn population(&self, clients: Vec<ClientId>) -> Result<(), ServerError> {
        let population = Population { clients };
        self.send(aggregator_message::Body::Population(population))
            .await
    }

    /// Sends the group's partial aggregate of a round.
    pub(crate) async fn result(&self, report: GroupReport) -> Result<(), ServerError> {
        let sum = report.sum.unwrap_or_default();
        let header = GroupResult {
            round: report.round,
            contributors: report.contributors,
            weight: report.weight,
            dropped: report.dropped,
            refused: report.refused,
            bytes_up: report.bytes_up,
            bytes_down: report.bytes_down,
            train_loss_sum: report.losses.0,
            losses: report.losses.1,
            num_values: sum.len() as u64,
            num_chunks: chunk_count(sum.len()),
            clip_bound: report.clip_bound.unwrap_or(0.0),
            dropouts_recovered: report.dropouts_recovered,
        };
        self.send(aggregator_message::Body::Result(header)).await?;
        for chunk in encode_chunks(report.round, &sum) {
            self.send(aggregator_message::Body::SumChunk(chunk)).await?;
        }
        Ok(())
    }

    /// Sends one message.
    async fn send(&self, message: aggregator_message::Body) -> Result<(), ServerError> {
        (self.outgoing.send(body(message)).await).map_err(|_| self.lost("its stream ended"))
    }
}

/// A message of `body`.
fn body(body: aggregator_message::Body) -> AggregatorMessage {
    AggregatorMessage { body: Some(body) }
}
