//! The outbox held to its quotas, in events and on disk: the oldest events dropped past them, with an error log and
//! a throttled `resource.limit.exceeded` event.

use std::time::Duration;

use tracing::{debug, error};

use super::Uploader;
use crate::events::{Event, LimitExceeded, LimitedResource};
use crate::store::StoreError;

/// How often the outbox's bytes on disk are checked against the byte quota.
const BYTE_CHECK_PERIOD: Duration = Duration::from_secs(30);

impl Uploader {
    /// Hold the outbox to its quotas, in events and on disk, the oldest events going first (with an error log and a
    /// throttled `resource.limit.exceeded` event).
    pub(super) async fn enforce_quota(&mut self) -> Result<(), StoreError> {
        // A replica the gate passes over holds the outbox within twice its quotas, in case no replica leads for
        // long (the leader lock cannot be taken, or a vanished leader's session lingers on the server).
        let (quota, quota_bytes) = match (self.prunes)() {
            true => (self.quota, self.quota_bytes),
            false => (self.quota.saturating_mul(2), self.quota_bytes.saturating_mul(2)),
        };
        // Counting walks the outbox; the span of its sequence numbers, two index lookups, can only overstate the
        // count. A backlog drained batch by batch would otherwise be counted whole before each batch.
        let count = match self.outbox.event_seq_span().await? {
            span if span <= quota => span,
            _ => self.outbox.event_count().await?,
        };
        if count > quota {
            let dropped = self.outbox.prune_events(quota).await?;
            self.stats.dropped_over_quota += dropped;
            error!(dropped, quota, "event outbox over its quota: oldest events dropped");
            let message = format!("event outbox over its quota of {quota} events: {dropped} oldest dropped");
            self.report_over_quota(count as u64, quota.max(0) as u64, message).await;
        }
        // Measuring the outbox walks it once over the cheap check: at most every `BYTE_CHECK_PERIOD`, not for each
        // batch of a backlog being drained.
        let due = self.bytes_checked.is_none_or(|at| at.elapsed() >= BYTE_CHECK_PERIOD);
        if due && quota_bytes < u64::MAX {
            self.bytes_checked = Some(std::time::Instant::now());
            let pruned = self.outbox.prune_events_to_bytes(quota_bytes).await?;
            let dropped = pruned.events;
            if dropped > 0 {
                self.stats.dropped_over_quota += dropped;
                let max_mib = quota_bytes / (1024 * 1024);
                error!(dropped, max_mib, "event outbox over its size quota: oldest events dropped");
                let message = format!("event outbox over its quota of {max_mib} MiB on disk: {dropped} oldest dropped");
                self.report_over_quota(pruned.outbox, quota_bytes, message).await;
            }
        }
        // The pages this replica's batches freed, the ones just before included: in managed mode the outbox
        // shrinks only while a backlog drains, and inserts take freed pages first whenever it grows.
        if self.outbox.release_free_pages(u64::MAX).await? > 0 {
            debug!("event outbox: free pages given back to the disk");
        }
        Ok(())
    }

    async fn report_over_quota(&mut self, current_value: u64, limit_value: u64, message: String) {
        if let Some(suppressed) = self.quota_events.allow("outbox", std::time::Instant::now()) {
            let exceeded = LimitExceeded {
                team_id: "*".into(),
                resource_type: LimitedResource::EventOutbox,
                current_value,
                limit_value,
                user_id: None,
                installation_id: None,
                message,
                suppressed_count: suppressed,
            };
            self.emitter.emit(Event::limit_exceeded(&exceeded)).await;
        }
    }
}
