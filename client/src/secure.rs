//! A client's side of a secure-aggregation round over the wire: quantise and noise the update,
//! then answer each stage message with `fl_common::secagg::ClientRound`.

use crate::ClientOptions;
use fl_common::privacy::{MAX_VARIANCE, add_discrete_gaussian_noise};
use fl_common::secagg::{
    AdvertisedKeys, ClientRound, Neighbourhood, Proceed, Quantizer, Ring, SealedShares,
};
use fl_proto::v1::{
    MaskedInputHeader, RevealedShare, SealedShare, SecAggCheck, SecAggKeys, SecAggNeighbours,
    SecAggProceed, SecAggReveal, SecAggShareInbox, SecAggShares, SecAggTask, client_message,
    server_message,
};
use fl_proto::{chunk_count, encode_word_chunks, ring_words};
use rand::rngs::StdRng;

/// A secure-aggregation round in progress: the protocol state and the quantised input x_u.
pub(crate) struct SecureRound {
    pub(crate) round: u64,
    ring: Ring,
    protocol: ClientRound,
    input: Vec<u64>,
}

/// What a stage message asks the client to do.
pub(crate) enum Step {
    /// A message of another round: nothing.
    Ignore,
    /// Send these and wait for the next stage.
    Send(Vec<client_message::Body>),
    /// Send this; the round is over for this client.
    Done(client_message::Body),
}

/// Quantises the update as the task says (clip to S, scale by gamma, stochastic rounding, then
/// the distributed discrete Gaussian noise if any) and starts the protocol: returns its state and
/// the public keys to advertise.
pub(crate) fn secure_start(
    me: u64,
    round: u64,
    task: SecAggTask,
    update: &[f32],
    opts: &ClientOptions,
    rng: &mut StdRng,
) -> Result<(SecureRound, SecAggKeys), String> {
    let ring = Ring::new(task.ring_bits)?;
    if !(task.clip_bound > 0.0
        && task.clip_bound.is_finite()
        && task.scale >= 1.0 / task.clip_bound
        && task.scale.is_finite())
    {
        return Err(format!(
            "unusable quantisation S = {}, gamma = {}",
            task.clip_bound, task.scale
        ));
    }
    if task.noise_variance > MAX_VARIANCE {
        return Err(format!(
            "noise variance {} is beyond the sampler's range",
            task.noise_variance
        ));
    }
    let quantizer = Quantizer {
        ring,
        clip: task.clip_bound,
        scale: task.scale,
    };
    let mut codes = quantizer.encode(update, rng);
    if task.noise_variance > 0 {
        add_discrete_gaussian_noise(&mut codes, task.noise_variance, rng);
    }
    let input = quantizer.to_ring(&codes);
    if let Some(oracle) = &opts.oracle {
        oracle.record(round, me, input.clone());
    }
    let protocol = ClientRound::new(round, me, ring, rng);
    let keys = protocol.advertise();
    let advert = SecAggKeys {
        round,
        cipher_public: keys.cipher_public.to_vec(),
        mask_public: keys.mask_public.to_vec(),
    };
    Ok((
        SecureRound {
            round,
            ring,
            protocol,
            input,
        },
        advert,
    ))
}

/// Answers one stage message of the server.
pub(crate) fn secure_step(
    state: &mut SecureRound,
    body: server_message::Body,
    rng: &mut StdRng,
) -> Result<Step, String> {
    let round = state.round;
    match body {
        server_message::Body::SecaggNeighbours(n) if n.round == round => {
            share_keys(state, n, rng).map(|b| Step::Send(vec![b]))
        }
        server_message::Body::SecaggShareInbox(inbox) if inbox.round == round => {
            check_shares(state, inbox).map(|b| Step::Send(vec![b]))
        }
        server_message::Body::SecaggProceed(p) if p.round == round => {
            masked_input(state, p).map(Step::Send)
        }
        server_message::Body::SecaggSurvivors(s) if s.round == round => {
            let reveals = state.protocol.unmask(&s.survivors).map_err(text)?;
            let shares = reveals.iter().map(RevealedShare::from).collect();
            let reveal = SecAggReveal { round, shares };
            Ok(Step::Done(client_message::Body::SecaggReveal(reveal)))
        }
        _ => Ok(Step::Ignore),
    }
}

/// An error as the reason sent with TaskFailed.
fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Stage 1: shares this client's secrets among its neighbours.
fn share_keys(
    state: &mut SecureRound,
    n: SecAggNeighbours,
    rng: &mut StdRng,
) -> Result<client_message::Body, String> {
    let neighbours = (n.neighbours.iter())
        .map(AdvertisedKeys::try_from)
        .collect::<Result<_, _>>()
        .map_err(text)?;
    let hood = Neighbourhood {
        threshold: n.threshold as usize,
        neighbours,
    };
    let sealed = state.protocol.share_keys(hood, rng).map_err(text)?;
    let shares = sealed.iter().map(SealedShare::from).collect();
    let round = state.round;
    Ok(client_message::Body::SecaggShares(SecAggShares {
        round,
        shares,
    }))
}

/// The check: opens the shares addressed to this client and names the neighbours whose shares
/// do not open (to this client, they have dropped).
fn check_shares(
    state: &mut SecureRound,
    inbox: SecAggShareInbox,
) -> Result<client_message::Body, String> {
    let shares: Vec<SealedShares> = (inbox.shares.iter())
        .map(SealedShares::try_from)
        .collect::<Result<_, _>>()
        .map_err(text)?;
    let refused = state.protocol.check_shares(&shares).map_err(text)?;
    let round = state.round;
    if !refused.is_empty() {
        tracing::warn!(
            round,
            ?refused,
            "neighbours' shares do not open: treated as dropped"
        );
    }
    Ok(client_message::Body::SecaggCheck(SecAggCheck {
        round,
        refused,
    }))
}

/// Stage 2: the masked input y_u, as a header and its chunks.
fn masked_input(
    state: &mut SecureRound,
    p: SecAggProceed,
) -> Result<Vec<client_message::Body>, String> {
    let proceed = Proceed {
        excluded: p.excluded,
        unpaired: p.unpaired,
    };
    let y = (state.protocol)
        .masked_input(&proceed, &state.input)
        .map_err(text)?;
    let words = ring_words(state.ring, &y);
    let round = state.round;
    let header = client_message::Body::MaskedInputHeader(MaskedInputHeader {
        round,
        num_words: words.len() as u64,
        num_chunks: chunk_count(words.len()),
    });
    let chunks = encode_word_chunks(round, words.len(), |i| words[i]);
    Ok(std::iter::once(header)
        .chain(chunks.map(client_message::Body::UpdateChunk))
        .collect())
}
