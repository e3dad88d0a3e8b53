//! Local differential privacy around an inner strategy: every upload must carry the release of
//! the round's client-side mechanism (Gaussian or Laplace local DP, SignDS), which this decorator
//! checks against the mechanism before the inner strategy sees the upload, and records in its
//! client's local ledger once absorbed. The server cannot see the clients' noise: the ledgers hold
//! what the clients declare they applied, which each client also logs for itself.

use super::{
    Layer, RestoreError, RoundContext, RoundInstructions, Strategy, StrategyError, StrategyState,
    Upload, Views,
};
use crate::records::local_accounts::LocalAccounts;

/// Local DP, a [`Layer`] around any strategy; see the module documentation.
pub(crate) struct LocalDp {
    accounts: LocalAccounts,
}

impl LocalDp {
    /// The checks and ledgers of the mechanism of `accounts`.
    pub(crate) fn new(accounts: LocalAccounts) -> Self {
        Self { accounts }
    }
}

impl<S: Strategy> Layer<S> for LocalDp {
    const NAME: &'static str = "local_dp";

    fn configure_round(&mut self, inner: &mut S, ctx: &RoundContext) -> RoundInstructions {
        RoundInstructions {
            local: Some(self.accounts.mechanism()),
            ..inner.configure_round(ctx)
        }
    }

    fn absorb(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
        mut upload: Upload,
    ) -> Result<(), StrategyError> {
        let Some((client, declared)) = upload.take_release() else {
            return inner.absorb(ctx, upload);
        };
        let release = self
            .accounts
            .admit(declared.as_ref())
            .map_err(StrategyError::Release)?;
        inner.absorb(ctx, upload)?;
        self.accounts.record(client, &release);
        Ok(())
    }

    fn state(&self) -> StrategyState {
        StrategyState {
            local_ledgers: self.accounts.ledgers().clone(),
            ..StrategyState::default()
        }
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), RestoreError> {
        self.accounts.restore(state.local_ledgers.clone());
        Ok(())
    }

    fn views(&self) -> Views<'_> {
        Views {
            local_accounts: Some(&self.accounts),
            ..Views::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::FedAvg;
    use crate::round::strategy::testing::{ctx, update};
    use fl_privacy::{GaussianLdp, LaplaceLdp, LocalKind};
    use fl_privacy::{LocalMechanism, Release};

    /// A Laplace release at epsilon 0.5 and L1 sensitivity 2.
    fn laplace_release() -> Release {
        Release {
            kind: LocalKind::Laplace,
            epsilon: 0.5,
            delta: 0.0,
            noise: 2.0 / 0.5,
            sensitivity: 2.0,
        }
    }

    fn released(client: u64, release: Option<Release>) -> Upload {
        let mut u = update(client, 1, vec![1.0, 2.0]);
        u.release = release;
        u.into()
    }

    #[test]
    fn only_the_rounds_mechanism_is_absorbed_and_each_release_is_recorded() {
        let mechanism = LocalMechanism::Laplace(LaplaceLdp {
            epsilon: 0.5,
            clip_bound: 1.0,
            steps: 1,
        });
        let mut s = LocalDp::new(LocalAccounts::new(mechanism)).around(FedAvg::new(2));
        let c = ctx(1, 2.0, None);
        assert_eq!(s.configure_round(&c).local, Some(mechanism));
        assert!(s.absorb(&c, released(1, None)).is_err());
        let gaussian = LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 0.5,
            delta: 1e-5,
            clip_bound: 1.0,
        })
        .accounted_release()
        .unwrap();
        assert!(s.absorb(&c, released(1, Some(gaussian))).is_err());
        let laplace = laplace_release();
        s.absorb(&c, released(1, Some(laplace))).unwrap();
        s.absorb(&c, released(1, Some(laplace))).unwrap();
        assert_eq!(
            s.views().local_accounts.unwrap().per_client()[0].releases,
            2
        );
        assert_eq!(s.finish_round(&c, &[0.0, 0.0]).model, Some(vec![1.0, 2.0]));
        let mut restored = LocalDp::new(LocalAccounts::new(mechanism)).around(FedAvg::new(2));
        restored.restore(s.state()).unwrap();
        assert_eq!(restored.views().local_accounts.unwrap().max_epsilon(), 1.0);
    }

    #[test]
    fn without_the_decorator_a_release_is_refused() {
        let mut s = FedAvg::new(2);
        let laplace = laplace_release();
        let err = s.absorb(&ctx(1, 1.0, None), released(1, Some(laplace)));
        assert!(matches!(err, Err(StrategyError::UnexpectedRelease)));
    }
}
