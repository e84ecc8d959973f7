//! Background jobs (SB §19): periodic work owned by the app, each with a
//! name, its own error logging and counters, and one cancellation that
//! stops them all. A job's error is logged with its execution number and
//! never stops the job.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use serde::Serialize;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

/// Counters of one job, as the debug route shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStats {
    pub execution_count: u64,
    pub error_count: u64,
    /// Milliseconds.
    pub average_execution_time: f64,
    pub is_running: bool,
    /// Milliseconds.
    pub period: u64,
}

#[derive(Debug, Default)]
struct Counters {
    executions: AtomicU64,
    errors: AtomicU64,
    total_micros: AtomicU64,
    running: AtomicBool,
    period_ms: AtomicU64,
}

/// The app's jobs; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    tracker: TaskTracker,
    cancel: CancellationToken,
    counters: Arc<RwLock<BTreeMap<&'static str, Arc<Counters>>>>,
}

/// When the first run happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstRun {
    Immediately,
    AfterOnePeriod,
}

impl Jobs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Run `work` every `period` until the jobs stop. `work` returns an error message on failure.
    pub fn every<F, Fut, E>(&self, name: &'static str, period: Duration, first: FirstRun, mut work: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: std::fmt::Display,
    {
        let counters = Arc::new(Counters::default());
        counters.period_ms.store(period.as_millis() as u64, Ordering::Relaxed);
        self.counters.write().insert(name, counters.clone());
        let cancel = self.cancel.clone();
        self.tracker.spawn(
            async move {
                let start = match first {
                    FirstRun::Immediately => tokio::time::Instant::now(),
                    FirstRun::AfterOnePeriod => tokio::time::Instant::now() + period,
                };
                let mut ticker = tokio::time::interval_at(start, period);
                ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break,
                        _ = ticker.tick() => {}
                    }
                    let execution = counters.executions.fetch_add(1, Ordering::Relaxed) + 1;
                    counters.running.store(true, Ordering::Relaxed);
                    let began = Instant::now();
                    debug!(execution, "job_execute_start");
                    // Cancellation interrupts a run in progress, so stopping never waits a whole run.
                    let outcome = tokio::select! {
                        _ = cancel.cancelled() => None,
                        outcome = work() => Some(outcome),
                    };
                    let took = began.elapsed();
                    counters.total_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
                    counters.running.store(false, Ordering::Relaxed);
                    match outcome {
                        None => break,
                        Some(Ok(())) => debug!(execution, duration_ms = took.as_millis() as u64, "job_execute_success"),
                        Some(Err(err)) => {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                            warn!(execution, duration_ms = took.as_millis() as u64, error = %err, "job_execute_error");
                        }
                    }
                }
                debug!("job stopped");
            }
            .instrument(tracing::info_span!("job", name)),
        );
    }

    /// Counters of every job, by name.
    pub fn stats(&self) -> BTreeMap<&'static str, JobStats> {
        self.counters
            .read()
            .iter()
            .map(|(name, c)| {
                let executions = c.executions.load(Ordering::Relaxed);
                let total_ms = c.total_micros.load(Ordering::Relaxed) as f64 / 1000.0;
                let stats = JobStats {
                    execution_count: executions,
                    error_count: c.errors.load(Ordering::Relaxed),
                    average_execution_time: if executions == 0 { 0.0 } else { total_ms / executions as f64 },
                    is_running: c.running.load(Ordering::Relaxed),
                    period: c.period_ms.load(Ordering::Relaxed),
                };
                (*name, stats)
            })
            .collect()
    }

    /// Stop every job and wait for them, at most `deadline`; false when one did not stop in time.
    pub async fn stop(&self, deadline: Duration) -> bool {
        self.cancel.cancel();
        self.tracker.close();
        let stopped = tokio::time::timeout(deadline, self.tracker.wait()).await.is_ok();
        info!(jobs = self.counters.read().len(), stopped, "background jobs stopped");
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test(start_paused = true)]
    async fn jobs_run_on_their_period_count_errors_and_stop() {
        let jobs = Jobs::new();
        let runs = Arc::new(AtomicU32::new(0));
        let seen = runs.clone();
        jobs.every("flaky", Duration::from_secs(30), FirstRun::Immediately, move || {
            let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
            async move {
                if n % 2 == 0 {
                    Err(format!("run {n} failed"))
                } else {
                    Ok(())
                }
            }
        });
        jobs.every("later", Duration::from_secs(60), FirstRun::AfterOnePeriod, || async { Ok::<(), String>(()) });
        // Immediately, then at 30, 60 and 90 s.
        tokio::time::sleep(Duration::from_secs(91)).await;
        let stats = jobs.stats();
        assert_eq!(stats["flaky"].execution_count, 4);
        assert_eq!(stats["flaky"].error_count, 2, "errors are counted and the job keeps running");
        assert_eq!(stats["later"].execution_count, 1, "first run one period after the start");
        assert!(!stats["flaky"].is_running);
        assert!(jobs.stop(Duration::from_secs(1)).await);
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 4, "nothing runs after stop");
    }

    #[tokio::test(start_paused = true)]
    async fn stop_interrupts_a_long_run() {
        let jobs = Jobs::new();
        jobs.every("stuck", Duration::from_secs(1), FirstRun::Immediately, || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<(), String>(())
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(jobs.stats()["stuck"].is_running);
        assert!(jobs.stop(Duration::from_secs(1)).await);
    }
}
