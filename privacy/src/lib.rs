//! Differential privacy: the mechanisms (the Gaussian and discrete Gaussian, the tree's
//! and banded factorizations' correlated noise, local Laplace and Gaussian releases, [`signds`], the Laplace step of
//! [`admm`]), their sensitivities, the Rényi DP and PLD accountants of the sampled Gaussian
//! mechanism, budgets and planning.
//!
//! **Owns** every privacy formula and every accounting rule. **Imports** fl-model (the updates
//! a mechanism protects, and the clips that bound their sensitivity); never a protocol or a
//! transport.

#![deny(missing_docs)]

mod accountant;
mod accountant_kind;
pub mod admm;
mod analytic_gaussian;
mod clip;
mod ddg;
mod discrete_gaussian;
mod event;
mod gaussian;
mod ledger_event;
mod local;
mod local_ledger;
mod mechanism;
mod planning;
mod pld;
mod rdp;
mod sampled_gaussian;
pub mod signds;
mod stream;
mod unsampled_gaussian;

pub use accountant::{
    Accountant, RdpAccountant, check_delta, check_epsilon, delta_from_rdp, epsilon_from_rdp,
};
pub use accountant_kind::AccountantKind;
pub use analytic_gaussian::{
    analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta, gaussian_epsilon,
};
pub use clip::{UpdateMoments, median};
pub use ddg::{DdgRound, DdgSettlement, Neighbours};
pub use discrete_gaussian::{
    MAX_VARIANCE, add_discrete_gaussian_noise, discrete_variance, sample_discrete_gaussian,
};
pub use event::{PrivacyEvent, read_event};
pub use fl_model::norms::{clip_l1, clip_l2, l1_norm, l2_norm};
pub use gaussian::add_gaussian_noise;
pub use ledger_event::LedgerEvent;
pub use local::{add_laplace_noise, sgd_l1_sensitivity};
pub use local_ledger::LocalLedger;
// The mechanisms' module lists what it exports: a new mechanism is exported with it.
pub use mechanism::*;
pub use planning::{Budget, after_rounds, max_rounds, min_sigma};
pub use pld::PldAccountant;
pub use rdp::{
    default_orders, poisson_curve, rdp_poisson, rdp_without_replacement, without_replacement_curve,
};
pub use sampled_gaussian::{AccountingError, GaussianRound, Sampling};
pub use stream::{
    AnyStream, BandedFactorization, BandedNoise, BandedRound, BandedSettings, BandedStream,
    Charges, CorrelatedNoise, NoiseStream, StepMismatch, StreamError, StreamRun, StreamSettings,
    TreeNoise, TreeRound, TreeSettings, TreeStream, tree_depth, tree_nodes, tree_rounds_within,
};
pub use unsampled_gaussian::UnsampledGaussian;
