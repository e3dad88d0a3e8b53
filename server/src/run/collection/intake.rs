//! One intake for every individual upload, in a round or in the asynchronous buffer: the upload
//! event read once into what it claims ([`Received::read`]); then, once the schedule waiting for
//! it has admitted it (a round's sampling, or the buffer's dispatches), checked into what the
//! strategy stack takes ([`Received::check`]: its declared release, its example count, an update
//! of finite values as a [`CheckedUpdate`]); and, once absorbed, counted ([`Tally::count`]).
//! A new check or a new figure of an upload is written here, once.

use super::Tally;
use crate::identity::ids::ClientId;
use crate::round::events::{Declared, Event, UploadHeader};
use crate::round::rejection::Rejection;
use crate::round::strategy::{ClientUpdate, SignUpload, Upload, VerifiedUpload};
use fl_model::CheckedUpdate;
use fl_secagg::verified::Report;

/// A client's (loss, accuracy, n) on its own examples (federated evaluation).
type Evaluation = (f64, f64, u64);

/// An upload as it arrived, before any check.
#[derive(Debug)]
pub(crate) struct Received {
    /// Its sender.
    pub client: ClientId,
    /// The round it claims to be for (asynchronously: the model version it trained on).
    pub round: u64,
    /// n_k, for plain updates only (the trusted curator's FedAvg weight).
    num_examples: Option<u64>,
    /// Its declared local protection.
    release: Declared,
    /// What it carries.
    payload: Payload,
}

/// What an upload carries besides its claims.
#[derive(Debug)]
enum Payload {
    /// A dense update, with the loss and evaluation a plain upload reports.
    Dense {
        values: Vec<f32>,
        loss: Option<f32>,
        evaluation: Option<Evaluation>,
    },
    /// A SignDS upload (s, J).
    Sign { sign: i64, indices: Vec<u64> },
    /// A verified upload's shares and proof.
    Verified(Box<Report>),
}

/// What an absorbed upload reports besides its update (only plain uploads, which only a
/// trusted curator receives, report anything).
#[derive(Debug, Default)]
pub(crate) struct Reported {
    loss: Option<f32>,
    evaluation: Option<Evaluation>,
}

impl Received {
    /// The upload `event` carries, its bytes added to `tally`; any other event, given back.
    pub(crate) fn read(event: Event, tally: &mut Tally) -> Result<Self, Event> {
        match event {
            Event::Update {
                client,
                header,
                values,
                bytes,
            } => {
                tally.bytes_up += bytes;
                // Under a local mechanism only the release travels: every upload weighs 1.
                let (round, num_examples, release, loss, evaluation) = match header {
                    UploadHeader::Plain {
                        round,
                        num_examples,
                        train_loss,
                        evaluation,
                    } => (
                        round,
                        Some(num_examples),
                        Declared::Absent,
                        train_loss,
                        evaluation,
                    ),
                    UploadHeader::Released { round, release } => (round, None, release, None, None),
                };
                let payload = Payload::Dense {
                    values,
                    loss,
                    evaluation,
                };
                Ok(Self {
                    client,
                    round,
                    num_examples,
                    release,
                    payload,
                })
            }
            Event::Sign {
                client,
                round,
                sign,
                indices,
                release,
                bytes,
            } => {
                tally.bytes_up += bytes;
                let payload = Payload::Sign { sign, indices };
                Ok(Self {
                    client,
                    round,
                    num_examples: None,
                    release,
                    payload,
                })
            }
            Event::Verified {
                client,
                round,
                report,
                bytes,
            } => {
                tally.bytes_up += bytes;
                Ok(Self {
                    client,
                    round,
                    num_examples: None,
                    release: Declared::Absent,
                    payload: Payload::Verified(report),
                })
            }
            other => Err(other),
        }
    }

    /// The admitted upload as the strategy stack takes it, weighted by `staleness_weight` (1 in
    /// a round), with what it reports; or why it is refused. The strategy stack checks the
    /// release against the round's mechanism; here it must at least be readable.
    pub(crate) fn check(self, staleness_weight: f64) -> Result<(Upload, Reported), Rejection> {
        let release = self.release.into_release().map_err(Rejection::Release)?;
        if self.num_examples == Some(0) {
            return Err(Rejection::NoExamples);
        }
        match self.payload {
            Payload::Dense {
                values,
                loss,
                evaluation,
            } => {
                // Checked once, here: every later pass takes the check and the norm from the type.
                let values =
                    CheckedUpdate::new(values).map_err(|e| Rejection::Strategy(e.into()))?;
                let update = ClientUpdate {
                    client: self.client,
                    num_examples: self.num_examples.unwrap_or(1),
                    values,
                    release,
                    staleness_weight,
                };
                Ok((Upload::Dense(update), Reported { loss, evaluation }))
            }
            Payload::Sign { sign, indices } => {
                let upload = SignUpload {
                    client: self.client,
                    release,
                    sign,
                    indices,
                };
                Ok((Upload::Sign(upload), Reported::default()))
            }
            Payload::Verified(report) => {
                let upload = VerifiedUpload {
                    client: self.client,
                    report,
                };
                Ok((Upload::Verified(upload), Reported::default()))
            }
        }
    }
}

impl Tally {
    /// Counts an upload the strategy stack absorbed: its training loss, and its evaluation when
    /// the task it answers `asked` for one (a figure nobody asked for is not counted).
    pub(crate) fn count(&mut self, reported: Reported, asked: bool) {
        self.completed += 1;
        if let Some(loss) = reported.loss.filter(|l| l.is_finite()) {
            self.losses += 1;
            self.train_loss_sum += f64::from(loss);
        }
        if let Some((loss, accuracy, n)) = reported.evaluation.filter(|_| asked) {
            (self.federated_eval.get_or_insert_default()).add(loss, accuracy, n);
        }
    }

    /// Counts a group's partial aggregate the strategy stack absorbed (the aggregator tier): its
    /// results, and the training losses its aggregator summed when they are finite.
    pub(crate) fn count_group(&mut self, contributors: usize, (loss_sum, losses): (f64, u64)) {
        self.completed += contributors;
        if loss_sum.is_finite() {
            self.losses += losses as usize;
            self.train_loss_sum += loss_sum;
        }
    }
}
