//! An honest server's secure round over the scripted sessions, by the library's own server
//! phases (`fl_secagg::AdvertiseKeys` to `Unmasking`), so that a test can run a round
//! as the protocol says and deviate only where it means to.

use crate::scripted::{Answer, PARAMS, Peer, answer, keys_of, ring, send_stage, tag_of};
use fl_proto::v1::RoundTask;
use fl_secagg::{
    AdvertiseKeys, Consistency, GraphKind, RoundResult, RoundSetup, ServerStage, StageMessage,
    Verifier,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What an honest round gave.
#[derive(Debug)]
pub(crate) struct Honest {
    /// The unmasked sum.
    pub(crate) result: RoundResult,
    /// Signed rounds: each survivor's signature over the survivor set.
    pub(crate) endorsements: BTreeMap<u64, [u8; 64]>,
}

/// The next answer of `peer`, which must be a stage message (a refusal is the error).
async fn stage(peer: &mut Peer) -> Result<StageMessage, String> {
    match answer(peer).await {
        Answer::Stage(message) => Ok(message),
        Answer::Failed(reason) => Err(format!("client {}: {reason}", peer.id)),
    }
}

/// Where the server deviates from the honest round.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deviation<'a> {
    /// Nowhere.
    None,
    /// It forwards these endorsements instead of the round's own.
    Replay(&'a BTreeMap<u64, [u8; 64]>),
    /// It reads no masked input from the last `n` clients (they dropped, as far as the round
    /// goes) and goes on with the others, as low as they are.
    Drop(usize),
}

/// Runs round 1 of `task` over every peer on the complete graph with threshold fraction
/// `threshold`, as an honest server would but for `deviation`; a signed round (with `verifier`)
/// forwards each client its neighbours' signatures. The first refusal of any client is the
/// error.
pub(crate) async fn round(
    peers: &mut BTreeMap<u64, Peer>,
    task: &RoundTask,
    (model, threshold): (&[f32], f64),
    verifier: Option<Arc<Verifier>>,
    deviation: Deviation<'_>,
) -> Result<Honest, String> {
    let tag = tag_of(task, model);
    let signed = verifier.is_some();
    let adverts = keys_of(peers, task, |_| model.to_vec()).await;
    // The clients whose masked inputs are read (the first ones by id), and the round's floor.
    let kept = match deviation {
        Deviation::Drop(n) => peers.len() - n,
        Deviation::None | Deviation::Replay(_) => peers.len(),
    };
    let setup = RoundSetup {
        tag,
        ring: ring(),
        dim: PARAMS,
        graph: GraphKind::Complete,
        threshold_fraction: threshold,
        min_survivors: kept,
        verifier,
    };
    let fail = |e: fl_secagg::SecAggError| e.to_string();
    let mut keys = AdvertiseKeys::new(setup, peers.keys().copied());
    for a in adverts {
        keys.receive_keys(a.client, a).map_err(fail)?;
    }
    let (mut shares, hoods) = keys.close().map_err(fail)?;
    for (u, hood) in hoods {
        send_stage(&peers[&u], &ServerStage::Neighbours(hood)).await;
    }
    for (&u, peer) in peers.iter_mut() {
        let StageMessage::Shares(s) = stage(peer).await? else {
            return Err(format!("client {u} did not send its shares"));
        };
        shares.receive_shares(u, s).map_err(fail)?;
    }
    let (mut check, inboxes) = shares.close().map_err(fail)?;
    for (u, inbox) in inboxes {
        send_stage(&peers[&u], &ServerStage::ShareInbox(inbox)).await;
    }
    for (&u, peer) in peers.iter_mut() {
        let StageMessage::Check(refused) = stage(peer).await? else {
            return Err(format!("client {u} did not check its shares"));
        };
        check.receive_check(u, refused).map_err(fail)?;
    }
    let (mut masked, checked) = check.close().map_err(fail)?;
    for (u, proceed) in checked.proceed {
        send_stage(&peers[&u], &ServerStage::Proceed(proceed)).await;
    }
    for (&u, peer) in peers.iter_mut().take(kept) {
        let StageMessage::Masked(y) = stage(peer).await? else {
            return Err(format!("client {u} did not send its masked input"));
        };
        masked.receive_masked(u, &y).map_err(fail)?;
    }
    let (mut unmasking, survivors) = masked.close().map_err(fail)?;
    for peer in peers.values().take(kept) {
        send_stage(peer, &ServerStage::Survivors(survivors.clone())).await;
    }
    let mut endorsements = BTreeMap::new();
    if signed {
        let mut consistency = Consistency::new(unmasking);
        for (&u, peer) in peers.iter_mut().take(kept) {
            let StageMessage::Endorse(signature) = stage(peer).await? else {
                return Err(format!("client {u} did not sign the survivors"));
            };
            consistency.receive_signature(u, signature).map_err(fail)?;
            endorsements.insert(u, signature);
        }
        let (next, mut forwarded) = consistency.close().map_err(fail)?;
        unmasking = next;
        if let Deviation::Replay(old) = deviation {
            for list in forwarded.values_mut() {
                list.iter_mut().for_each(|(v, s)| *s = old[v]);
            }
        }
        for (u, list) in forwarded {
            send_stage(&peers[&u], &ServerStage::Endorsements(list)).await;
        }
    }
    for (&u, peer) in peers.iter_mut().take(kept) {
        let StageMessage::Reveal(reveals) = stage(peer).await? else {
            return Err(format!("client {u} did not reveal"));
        };
        unmasking.receive_reveal(u, reveals).map_err(fail)?;
    }
    let result = unmasking.finish().map_err(fail)?;
    Ok(Honest {
        result,
        endorsements,
    })
}
