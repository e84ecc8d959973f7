//! The ordered shutdown (STYLE.md): each step has its own deadline and is logged.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Satellite;

/// Deadlines of the shutdown steps.
const JOBS_STOP_DEADLINE: Duration = Duration::from_secs(5);
const INSTANCES_STOP_DEADLINE: Duration = Duration::from_secs(15);
const EVENTS_FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// Waits for `step` at most `deadline`; `None` when it did not end in time.
async fn within<F: Future>(deadline: Duration, step: F) -> Option<F::Output> {
    tokio::time::timeout(deadline, step).await.ok()
}

impl Satellite {
    /// Ordered shutdown (STYLE.md): stop accepting and let in-flight requests finish, stop the jobs, stop the
    /// instances, flush events, close the database. Each step has its own deadline and is logged.
    /// Returns false when a step missed its deadline.
    pub async fn shutdown(mut self) -> bool {
        let began = Instant::now();
        // In order: each step runs whether or not the one before it kept its deadline.
        let steps = [
            self.drain_requests().await,
            self.stop_jobs().await,
            self.stop_instances().await,
            self.flush_events().await,
            self.close_database().await,
        ];
        let clean = steps.iter().all(|kept| *kept);
        info!(clean, took_ms = began.elapsed().as_millis() as u64, "shutdown complete");
        clean
    }

    /// Step 1: refuse new connections and let the requests in flight finish, for at most the drain time.
    async fn drain_requests(&mut self) -> bool {
        info!(deadline_s = self.drain.as_secs(), "shutdown 1/5: refusing new connections, draining requests");
        self.cancel.cancel();
        let drained = within(self.drain, &mut self.server).await.is_some();
        if !drained {
            warn!(
                deadline_s = self.drain.as_secs(),
                "shutdown: http drain missed its deadline; requests still in flight are cut (raise SATELLITE_DRAIN_SECONDS for slow tools)"
            );
        }
        drained
    }

    /// Step 2: the backend's pollers and the background jobs.
    async fn stop_jobs(&mut self) -> bool {
        info!(deadline_s = JOBS_STOP_DEADLINE.as_secs(), "shutdown 2/5: stopping pollers and background jobs");
        self.pollers.cancel();
        let stopped = self.jobs.stop(JOBS_STOP_DEADLINE).await;
        if !stopped {
            warn!(deadline_s = JOBS_STOP_DEADLINE.as_secs(), "shutdown: a job missed its deadline");
        }
        self.tasks.close();
        stopped
    }

    /// Step 3: the instances, and the background work requests started (waking a dormant instance).
    async fn stop_instances(&mut self) -> bool {
        info!(deadline_s = INSTANCES_STOP_DEADLINE.as_secs(), "shutdown 3/5: stopping instances");
        let stopped = async {
            self.manager.shutdown().await;
            self.tasks.wait().await;
        };
        let kept = within(INSTANCES_STOP_DEADLINE, stopped).await.is_some();
        if !kept {
            warn!(deadline_s = INSTANCES_STOP_DEADLINE.as_secs(), "shutdown: stopping instances missed its deadline");
        }
        kept
    }

    /// Step 4: buffered log lines become events; events are in the outbox as they happen, so a standalone
    /// satellite has nothing left to send, and a managed one sends what it can before its uploader stops.
    async fn flush_events(&mut self) -> bool {
        info!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown 4/5: flushing logs and events");
        // On a volume filling up, the disk reserve is given back first, so what is held can be written.
        if let Some(reserve) = self.store.volume().reserve() {
            reserve.check();
        }
        let steps = [
            self.report_activity().await,
            self.flush_logs().await,
            self.retry_unwritten().await,
            self.finish_uploads().await,
            self.count_kept().await,
        ];
        steps.iter().all(|kept| *kept)
    }

    /// The clients' activity since the last report, which the report job (stopped above) would have sent.
    async fn report_activity(&self) -> bool {
        let reported = async {
            for record in self.activity.take() {
                self.emitter.emit(crate::events::Event::client_activity(&record)).await;
            }
        };
        let kept = within(EVENTS_FLUSH_DEADLINE, reported).await.is_some();
        if !kept {
            warn!(
                deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(),
                "shutdown: reporting client activity missed its deadline"
            );
        }
        kept
    }

    async fn flush_logs(&mut self) -> bool {
        self.logs_stop.cancel();
        let kept = within(EVENTS_FLUSH_DEADLINE, &mut self.logs_task).await.is_some();
        if !kept {
            warn!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown: flushing logs missed its deadline");
        }
        kept
    }

    /// Events the outbox refused earlier get one more try; what it still refuses goes with the process.
    async fn retry_unwritten(&self) -> bool {
        let retried = within(EVENTS_FLUSH_DEADLINE, self.emitter.retry_unwritten()).await.is_some();
        if !retried || self.emitter.unwritten() > 0 {
            tracing::error!(lost = self.emitter.unwritten(), "shutdown: events the outbox refused are lost");
            return false;
        }
        true
    }

    /// Managed mode: the uploader's last flush.
    async fn finish_uploads(&mut self) -> bool {
        self.uploads.cancel();
        let Some(upload) = self.upload_task.as_mut() else { return true };
        // The uploader's own flush budget (EVENT_FLUSH_TIMEOUT_MS) plus a margin.
        let kept = within(EVENTS_FLUSH_DEADLINE + Duration::from_secs(1), upload).await.is_some();
        if !kept {
            warn!("shutdown: the event uploader missed its deadline");
        }
        kept
    }

    /// How many events the outbox keeps for the next start (or, standalone, as local history).
    async fn count_kept(&self) -> bool {
        match within(EVENTS_FLUSH_DEADLINE, self.store.outbox().event_count()).await {
            Some(Ok(kept)) => info!(kept, "events are in the outbox"),
            Some(Err(err)) => warn!(error = %err, "shutdown: reading the event outbox failed"),
            None => {
                warn!(deadline_s = EVENTS_FLUSH_DEADLINE.as_secs(), "shutdown: flushing events missed its deadline");
                return false;
            }
        }
        true
    }

    /// Step 5: the database.
    async fn close_database(&self) -> bool {
        info!(deadline_s = crate::store::CLOSE_DEADLINE.as_secs(), "shutdown 5/5: closing the database");
        let closed = self.store.close().await;
        if !closed {
            warn!(
                deadline_s = crate::store::CLOSE_DEADLINE.as_secs(),
                "shutdown: closing the database missed its deadline"
            );
        }
        closed
    }
}
