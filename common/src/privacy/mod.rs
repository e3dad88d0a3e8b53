//! Differential privacy: clipping, the Gaussian mechanism, the Rényi DP and PLD accountants of
//! the sampled Gaussian mechanism, budgets and planning.

mod accountant;
mod accountant_kind;
mod analytic_gaussian;
mod clip;
mod ddg;
mod discrete_gaussian;
mod gaussian;
mod local;
mod local_ledger;
mod planning;
mod pld;
mod protect;
mod rdp;
mod release;
mod sampled_gaussian;
mod tree;

pub use accountant::{
    Accountant, PrivacyEvent, RdpAccountant, check_delta, check_epsilon, delta_from_rdp,
    epsilon_from_rdp,
};
pub use accountant_kind::AccountantKind;
pub use analytic_gaussian::{
    analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta, gaussian_epsilon,
};
pub use clip::{UpdateMoments, clip_l2, l2_norm, median};
pub(crate) use clip::{scale_into_bound, squared_l2_norm};
pub use ddg::{DdgRound, DdgSettlement, Neighbours};
pub use discrete_gaussian::{
    MAX_VARIANCE, add_discrete_gaussian_noise, discrete_variance, sample_discrete_gaussian,
};
pub use gaussian::add_gaussian_noise;
pub use local::{add_laplace_noise, clip_l1, l1_norm, sgd_l1_sensitivity};
pub use local_ledger::LocalLedger;
pub use planning::{Budget, after_rounds, max_rounds, min_sigma};
pub use pld::PldAccountant;
pub use protect::{Protected, Released};
pub use rdp::{
    default_orders, poisson_curve, rdp_poisson, rdp_without_replacement, without_replacement_curve,
};
pub use release::{ClientLimits, LocalMechanism, LocalPrivacyError, Release, ReleaseKind};
pub use sampled_gaussian::{AccountingError, GaussianRound, Sampling};
pub use tree::{TreeNoise, TreeRound, tree_depth, tree_nodes};
