//! The coordinator's end of the aggregator tier: the `flp.v1.Tier` service. An aggregator's
//! Aggregate stream opens with AggregatorHello (its token checked, its name given its group,
//! `crate::edge::groups`) and is answered with Welcome; then its population reports update the
//! registry of groups and its partial aggregates reach the round loop as [`Event::Group`], their
//! sums read by the same chunk assembler as clients' tensors. The stream's end is
//! [`Event::GroupLost`]. The round loop's group tasks go out on the stream
//! (`crate::edge::clients`).

use crate::edge::shared::Shared;
use crate::identity::ids::GroupId;
use crate::round::events::{Event, GroupReport, for_log};
use fl_proto::TensorAssembler;
use fl_proto::v1::tier_server::Tier;
use fl_proto::v1::{
    AggregatorMessage, CoordinatorMessage, GroupResult, Welcome, aggregator_message,
    coordinator_message,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// How long a new Aggregate stream may take to send its AggregatorHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages queued towards one aggregator before the sender waits.
const GROUP_OUTBOX: usize = 16;
/// Longest aggregator name.
const MAX_NAME_BYTES: usize = 256;

/// The `flp.v1.Tier` service.
#[derive(Debug, Clone)]
pub(crate) struct TierService {
    shared: Arc<Shared>,
}

impl TierService {
    /// A service over the shared state.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl Tier for TierService {
    async fn aggregate(
        &self,
        request: Request<Streaming<AggregatorMessage>>,
    ) -> Result<Response<BoxStream<CoordinatorMessage>>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no AggregatorHello within 30 s"))??;
        let hello = match first.and_then(|m| m.body) {
            Some(aggregator_message::Body::Hello(h)) => h,
            _ => {
                let opening = "an Aggregate stream must open with AggregatorHello";
                return Err(Status::invalid_argument(opening));
            }
        };
        if hello.name.is_empty() || hello.name.len() > MAX_NAME_BYTES {
            let rule = format!("an aggregator's name has 1 to {MAX_NAME_BYTES} bytes");
            return Err(Status::invalid_argument(rule));
        }
        if !self.shared.admits_aggregator(&hello.name, &hello.token) {
            tracing::warn!(name = %for_log(&hello.name), "aggregator refused: wrong token");
            return Err(Status::unauthenticated(
                "unknown aggregator token (or not the one enrolled for this name)",
            ));
        }
        let (outbox, queue) = mpsc::channel(GROUP_OUTBOX);
        let attached = self.shared.groups().attach(&hello.name, outbox.clone());
        let (group, generation) = attached.map_err(|refusal| {
            tracing::warn!(name = %for_log(&hello.name), %refusal, "aggregator refused");
            Status::already_exists(refusal.to_string())
        })?;
        let welcome = Welcome {
            group,
            num_values: self.shared.num_params as u64,
        };
        let body = coordinator_message::Body::Welcome(welcome);
        // A fresh queue has room: this cannot wait.
        let _ = outbox
            .send(Ok(CoordinatorMessage { body: Some(body) }))
            .await;
        tracing::info!(group, name = %for_log(&hello.name), "aggregator joined");
        let span = tracing::info_span!("aggregator", group);
        let reading = read_group(self.shared.clone(), (group, generation), inbound);
        tokio::spawn(reading.instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(queue))))
    }
}

/// Reads an aggregator's stream until it ends or breaks the protocol; then forgets the group's
/// stream (which ends the stream towards it) and tells the round loop.
async fn read_group(
    shared: Arc<Shared>,
    (group, generation): (GroupId, u64),
    mut inbound: Streaming<AggregatorMessage>,
) {
    let mut reader = GroupReader {
        num_params: shared.num_params as u64,
        pending: None,
    };
    let reason = loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => message,
            Ok(None) => break "its stream ended".to_owned(),
            Err(status) => break status.message().to_owned(),
        };
        let read = reader.read(message, |clients| {
            shared.groups().report(group, generation, clients)
        });
        match read {
            Ok(None) => {}
            Ok(Some(report)) => {
                let event = Event::Group { group, report };
                if shared.events.send(event.into()).await.is_err() {
                    return;
                }
            }
            Err(reason) => break reason,
        }
    };
    if shared.groups().detach(group, generation) {
        tracing::warn!(group, reason = %for_log(&reason), "aggregator left");
        let _ = shared.events.send(Event::GroupLost(group).into()).await;
    }
}

/// What an aggregator's stream has said so far: the partial aggregate whose chunks are coming.
struct GroupReader {
    /// The only sum length accepted.
    num_params: u64,
    pending: Option<(GroupResult, TensorAssembler)>,
}

impl GroupReader {
    /// Reads one message: a population goes to `report`, a complete partial aggregate is
    /// returned; a message out of place is the reason the stream ends.
    fn read<E: std::fmt::Display>(
        &mut self,
        message: AggregatorMessage,
        report: impl FnOnce(&[u64]) -> Result<(), E>,
    ) -> Result<Option<GroupReport>, String> {
        use aggregator_message::Body;
        match message.body {
            Some(Body::Population(p)) => {
                report(&p.clients).map(|()| None).map_err(|e| e.to_string())
            }
            Some(Body::Result(header)) if self.pending.is_none() => self.open(header),
            Some(Body::SumChunk(chunk)) => {
                let Some((_, assembler)) = &mut self.pending else {
                    return Err("a sum chunk without its GroupResult".into());
                };
                let Some(sum) = assembler.push(chunk).map_err(|e| e.to_string())? else {
                    return Ok(None);
                };
                let (header, _) = self.pending.take().expect("a pending result");
                Ok(Some(report_of(header, Some(sum))))
            }
            Some(Body::Result(_)) => Err("a GroupResult before the last one's chunks".into()),
            Some(Body::Hello(_)) | None => Err("an AggregatorHello after the first message".into()),
        }
    }

    /// Starts reading a partial aggregate: complete at once without a sum, otherwise once its
    /// chunks arrive.
    fn open(&mut self, header: GroupResult) -> Result<Option<GroupReport>, String> {
        if header.num_chunks == 0 && header.num_values == 0 {
            return Ok(Some(report_of(header, None)));
        }
        if header.num_values != self.num_params {
            let (got, want) = (header.num_values, self.num_params);
            return Err(format!("a group sum of {got} values, not {want}"));
        }
        let assembler = TensorAssembler::new(header.round, header.num_values, header.num_chunks)
            .map_err(|e| e.to_string())?;
        self.pending = Some((header, assembler));
        Ok(None)
    }
}

/// The round loop's reading of a GroupResult and its sum.
fn report_of(header: GroupResult, sum: Option<Vec<f32>>) -> GroupReport {
    GroupReport {
        round: header.round,
        sum,
        contributors: header.contributors,
        weight: header.weight,
        clip_bound: (header.clip_bound > 0.0).then_some(header.clip_bound),
        dropped: header.dropped,
        refused: header.refused,
        bytes_up: header.bytes_up,
        bytes_down: header.bytes_down,
        losses: (header.train_loss_sum, header.losses),
        dropouts_recovered: header.dropouts_recovered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_proto::encode_chunks;
    use fl_proto::v1::{Population, TensorChunk};

    fn message(body: aggregator_message::Body) -> AggregatorMessage {
        AggregatorMessage { body: Some(body) }
    }

    fn header(round: u64, values: &[f32]) -> aggregator_message::Body {
        aggregator_message::Body::Result(GroupResult {
            round,
            contributors: 2,
            weight: 2.0,
            num_values: values.len() as u64,
            num_chunks: fl_proto::chunk_count(values.len()),
            clip_bound: 1.0,
            ..GroupResult::default()
        })
    }

    fn reader() -> GroupReader {
        GroupReader {
            num_params: 3,
            pending: None,
        }
    }

    fn no_population(_: &[u64]) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_result_is_complete_once_its_chunks_arrive() {
        let sum = [1.0, -2.0, 0.5];
        let mut r = reader();
        assert_eq!(r.read(message(header(4, &sum)), no_population), Ok(None));
        let chunks: Vec<TensorChunk> = encode_chunks(4, &sum).collect();
        let mut report = None;
        for chunk in chunks {
            report = r
                .read(
                    message(aggregator_message::Body::SumChunk(chunk)),
                    no_population,
                )
                .unwrap();
        }
        let report = report.expect("complete");
        assert_eq!((report.round, report.sum), (4, Some(sum.to_vec())));
        assert_eq!((report.contributors, report.clip_bound), (2, Some(1.0)));
    }

    #[test]
    fn refuses_messages_out_of_place_and_sums_of_another_length() {
        let chunk = encode_chunks(1, &[1.0]).next().unwrap();
        let stray = message(aggregator_message::Body::SumChunk(chunk));
        assert!(reader().read(stray, no_population).is_err());
        assert!(
            reader()
                .read(message(header(1, &[1.0, 2.0])), no_population)
                .is_err()
        );
        let mut r = reader();
        r.read(message(header(1, &[1.0, 2.0, 3.0])), no_population)
            .unwrap();
        assert!(
            r.read(message(header(1, &[1.0, 2.0, 3.0])), no_population)
                .is_err()
        );
        let again = aggregator_message::Body::Hello(Default::default());
        assert!(reader().read(message(again), no_population).is_err());
        let population = message(aggregator_message::Body::Population(Population {
            clients: vec![1 << 40],
        }));
        let refused = reader().read(population, |_| Err("too large"));
        assert_eq!(refused, Err("too large".into()));
    }
}
