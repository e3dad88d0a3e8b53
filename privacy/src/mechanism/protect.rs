//! The release boundary of the local modes: under a client-side mechanism the server is the
//! adversary, and what a client may send is a [`Protected`] value, sealed here from a
//! mechanism's output and its release alone (no loss, no example count). Only
//! [`LocalMechanism`](super::LocalMechanism)'s protecting methods seal one.

use super::Release;
use crate::AccountingError;
use crate::signds::SignDsError;

/// Why a local mechanism cannot protect a round's result: its parameters, not the result, are
/// at fault, so the reason says nothing of the client's examples.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ProtectError {
    /// The Gaussian mechanism's (epsilon, delta) cannot be calibrated.
    #[error(transparent)]
    Calibration(#[from] AccountingError),
    /// SignDS's k, h or epsilon do not fit the model.
    #[error(transparent)]
    SignDs(#[from] SignDsError),
    /// An inexact-ADMM step asked of a mechanism that does not protect one (named).
    #[error("the {0} mechanism does not protect IADMM's primal step")]
    NoAdmmStep(&'static str),
}

/// What a local mechanism released: the only thing a client under a local mode sends. Its
/// contents are private: only the mechanisms of this module build one, so holding a `Protected`
/// means the mechanism ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Protected(Released);

/// The contents of a [`Protected`] value, for encoding it (a `Released` cannot be turned back
/// into a `Protected`).
#[derive(Debug, Clone, PartialEq)]
pub enum Released {
    /// A dense release.
    Dense {
        /// The protected values.
        values: Vec<f32>,
        /// The mechanism and its parameters.
        release: Release,
    },
    /// A SignDS release.
    Sign {
        /// s.
        sign: i8,
        /// J, sorted.
        indices: Vec<u32>,
        /// Its epsilon.
        release: Release,
    },
}

/// What a mechanism outputs, before it is sealed with its release.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Dense protected values.
    Dense(Vec<f32>),
    /// A sign s and dimensions J (sorted).
    Sign {
        /// s.
        sign: i8,
        /// J.
        indices: Vec<u32>,
    },
}

impl Protected {
    /// Seals a mechanism's `output` with its `release`.
    pub(super) fn seal(output: Output, release: Release) -> Self {
        Self(match output {
            Output::Dense(values) => Released::Dense { values, release },
            Output::Sign { sign, indices } => Released::Sign {
                sign,
                indices,
                release,
            },
        })
    }

    /// The privacy loss of the release.
    pub fn release(&self) -> &Release {
        match &self.0 {
            Released::Dense { release, .. } | Released::Sign { release, .. } => release,
        }
    }

    /// The released values, for encoding.
    pub fn into_released(self) -> Released {
        self.0
    }

    /// The dense values, if the release is dense.
    pub fn values(&self) -> Option<&[f32]> {
        match &self.0 {
            Released::Dense { values, .. } => Some(values),
            Released::Sign { .. } => None,
        }
    }
}
