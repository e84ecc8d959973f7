//! The satellite's periodic upkeep, as named jobs (`/status` lists them): client activity events, releasing the
//! idle token encoder, session expiry, idle instances made dormant, scheduled rediscovery, and retention of the
//! standalone event history and analytics rows.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info};

use crate::activity::ActivityTracker;
use crate::config::Config;
use crate::events::{self, Emitter};
use crate::http::session::{self, SessionTable, SESSION_IDLE};
use crate::http::sse::{SseSessions, SSE_IDLE};
use crate::instances::InstanceManager;
use crate::jobs::{FirstRun, Jobs};
use crate::store::{AnalyticsRows, LimitUsage, Outbox, Store, StoreError, Volume};

/// Idle sessions are forgotten on this period (OQ-18).
const SESSION_SWEEP_PERIOD: Duration = Duration::from_secs(60);
/// How often the data volume's free space is checked against the disk reserve.
const DISK_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// Standalone event history is trimmed by age (and analytics rows) on this period.
const EVENT_RETENTION_PERIOD: Duration = Duration::from_secs(3600);
/// Standalone event history is held to its count on this period: a busy satellite writes a row per call, tens
/// of thousands a second, so an hourly trim let the history outgrow its bound by orders of magnitude (and the disk
/// with it). One trim walks the newest `event_retention_max` rows of the primary key: milliseconds.
const EVENT_CAP_PERIOD: Duration = Duration::from_secs(10);
/// Standalone event history is held to its bytes on disk on this period.
const EVENT_SIZE_PERIOD: Duration = Duration::from_secs(30);
/// The token encoder is released once no tools were counted for this long, checked this often.
const ENCODER_IDLE: Duration = Duration::from_secs(60);
const ENCODER_CHECK_PERIOD: Duration = Duration::from_secs(20);
/// How often instances with `rediscover_seconds` are checked for a catalog older than that.
const REDISCOVERY_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How often events the outbox refused are tried again.
const UNWRITTEN_RETRY_PERIOD: Duration = Duration::from_secs(5);
/// How often what removed instances left behind is checked for deletion.
const REMOVAL_CHECK_PERIOD: Duration = Duration::from_secs(60);

/// What the upkeep jobs work on.
pub(super) struct Maintenance<'a> {
    pub jobs: &'a Jobs,
    pub config: &'a Config,
    pub manager: &'a InstanceManager,
    pub store: &'a Store,
    pub events: &'a Emitter,
    pub activity: Arc<ActivityTracker>,
    /// The `/mcp` and instance-router session tables.
    pub sessions: [Arc<SessionTable>; 2],
    pub sse_sessions: Arc<SseSessions>,
}

/// Register every upkeep job on `jobs`.
pub(super) fn schedule(m: Maintenance<'_>) {
    let Maintenance { jobs, config, manager, store, events: emitter, activity, sessions, sse_sessions } = m;
    client_activity(jobs, config.activity_interval, emitter.clone(), activity);
    token_encoder_release(jobs);
    // A session on an instance's own endpoint subscribed to its resources keeps that instance awake.
    let subscribers = sessions[1].clone();
    session_expiry(jobs, sessions, sse_sessions);
    // Room made on demand for a start over the process cap spares the same instances the idle sweep spares.
    let awake = subscribers.clone();
    manager.keep_awake(Arc::new(move |instance: &crate::instances::Instance| {
        awake.has_subscriptions(&session::instance_owner(&instance.spec().process_id))
    }));
    if config.upstream.lifecycle.idle_timeout.is_some() {
        idle_process_cleanup(jobs, config.upstream.lifecycle.idle_check_interval, manager, subscribers);
    }
    periodic_rediscovery(jobs, manager);
    unwritten_events(jobs, emitter);
    removed_cleanup(jobs, manager);
    // The local event history of a standalone satellite has no one to ship it to: it is kept by age and count.
    // In managed mode the outbox is the queue to the backend, bounded by the uploader's quota, never pruned here.
    let standalone = !matches!(config.mode, crate::config::Mode::Managed(_));
    // The disk reserve (SQLite): given back when the data volume fills, made again when it has room.
    let volume = store.volume();
    if volume.reserve().is_some() {
        disk_reserve(jobs, volume);
    }
    let outbox = store.outbox();
    if standalone {
        event_history_cap(jobs, &outbox, config.event_retention_max);
        event_history_size(jobs, &outbox, config.event_retention_max_bytes);
    }
    event_retention(
        jobs,
        &outbox,
        &store.analytics_rows(),
        standalone.then_some(config.event_retention),
        config.analytics_retention,
    );
    quota_retention(jobs, store.limit_usage());
}

/// Quota counters of periods that are over (`[[limits]]`: days and months before the current ones) forgotten,
/// hourly; on PostgreSQL each replica's round finds what another's left.
fn quota_retention(jobs: &Jobs, usage: LimitUsage) {
    jobs.every("quota-retention", Duration::from_secs(3600), FirstRun::AfterOnePeriod, move || {
        let usage = usage.clone();
        async move {
            let now = chrono::Utc::now();
            let forgotten = usage.forget_before(&now.format("%Y-%m-%d").to_string()).await?
                + usage.forget_before(&now.format("%Y-%m").to_string()).await?;
            if forgotten > 0 {
                debug!(forgotten, "quota counters of past periods forgotten");
            }
            Ok::<(), StoreError>(())
        }
    });
}

/// Client activity events, from what `tracked` gathered since the last round.
fn client_activity(jobs: &Jobs, period: Duration, activity_events: Emitter, tracked: Arc<ActivityTracker>) {
    jobs.every("client-activity", period, FirstRun::Immediately, move || {
        let (records, emitter) = (tracked.take(), activity_events.clone());
        async move {
            for record in &records {
                emitter.emit(events::Event::client_activity(record)).await;
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
}

/// The token encoder is most of an idle satellite's memory: let it go when no tools were counted lately.
fn token_encoder_release(jobs: &Jobs) {
    jobs.every("token-encoder-release", ENCODER_CHECK_PERIOD, FirstRun::AfterOnePeriod, || async {
        tokio::task::spawn_blocking(|| crate::tokens::release_idle(ENCODER_IDLE)).await.map(|_| ())
    });
}

/// Idle `/mcp`, instance-router and SSE sessions forgotten.
fn session_expiry(jobs: &Jobs, sessions: [Arc<SessionTable>; 2], sse_sessions: Arc<SseSessions>) {
    jobs.every("session-expiry", SESSION_SWEEP_PERIOD, FirstRun::AfterOnePeriod, move || {
        let swept: usize = sessions.iter().map(|t| t.sweep(SESSION_IDLE)).sum::<usize>() + sse_sessions.sweep(SSE_IDLE);
        if swept > 0 {
            info!(swept, "idle mcp sessions expired");
        }
        std::future::ready(Ok::<(), std::convert::Infallible>(()))
    });
}

/// Idle instances made dormant, but for those a session is subscribed to (`subscribers`).
fn idle_process_cleanup(jobs: &Jobs, period: Duration, manager: &InstanceManager, subscribers: Arc<SessionTable>) {
    let idle_manager = manager.clone();
    jobs.every("idle-process-cleanup", period, FirstRun::Immediately, move || {
        let (manager, subscribers) = (idle_manager.clone(), subscribers.clone());
        async move {
            let subscribed = |instance: &crate::instances::Instance| {
                subscribers.has_subscriptions(&session::instance_owner(&instance.spec().process_id))
            };
            let slept = manager.sweep_idle(subscribed).await;
            if slept > 0 {
                info!(slept, "idle instances made dormant");
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
}

/// Servers that change their tools without announcing it, rediscovered as often as their config asks.
fn periodic_rediscovery(jobs: &Jobs, manager: &InstanceManager) {
    let stale_manager = manager.clone();
    jobs.every("periodic-rediscovery", REDISCOVERY_CHECK_PERIOD, FirstRun::AfterOnePeriod, move || {
        let manager = stale_manager.clone();
        async move {
            let refreshed = manager.rediscover_stale().await;
            if refreshed > 0 {
                tracing::debug!(refreshed, "instances discovered again on their schedule");
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
}

/// Events the outbox refused (a full disk, a lock held too long), written once it takes them again.
fn unwritten_events(jobs: &Jobs, emitter: &Emitter) {
    let unwritten = emitter.clone();
    jobs.every("unwritten-events", UNWRITTEN_RETRY_PERIOD, FirstRun::AfterOnePeriod, move || {
        let emitter = unwritten.clone();
        async move {
            if emitter.unwritten() > 0 {
                let waiting = emitter.retry_unwritten().await;
                tracing::info!(waiting, left = emitter.unwritten(), "events the outbox refused, tried again");
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
}

/// What removed instances and installations left (stored catalogs, drift holds), deleted once they stayed
/// away for `REMOVAL_GRACE`.
fn removed_cleanup(jobs: &Jobs, manager: &InstanceManager) {
    let removal_manager = manager.clone();
    jobs.every("removed-cleanup", REMOVAL_CHECK_PERIOD, FirstRun::AfterOnePeriod, move || {
        let manager = removal_manager.clone();
        async move {
            let purged = manager.purge_removed(crate::instances::REMOVAL_GRACE).await;
            if purged > 0 {
                tracing::info!(purged, "deleted what removed instances and installations left behind");
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
}

/// The disk reserve checked against the data volume's free space.
fn disk_reserve(jobs: &Jobs, volume: Volume) {
    jobs.every("disk-reserve", DISK_CHECK_PERIOD, FirstRun::AfterOnePeriod, move || {
        let volume = volume.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                if let Some(reserve) = volume.reserve() {
                    reserve.check();
                }
            })
            .await
        }
    });
}

/// The standalone event history held to its count, `events_max`.
fn event_history_cap(jobs: &Jobs, outbox: &Outbox, events_max: u64) {
    let cap_outbox = outbox.clone();
    jobs.every("event-history-cap", EVENT_CAP_PERIOD, FirstRun::Immediately, move || {
        let outbox = cap_outbox.clone();
        async move {
            let free = outbox.disk_usage().await?.free;
            let pruned = outbox.prune_events(i64::try_from(events_max).unwrap_or(i64::MAX)).await?;
            if pruned > 0 {
                debug!(pruned, kept_max = events_max, "the standalone history held to its count");
            }
            release_free_pages(&outbox, free).await
        }
    });
}

/// The standalone event history held to its bytes on disk, `events_max_bytes`. A request log carries a call's
/// arguments and answer: a few big answers outweigh thousands of small events, so the count alone bounds no disk.
/// Measuring the outbox walks its pages: every 30 s, not 10.
fn event_history_size(jobs: &Jobs, outbox: &Outbox, events_max_bytes: u64) {
    let size_outbox = outbox.clone();
    jobs.every("event-history-size", EVENT_SIZE_PERIOD, FirstRun::Immediately, move || {
        let outbox = size_outbox.clone();
        async move {
            let free = outbox.disk_usage().await?.free;
            let pruned = outbox.prune_events_to_bytes(events_max_bytes).await?.events;
            if pruned > 0 {
                info!(
                    pruned,
                    max_mib = events_max_bytes / (1024 * 1024),
                    "the standalone history held to its size: oldest events pruned"
                );
            }
            release_free_pages(&outbox, free).await
        }
    });
}

/// Event history older than `events_kept` (standalone only: `None` in managed mode) and analytics rows older
/// than `analytics_kept` pruned.
fn event_retention(
    jobs: &Jobs,
    outbox: &Outbox,
    analytics: &AnalyticsRows,
    events_kept: Option<Duration>,
    analytics_kept: Duration,
) {
    let (retention_outbox, retention_analytics) = (outbox.clone(), analytics.clone());
    jobs.every("event-retention", EVENT_RETENTION_PERIOD, FirstRun::Immediately, move || {
        let (outbox, analytics) = (retention_outbox.clone(), retention_analytics.clone());
        async move {
            let free = outbox.disk_usage().await?.free;
            if let Some(events_kept) = events_kept {
                let pruned = match before(events_kept) {
                    Some(cutoff) => outbox.prune_events_before(&cutoff).await?,
                    None => 0,
                };
                if pruned > 0 {
                    info!(
                        pruned,
                        kept_days = events_kept.as_secs() / 86_400,
                        "old events pruned from the standalone history"
                    );
                }
            }
            let pruned = match before(analytics_kept) {
                Some(cutoff) => analytics.prune_analytics(&cutoff).await?,
                None => 0,
            };
            if pruned > 0 {
                info!(pruned, kept_days = analytics_kept.as_secs() / 86_400, "old analytics rows pruned");
            }
            release_free_pages(&outbox, free).await
        }
    });
}

/// Give back to the disk the SQLite file's pages that were free before this round pruned (`free`), so stayed
/// free since an earlier one (`Outbox::release_free_pages`): what a round frees, the inserts of the next seconds
/// take again on a busy satellite, and a later round gives back what they did not take.
async fn release_free_pages(outbox: &Outbox, free: u64) -> Result<(), StoreError> {
    let released = outbox.release_free_pages(free).await?;
    if released > 0 {
        debug!(released, "database: free pages given back to the disk");
    }
    Ok(())
}

/// The ISO time `kept` ago; `None` for a retention too long to subtract from now (which keeps everything).
fn before(kept: Duration) -> Option<String> {
    let kept = chrono::Duration::from_std(kept).ok()?;
    chrono::Utc::now().checked_sub_signed(kept).map(crate::model::iso)
}
