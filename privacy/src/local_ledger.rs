//! What a client has spent over the rounds it took part in: its releases composed (pure ones by
//! adding epsilons, Gaussian ones exactly as one Gaussian, mixed ones by RDP).

use super::accountant::epsilon_from_rdp;
use super::analytic_gaussian::gaussian_epsilon;
use super::ddg::DdgRound;
use super::mechanism::{Release, ReleaseCost};
use super::rdp::default_orders;

/// One client's composed local privacy loss (serialisable, so a server checkpoint can keep it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LocalLedger {
    releases: u64,
    /// Sum of the pure releases' epsilons (used alone when every release is pure).
    pure_epsilon: f64,
    /// Whether any release was approximate (Gaussian).
    approximate: bool,
    /// sum_i (Delta_i / sigma_i)^2 over the Gaussian releases (`None` once a secure round was
    /// recorded, and in ledgers written before it was kept: they use RDP).
    #[serde(default)]
    gaussian_mu_squared: Option<f64>,
    orders: Vec<f64>,
    rdp: Vec<f64>,
}

impl Default for LocalLedger {
    fn default() -> Self {
        let orders = default_orders();
        Self {
            releases: 0,
            pure_epsilon: 0.0,
            approximate: false,
            gaussian_mu_squared: Some(0.0),
            rdp: vec![0.0; orders.len()],
            orders,
        }
    }
}

impl LocalLedger {
    /// Adds one release.
    pub fn record(&mut self, release: &Release) {
        self.releases += 1;
        let cost = release.cost();
        match cost {
            ReleaseCost::Gaussian { sensitivity, sigma } => {
                self.approximate = true;
                if let Some(mu2) = &mut self.gaussian_mu_squared {
                    *mu2 += (sensitivity / sigma).powi(2);
                }
            }
            ReleaseCost::Pure { epsilon } => self.pure_epsilon += epsilon,
        }
        for (acc, &alpha) in self.rdp.iter_mut().zip(&self.orders) {
            *acc += cost.rdp(alpha);
        }
    }

    /// Adds one secure-aggregation round as this client's ledger charges it: `round` with its
    /// own noise alone (`clients` = 1), since every other survivor may be the server's. A
    /// discrete Gaussian composes by RDP only (Canonne, Kamath, Steinke 2020, Thm 14: the same
    /// zCDP as the continuous one), so the exact Gaussian composition is given up from here on.
    pub fn record_secure(&mut self, round: &DdgRound) {
        self.releases += 1;
        self.approximate = true;
        self.gaussian_mu_squared = None;
        for (acc, &alpha) in self.rdp.iter_mut().zip(&self.orders) {
            *acc += round.rdp(alpha);
        }
    }

    /// Releases recorded.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// The composed epsilon: the sum of epsilons when every release is pure (then delta is 0);
    /// exact when every release is Gaussian (they compose into one Gaussian release of
    /// sensitivity/sigma = sqrt(sum_i (Delta_i/sigma_i)^2); Dong, Roth, Su 2022, Cor. 3.3);
    /// otherwise RDP composition converted at `delta`.
    pub fn epsilon(&self, delta: f64) -> f64 {
        match (self.approximate, self.gaussian_mu_squared) {
            (false, _) => self.pure_epsilon,
            (true, Some(mu2)) if self.pure_epsilon == 0.0 => {
                gaussian_epsilon(1.0, mu2.sqrt(), delta)
            }
            (true, _) => epsilon_from_rdp(&self.orders, &self.rdp, delta),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GaussianLdp, LocalMechanism, SignDsLdp, gaussian_epsilon};

    /// The release of a Gaussian mechanism at (`epsilon`, `delta`) with C = 1.
    fn gaussian(epsilon: f64, delta: f64) -> Release {
        let mechanism = GaussianLdp {
            epsilon,
            delta,
            clip_bound: 1.0,
        };
        LocalMechanism::Gaussian(mechanism)
            .accounted_release()
            .unwrap()
    }

    /// k Gaussian releases compose exactly into one at sigma / sqrt(k): one release gives back
    /// its epsilon, and 30 releases of the ldp-gaussian config (epsilon 8, delta 1e-5) cost the
    /// exact 79.7, below what RDP composition bounds (83.6).
    #[test]
    fn gaussian_releases_compose_exactly() {
        let release = gaussian(8.0, 1e-5);
        let mut ledger = LocalLedger::default();
        ledger.record(&release);
        assert!(
            (ledger.epsilon(1e-5) - 8.0).abs() < 1e-6,
            "{}",
            ledger.epsilon(1e-5)
        );
        for _ in 1..30 {
            ledger.record(&release);
        }
        let exact = gaussian_epsilon(release.noise / 30f64.sqrt(), release.sensitivity, 1e-5);
        let ours = ledger.epsilon(1e-5);
        assert!((ours - exact).abs() < 1e-6 * exact, "{ours} vs {exact}");
        assert!((ours - 79.7).abs() < 0.05, "{ours}");
        let rdp = epsilon_from_rdp(&ledger.orders, &ledger.rdp, 1e-5);
        assert!(ours < rdp, "{ours} vs RDP {rdp}");
    }

    /// One analytic-Gaussian release at (eps, delta) converts, through RDP, to no less than eps
    /// (the analytic calibration is tight, RDP conversion is not), and r releases cost more than
    /// one but less than r times as much; pure releases add up exactly.
    #[test]
    fn composed_local_loss_grows_with_participation() {
        let (eps, delta) = (1.0, 1e-5);
        let release = gaussian(eps, delta);
        let mut ledger = LocalLedger::default();
        assert_eq!(ledger.epsilon(delta), 0.0);
        ledger.record(&release);
        let one = ledger.epsilon(delta);
        assert!(one > 0.99 * eps && one < 2.0 * eps, "{one}");
        for _ in 1..10 {
            ledger.record(&release);
        }
        let ten = ledger.epsilon(delta);
        assert_eq!(ledger.releases(), 10);
        assert!(ten > one && ten < 10.0 * eps, "{ten}");
        let mut pure = LocalLedger::default();
        let signds = SignDsLdp {
            epsilon: 0.5,
            k: 2,
            h: 1,
        };
        let signds = LocalMechanism::SignDs(signds).accounted_release().unwrap();
        for _ in 0..7 {
            pure.record(&signds);
        }
        assert_eq!(pure.epsilon(delta), 3.5);
    }
}
