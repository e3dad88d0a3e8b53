//! Differential privacy: the Rényi DP accountant of the sampled Gaussian mechanism, budgets and
//! planning.

mod accountant;
mod planning;
mod rdp;

pub use accountant::{
    Accountant, AccountingError, GaussianRound, RdpAccountant, Sampling, check_delta,
    check_epsilon, delta_from_rdp, epsilon_from_rdp,
};
pub use planning::{Budget, after_rounds, max_rounds, min_sigma};
pub use rdp::{default_orders, rdp_poisson, rdp_without_replacement};
