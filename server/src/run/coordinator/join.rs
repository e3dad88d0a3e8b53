//! Before the first round: the coordinator waits for its K clients.

use super::Coordinator;
use crate::error::ServerError;
use std::time::Duration;

impl Coordinator {
    /// Waits for K clients before the first round. A run killed during or after its last round
    /// has only its summary left, but clients that come back get their Shutdown instead of
    /// retrying until their timeout. A wait that fails tells the clients that came at once (to
    /// come back, when the server stopped to be resumed), so that their connections close and
    /// the server stops without waiting out its drain period.
    pub(super) async fn await_clients(&mut self, first_round: u64) -> Result<(), ServerError> {
        let expected = self.config.server.clients;
        let join_timeout = Duration::from_secs_f64(self.config.server.join_timeout_secs);
        if first_round <= self.config.server.rounds {
            let waited = self.clients.wait_for(expected, join_timeout).await;
            if let Err(e) = &waited {
                let resuming = matches!(e, ServerError::Interrupted);
                self.clients.shutdown_all(first_round - 1, resuming);
            }
            return waited;
        }
        let grace = join_timeout.min(Duration::from_secs(10));
        if let Err(e) = self.clients.wait_for(expected, grace).await {
            tracing::info!(error = %e, "no more clients came back");
        }
        Ok(())
    }
}
