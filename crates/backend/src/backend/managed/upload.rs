//! The event uploader loop (BP §8.3): the `Uploader` policy over the backend client, every tick.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::client::{BackendClient, BackendError, Refusal};
use crate::backend::monitor::{Channel, Role};
use crate::backend::uploader::{BatchOutcome, SendBatch, Uploader};
use crate::backend::wire::{self, EventEnvelope, EventsRequest};

use super::{Managed, ManagedDeps};

impl Managed {
    /// The uploader over this client.
    /// The uploader, claiming batches as this replica (`replica_id`) for `lease`.
    pub fn uploader(deps: &ManagedDeps, quota: i64, lease: Duration) -> Uploader {
        let (client, monitor) = (deps.client.clone(), deps.monitor.clone());
        let send: SendBatch = Arc::new(move |events: Vec<EventEnvelope>, timeout: Duration| {
            let (client, monitor) = (client.clone(), monitor.clone());
            Box::pin(async move {
                let outcome = send_events(&client, events, timeout).await;
                let recorded = match &outcome {
                    BatchOutcome::Accepted { .. } => Ok(()),
                    other => Err(format!("{other:?}")),
                };
                monitor.record(Channel::Events, recorded);
                outcome
            })
        });
        let role = deps.monitor.clone();
        Uploader::new(deps.outbox.clone(), deps.events.clone(), send, wire::MAX_EVENT_BATCH, quota)
            .with_prune_gate(Arc::new(move || role.role() != Role::Follower))
            .with_lease(lease)
            .with_owner(deps.replica_id.clone())
    }
}

async fn send_events(client: &BackendClient, envelopes: Vec<EventEnvelope>, timeout: Duration) -> BatchOutcome {
    let request = match EventsRequest::batch(envelopes) {
        Ok(request) => request,
        Err(err) => return BatchOutcome::Invalid(format!("batch of {} events refused locally", err.0)),
    };
    match client.post_events(&request, timeout).await {
        Ok(answer) => BatchOutcome::Accepted {
            failures: answer.failures.iter().map(|f| format!("#{} {}: {}", f.index, f.event_type, f.error)).collect(),
        },
        Err(err) => batch_outcome(err),
    }
}

/// BP §8.3: what a refused batch means for the events in it.
fn batch_outcome(err: BackendError) -> BatchOutcome {
    match err {
        BackendError::Status { refusal: Refusal::Invalid, .. } => BatchOutcome::Invalid(err.to_string()),
        BackendError::Status { refusal: Refusal::Unauthorized, .. } => BatchOutcome::Unauthorized,
        BackendError::Status { refusal: Refusal::RateLimited, retry_after, .. } => {
            BatchOutcome::RateLimited(retry_after)
        }
        BackendError::Status { retry_after: Some(retry_after), .. } => {
            BatchOutcome::Unavailable { reason: err.to_string(), retry_after }
        }
        BackendError::Status { refusal: Refusal::TooLarge, .. } => BatchOutcome::TooLarge(err.to_string()),
        BackendError::Timeout { .. } => BatchOutcome::TimedOut(err.to_string()),
        BackendError::Status { .. }
        | BackendError::Network { .. }
        | BackendError::Decode { .. }
        | BackendError::NotRegistered { .. } => BatchOutcome::Failed(err.to_string()),
    }
}

/// Run the uploader every `tick` (plus any 429 backoff or `Retry-After`) until cancelled, then flush within `flush_deadline`.
pub async fn upload_loop(mut uploader: Uploader, tick: Duration, flush_deadline: Duration, cancel: CancellationToken) {
    loop {
        let wait = tick + uploader.backoff().unwrap_or_default();
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        // Drain what is there now, one batch in flight at a time.
        loop {
            match uploader.tick().await {
                Ok(tick) if tick.reads_on() && !cancel.is_cancelled() => continue,
                Ok(_) => break,
                Err(err) => {
                    warn!(error = %err, "reading the event outbox failed");
                    break;
                }
            }
        }
    }
    match uploader.flush(flush_deadline).await {
        Ok(left) => info!(left, sent = uploader.stats().sent, "event uploader stopped"),
        Err(err) => warn!(error = %err, "flushing events at shutdown failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, error: &str) -> BackendError {
        let body = wire::BackendError::new(error);
        BackendError::Status {
            endpoint: "events",
            status,
            refusal: Refusal::of(status, Some(&body)),
            message: "whatever the satellite wrote".into(),
            body: Some(Box::new(body)),
            retry_after: None,
        }
    }

    /// BP §8.3: the batch outcome follows the status and the backend's own error text, never our message.
    #[test]
    fn refused_batches_are_classified_by_the_backends_answer() {
        assert!(matches!(batch_outcome(refused(400, "bad envelope")), BatchOutcome::Invalid(_)));
        assert!(matches!(batch_outcome(refused(500, "Validation failed: /events/0")), BatchOutcome::Invalid(_)));
        assert_eq!(batch_outcome(refused(401, "no")), BatchOutcome::Unauthorized);
        assert_eq!(batch_outcome(refused(503, "Unauthorized")), BatchOutcome::Unauthorized);
        assert_eq!(batch_outcome(refused(429, "slow down")), BatchOutcome::RateLimited(None));
        assert_eq!(batch_outcome(refused(500, "Rate limit exceeded")), BatchOutcome::RateLimited(None));
        assert!(matches!(batch_outcome(refused(413, "Payload Too Large")), BatchOutcome::TooLarge(_)));
        assert!(matches!(batch_outcome(refused(500, "database down")), BatchOutcome::Failed(_)));
        let network =
            BackendError::Network { endpoint: "events", reason: "validation of the TLS certificate failed".into() };
        assert!(matches!(batch_outcome(network), BatchOutcome::Failed(_)), "only the backend's own answer is read");
    }
}
