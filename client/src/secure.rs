//! A client's side of a secure-aggregation round, without I/O: quantise and noise the update,
//! then answer each of the server's stage messages with `fl_secagg::ClientRound`.

use crate::Attack;
use fl_authority::policy::FederationPolicy;
use fl_privacy::add_discrete_gaussian_noise;
use fl_secagg::{
    ClientRound, Credentials, PlainInputs, Quantizer, Ring, RoundTag, SecAggError, ServerStage,
    StageMessage,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;

/// A secure-aggregation round in progress: the protocol state and the quantised input x_u.
pub(crate) struct SecureRound {
    /// t.
    pub(crate) round: u64,
    /// The ring the masked input is in.
    pub(crate) ring: Ring,
    protocol: ClientRound,
    input: Vec<u64>,
    /// Keys, masks, shares, rounding and noise: always from the OS, even in seeded runs.
    secret: StdRng,
}

/// What a stage message asks the client to do.
pub(crate) enum Step {
    /// Send this and wait for the next stage.
    Send(StageMessage),
    /// Send this; the round is over for this client.
    Done(StageMessage),
}

impl SecureRound {
    /// Quantises `input`'s update (clip to S, scale by gamma, stochastic rounding, then
    /// discrete Gaussian noise of its variance, which admission raised to the policy's floor)
    /// and starts the protocol as client `me` in the round `tag` names, refusing fewer than its
    /// n_min clients and signing with the context's credentials if any; returns the round and
    /// the public keys to advertise. The context's oracle (simulation only) records the plain
    /// input, which is never sent.
    pub(crate) fn start(
        (me, tag): (u64, RoundTag),
        input: SecureInput,
        context: &SecureContext,
    ) -> (Self, StageMessage) {
        let SecureInput {
            quantizer,
            noise_variance: variance,
            min_survivors,
            update,
        } = input;
        let round = tag.round;
        let mut secret = StdRng::from_os_rng();
        let mut codes = quantizer.encode(update, &mut secret);
        if variance > 0 {
            add_discrete_gaussian_noise(&mut codes, variance, &mut secret);
        }
        let input = quantizer.to_ring(&codes);
        if let Some(oracle) = &context.oracle {
            oracle.record(round, me, input.clone());
        }
        let credentials = context.credentials.clone();
        let protocol = ClientRound::new((tag, me), quantizer.ring, credentials, &mut secret)
            .under(context.policy.clone())
            .surviving_at_least(min_survivors);
        let keys = StageMessage::Keys(protocol.advertise());
        let state = Self {
            round,
            ring: quantizer.ring,
            protocol,
            input,
            secret,
        };
        (state, keys)
    }

    /// Answers one stage message of the server; an error is the reason to leave the round.
    pub(crate) fn step(&mut self, stage: ServerStage) -> Result<Step, SecAggError> {
        let (p, rng) = (&mut self.protocol, &mut self.secret);
        Ok(match stage {
            // Stage 1: share this client's secrets among its neighbours.
            ServerStage::Neighbours(hood) => {
                Step::Send(StageMessage::Shares(p.share_keys(hood, rng)?))
            }
            // The check: name the neighbours whose shares do not open (to this client, they
            // have dropped).
            ServerStage::ShareInbox(shares) => {
                let refused = p.check_shares(&shares)?;
                if !refused.is_empty() {
                    let round = self.round;
                    tracing::warn!(
                        round,
                        ?refused,
                        "neighbours' shares do not open: treated as dropped"
                    );
                }
                Step::Send(StageMessage::Check(refused))
            }
            // Stage 2: the masked input y_u.
            ServerStage::Proceed(proceed) => {
                let y = p.masked_input(&proceed, &self.input)?;
                Step::Send(StageMessage::Masked(y))
            }
            // Stage 3 (unsigned): the shares that unmask the survivors' sum.
            ServerStage::Survivors(survivors) if !p.signed() => {
                Step::Done(StageMessage::Reveal(p.unmask(&survivors)?))
            }
            // The consistency check (signed): sign the survivor set, once.
            ServerStage::Survivors(survivors) => {
                Step::Send(StageMessage::Endorse(p.endorse(&survivors)?))
            }
            // Stage 3 (signed): reveal once t neighbours signed the same sets.
            ServerStage::Endorsements(signatures) => {
                let reveals = p.reveal_endorsed(&signatures)?;
                Step::Done(StageMessage::Reveal(reveals))
            }
        })
    }
}

/// What a client brings to a secure round besides its update: its identity, and (simulation
/// only) where its plain input is recorded.
#[derive(Clone, Default)]
pub(crate) struct SecureContext {
    /// The identity it signs with.
    pub(crate) credentials: Option<Arc<Credentials>>,
    /// Simulation only: where secure rounds' plain inputs are recorded (never sent).
    pub(crate) oracle: Option<Arc<PlainInputs>>,
    /// The federation's rules: the round's minimums, checked at each stage.
    pub(crate) policy: Option<Arc<FederationPolicy>>,
    /// Simulation only: the client is compromised.
    pub(crate) attack: Option<Attack>,
}

/// What a client enters a secure round with, as admission permitted it.
pub(crate) struct SecureInput<'a> {
    /// The fixed-point code.
    pub(crate) quantizer: Quantizer,
    /// sigma_i^2: the noise added to the code, in levels.
    pub(crate) noise_variance: u64,
    /// n_min: the fewest clients the round may admit (U1) and keep (U3).
    pub(crate) min_survivors: u64,
    /// u: the update.
    pub(crate) update: &'a [f32],
}
