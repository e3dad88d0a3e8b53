//! Nothing derived from a round leaves the server before its checkpoint is durable: not even the
//! log line that says why a round was skipped.

mod support;

use std::sync::Arc;

/// What the server logged about skipped rounds, each with the skip reason its checkpoint held at
/// that moment.
type SkipLog = Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// A tracing layer that, on every event mentioning a skipped round's reason, reads the run's
/// checkpoint and notes what it held.
struct SkipWatcher {
    out: std::path::PathBuf,
    log: SkipLog,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SkipWatcher {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0 += &format!(" {}={v:?}", f.name());
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        if !text.0.contains("beyond the bound") {
            return;
        }
        let checkpoint = fl_server::checkpoint::Checkpoint::read(&self.out).ok();
        let durable = checkpoint.and_then(|c| c.progress.last_round?.skipped);
        self.log.lock().unwrap().push((text.0, durable));
    }
}

/// A skipped round's reason names a value of the aggregate: it is logged only once the round's
/// checkpoint (which holds the reason) is durable, never before. The watcher is the process's
/// subscriber (this binary holds this one test), so it sees every thread of the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_rounds_reason_is_logged_only_after_its_checkpoint() {
    use tracing_subscriber::layer::SubscriberExt;
    let log = SkipLog::default();
    let watcher = SkipWatcher {
        out: support::evil_out_dir(),
        log: log.clone(),
    };
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(watcher))
        .expect("the only subscriber of this test binary");
    // Every value 1e38: finite, but 100 of them overflow the aggregate, so every round is skipped
    // with a reason that names a value of it.
    let huge_update = |round, n| support::dense_upload(round, &vec![1e38; n], None);
    let (_, metrics, done) = support::run_with_evil_client(|_| {}, huge_update).await;
    assert_eq!((done, metrics.len()), (0, 2));
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2, "one warning per skipped round: {log:?}");
    for (text, durable) in log.iter() {
        let durable = durable
            .as_deref()
            .unwrap_or("(no skipped round in the checkpoint)");
        assert!(
            text.contains(durable),
            "logged {text:?} while the checkpoint held {durable:?}"
        );
    }
}
