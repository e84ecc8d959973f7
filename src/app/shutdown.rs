//! The ordered shutdown (STYLE.md): each step has its own deadline and is logged.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Satellite;

/// Deadlines of the shutdown steps.
const JOBS_STOP_DEADLINE: Duration = Duration::from_secs(5);
const INSTANCES_STOP_DEADLINE: Duration = Duration::from_secs(15);
const EVENTS_FLUSH_DEADLINE: Duration = Duration::from_secs(5);

impl Satellite {
    /// Ordered shutdown (STYLE.md): stop accepting and let in-flight requests finish, stop the jobs, stop the
    /// instances, flush events, close the database. Each step has its own deadline and is logged.
    /// Returns false when a step missed its deadline.
    pub async fn shutdown(self) -> bool {
        let mut clean = true;
        let began = Instant::now();
        info!(deadline_s = self.drain.as_secs(), "shutdown 1/5: refusing new connections, draining requests");
        self.cancel.cancel();
        if tokio::time::timeout(self.drain, self.server).await.is_err() {
            warn!(
                deadline_s = self.drain.as_secs(),
                "shutdown: http drain missed its deadline; requests still in flight are cut (raise SATELLITE_DRAIN_SECONDS for slow tools)"
            );
            clean = false;
        }
        info!(deadline_s = JOBS_STOP_DEADLINE.as_secs(), "shutdown 2/5: stopping pollers and background jobs");
        self.pollers.cancel();
        if !self.jobs.stop(JOBS_STOP_DEADLINE).await {
            warn!(deadline_s = JOBS_STOP_DEADLINE.as_secs(), "shutdown: a job missed its deadline");
            clean = false;
        }
        self.tasks.close();
        info!(deadline_s = INSTANCES_STOP_DEADLINE.as_secs(), "shutdown 3/5: stopping instances");
        let stopped = async {
            self.manager.shutdown().await;
            self.tasks.wait().await;
        };
        if tokio::time::timeout(INSTANCES_STOP_DEADLINE, stopped).await.is_err() {
            warn!(deadline_s = INSTANCES_STOP_DEADLINE.as_secs(), "shutdown: stopping instances missed its deadline");
            clean = false;
        }
        // Buffered log lines become events; events are in the outbox as they happen, so a standalone
        // satellite has nothing left to send.
        info!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown 4/5: flushing logs and events");
        // On a volume filling up, the disk reserve is given back first, so what is held can be written.
        if let Some(reserve) = self.store.volume().reserve() {
            reserve.check();
        }
        // The clients' activity since the last report, which the report job (stopped above) would have sent.
        let reported = async {
            for record in self.activity.take() {
                self.emitter.emit(crate::events::Event::client_activity(&record)).await;
            }
        };
        if tokio::time::timeout(EVENTS_FLUSH_DEADLINE, reported).await.is_err() {
            warn!(
                deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(),
                "shutdown: reporting client activity missed its deadline"
            );
            clean = false;
        }
        self.logs_stop.cancel();
        if tokio::time::timeout(EVENTS_FLUSH_DEADLINE, self.logs_task).await.is_err() {
            warn!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown: flushing logs missed its deadline");
            clean = false;
        }
        // Events the outbox refused earlier get one more try; what it still refuses goes with the process.
        if tokio::time::timeout(EVENTS_FLUSH_DEADLINE, self.emitter.retry_unwritten()).await.is_err()
            || self.emitter.unwritten() > 0
        {
            tracing::error!(lost = self.emitter.unwritten(), "shutdown: events the outbox refused are lost");
            clean = false;
        }
        self.uploads.cancel();
        if let Some(upload) = self.upload_task {
            // The uploader's own flush budget (EVENT_FLUSH_TIMEOUT_MS) plus a margin.
            if tokio::time::timeout(EVENTS_FLUSH_DEADLINE + Duration::from_secs(1), upload).await.is_err() {
                warn!("shutdown: the event uploader missed its deadline");
                clean = false;
            }
        }
        match tokio::time::timeout(EVENTS_FLUSH_DEADLINE, self.store.outbox().event_count()).await {
            Ok(Ok(kept)) => info!(kept, "events are in the outbox"),
            Ok(Err(err)) => warn!(error = %err, "shutdown: reading the event outbox failed"),
            Err(_) => {
                warn!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown: flushing events missed its deadline");
                clean = false;
            }
        }
        info!(deadline_s = crate::store::CLOSE_DEADLINE.as_secs(), "shutdown 5/5: closing the database");
        if !self.store.close().await {
            warn!(
                deadline_s = crate::store::CLOSE_DEADLINE.as_secs(),
                "shutdown: closing the database missed its deadline"
            );
            clean = false;
        }
        info!(clean, took_ms = began.elapsed().as_millis() as u64, "shutdown complete");
        clean
    }
}
