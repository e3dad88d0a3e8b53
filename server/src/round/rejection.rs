//! Why the coordinator ends a client's part in a round. The collections say it in these terms;
//! `service` maps them to gRPC statuses in one place.

use crate::identity::ids::ClientId;
use crate::round::strategy::StrategyError;
use fl_secagg::SecAggError;

/// A client's message the round refuses; its stream ends with the matching status.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// An upload arrived before the first round.
    #[error("no round is running")]
    NoRound,
    /// An upload or stage message names a later round than the current one.
    #[error("{what} for round {claimed}, but the current round is {current}")]
    WrongRound {
        /// "update" or "stage message".
        what: &'static str,
        /// The round it names.
        claimed: u64,
        /// The round in progress.
        current: u64,
    },
    /// The sender was not sampled, or already answered.
    #[error("client {client} was not sampled in round {round} or already submitted")]
    NotExpected {
        /// The sender.
        client: ClientId,
        /// The round in progress.
        round: u64,
    },
    /// An update for a model version its sender was never sent (asynchronous mode).
    #[error("client {client} was never sent the model of round {round}")]
    NotSent {
        /// The sender.
        client: ClientId,
        /// The round it names.
        round: u64,
    },
    /// A plain update that claims no examples.
    #[error("update claims 0 examples: it must be at least 1")]
    NoExamples,
    /// The upload's local protection does not match the round's mechanism.
    #[error("{0}")]
    Release(String),
    /// The strategy refused the upload.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A secure-aggregation message in a plain round.
    #[error("this round does not use secure aggregation: send a plain update")]
    NotSecure,
    /// A plain upload in a secure-aggregation round.
    #[error("this round uses secure aggregation: send the stage messages, not a plain update")]
    SecureOnly,
    /// Too few neighbours could open the client's shares.
    #[error("excluded from round {0}: too few neighbours could open your shares")]
    Excluded(u64),
    /// A stage message the protocol refuses.
    #[error(transparent)]
    SecAgg(#[from] SecAggError),
}

impl Rejection {
    /// Whether the message came at the wrong time (rather than being malformed).
    pub fn is_out_of_turn(&self) -> bool {
        match self {
            Rejection::NoRound
            | Rejection::NotExpected { .. }
            | Rejection::NotSecure
            | Rejection::SecureOnly
            | Rejection::Excluded(_) => true,
            Rejection::SecAgg(e) => match e {
                SecAggError::WrongStage { .. }
                | SecAggError::NotParticipant(_)
                | SecAggError::Duplicate(_) => true,
                SecAggError::OutOfOrder { .. }
                | SecAggError::WrongRecipients { .. }
                | SecAggError::BadShare { .. }
                | SecAggError::ForgedShare { .. }
                | SecAggError::WrongReveal { .. }
                | SecAggError::BadMaskedInput { .. }
                | SecAggError::BadCheck { .. }
                | SecAggError::Unauthenticated { .. }
                | SecAggError::Refused(_)
                | SecAggError::OutsidePolicy(_)
                | SecAggError::Aborted { .. }
                | SecAggError::Key(_)
                | SecAggError::Shamir(_) => false,
            },
            Rejection::WrongRound { .. }
            | Rejection::NotSent { .. }
            | Rejection::NoExamples
            | Rejection::Release(_)
            | Rejection::Strategy(_) => false,
        }
    }
}
