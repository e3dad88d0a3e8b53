//! The stage messages of one round, as the protocol sees them (the wire format maps 1:1).

use super::keys::SecretKind;
use super::shamir::Share;
use fl_authority::IdentityCertificate;

/// Stage 0, client → server: u's two public keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedKeys {
    /// u.
    pub client: u64,
    /// c_pk_u: for encrypting shares to u.
    pub cipher_public: [u8; 32],
    /// s_pk_u: for agreeing pairwise mask seeds with u.
    pub mask_public: [u8; 32],
    /// The identity key's signature over the keys, the round and H(task), with the authority's
    /// certificate of that key: present when the client has credentials.
    pub signed: Option<Box<Signed>>,
}

/// A client admitted to a round (a member of U1), as every client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its id in the round.
    pub id: u64,
    /// The name its certificate gives it, when keys are signed.
    pub name: Option<String>,
    /// The digest of its key advertisement as the server received it
    /// ([`AdvertisedKeys::digest`]): fresh in every attempt, so that what survivors sign binds
    /// the attempt's whole key transcript.
    pub keys: [u8; 32],
}

impl Member {
    /// The member that advertised `keys`, under the certified `name` if any.
    pub fn of(keys: &AdvertisedKeys, name: Option<String>) -> Self {
        Self {
            id: keys.client,
            name,
            keys: keys.digest(),
        }
    }
}

/// After stage 0, server → client: its neighbours' keys and the Shamir threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbourhood {
    /// t: shares needed to recover a secret.
    pub threshold: usize,
    /// U1, in increasing order of id: every client the neighbour graph is derived over.
    pub members: Vec<Member>,
    /// The advertised keys of every neighbour in U1.
    pub neighbours: Vec<AdvertisedKeys>,
}

/// Stage 1, client → server → client: `from`'s two shares for `to`, sealed, and the commitments
/// the server keeps to check them when they are revealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedShares {
    /// The secrets' owner.
    pub from: u64,
    /// The holder.
    pub to: u64,
    /// ChaCha20-Poly1305 of round || from || to || share of s_sk || share of b.
    pub ciphertext: Vec<u8>,
    /// Commitment to the share of s_sk_from.
    pub mask_key_commitment: [u8; 32],
    /// Commitment to the share of b_from.
    pub self_mask_commitment: [u8; 32],
}

/// Stage 3, client → server: one share the holder reveals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevealedShare {
    /// Whose secret.
    pub owner: u64,
    /// Which secret.
    pub kind: SecretKind,
    /// The share.
    pub share: Share,
}

/// After the check, server → client: what the masked input must leave out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proceed {
    /// Neighbours out of the round (too few of their shares could be opened).
    pub excluded: Vec<u64>,
    /// Neighbours that could not open this client's shares: the pair is not masked.
    pub unpaired: Vec<u64>,
}

/// A client's stage message, as every phase of the server takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageMessage {
    /// Stage 0: its public keys.
    Keys(AdvertisedKeys),
    /// Stage 1: its sealed shares.
    Shares(Vec<SealedShares>),
    /// The check: the neighbours whose shares it could not open.
    Check(Vec<u64>),
    /// Stage 2: its masked input y_u.
    Masked(Vec<u64>),
    /// The consistency check: its signature over (round, H(task), H(U1), U3).
    Endorse([u8; 64]),
    /// Stage 3: its revealed shares.
    Reveal(Vec<RevealedShare>),
}

impl StageMessage {
    /// The stage the message belongs to.
    pub fn stage(&self) -> Stage {
        match self {
            StageMessage::Keys(_) => Stage::AdvertiseKeys,
            StageMessage::Shares(_) => Stage::ShareKeys,
            StageMessage::Check(_) => Stage::CheckShares,
            StageMessage::Masked(_) => Stage::MaskedInput,
            StageMessage::Endorse(_) => Stage::Consistency,
            StageMessage::Reveal(_) => Stage::Unmasking,
        }
    }
}

/// Survivor-set signatures, by signer.
pub type Endorsements = Vec<(u64, [u8; 64])>;

/// A server's stage message to a client, between the client's stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStage {
    /// Stage 1's start: the client's neighbours and the threshold.
    Neighbours(Neighbourhood),
    /// The check's start: the shares sealed for the client.
    ShareInbox(Vec<SealedShares>),
    /// Stage 2's start: who is excluded and who goes unpaired.
    Proceed(Proceed),
    /// The consistency check's start (signed rounds) or stage 3's start: U3, the clients whose
    /// masked inputs are in the sum.
    Survivors(Vec<u64>),
    /// Stage 3's start in a signed round: the signatures of the client's neighbours over the
    /// survivor set, by signer.
    Endorsements(Endorsements),
}

/// The signature on a key advertisement and the certificate of the key that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The authority's certificate of the client's identity key.
    pub certificate: IdentityCertificate,
    /// The identity key's signature over the keys payload.
    pub signature: [u8; 64],
}

/// The stages of a round, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Collecting public keys (U1).
    AdvertiseKeys,
    /// Collecting sealed shares (U2).
    ShareKeys,
    /// Collecting which neighbours' shares each client could not open.
    CheckShares,
    /// Collecting masked inputs (U3).
    MaskedInput,
    /// Signed rounds: collecting the survivors' signatures over U1 and U3.
    Consistency,
    /// Collecting revealed shares.
    Unmasking,
    /// The sum is known (or the round aborted).
    Done,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::AdvertiseKeys => "advertise-keys",
            Stage::ShareKeys => "share-keys",
            Stage::CheckShares => "check-shares",
            Stage::MaskedInput => "masked-input",
            Stage::Consistency => "consistency",
            Stage::Unmasking => "unmasking",
            Stage::Done => "done",
        })
    }
}
