//! What one client connection has in flight, so the accept loop (`stack`) can close a connection that has been
//! idle for the header timeout: each request counts until its answer's body has been sent whole or given up.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one connection has in flight: requests whose answer has not ended, and when the last one ended (or the
/// connection began).
pub(super) struct Activity {
    open: std::sync::atomic::AtomicUsize,
    /// A whole request has come on the connection.
    pub(super) seen: std::sync::atomic::AtomicBool,
    began: Instant,
    /// Milliseconds after `began` when the connection last had nothing in flight.
    quiet_since: std::sync::atomic::AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            open: std::sync::atomic::AtomicUsize::new(0),
            seen: std::sync::atomic::AtomicBool::new(false),
            began: Instant::now(),
            quiet_since: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The connection is quiet from now (its first byte came: the header timeout runs from there).
    pub(super) fn quiet_now(&self) {
        let now = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.quiet_since.store(now, std::sync::atomic::Ordering::Release);
    }

    /// Resolves once the connection has had nothing in flight for `limit`.
    pub(super) async fn idle_for(&self, limit: Duration) {
        use std::sync::atomic::Ordering;
        loop {
            let wait = if self.open.load(Ordering::Acquire) > 0 {
                limit
            } else {
                let quiet = Duration::from_millis(self.quiet_since.load(Ordering::Acquire));
                match limit.checked_sub(self.began.elapsed().saturating_sub(quiet)) {
                    Some(left) if !left.is_zero() => left,
                    _ => return,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// One request of a connection in flight, until dropped with its answer.
pub(super) struct Busy(Arc<Activity>);

impl Busy {
    pub(super) fn new(activity: &Arc<Activity>) -> Self {
        activity.open.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        activity.seen.store(true, std::sync::atomic::Ordering::Release);
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let at = u64::try_from(self.0.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.quiet_since.store(at, Ordering::Release);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body, counted as activity of its connection until it has been sent whole or given up.
pub(super) struct Tracked<B> {
    pub(super) body: B,
    pub(super) _busy: Busy,
    /// A stream's request span, entered while its body is polled (`is_stream`).
    pub(super) span: Option<tracing::Span>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let _entered = this.span.as_ref().map(tracing::Span::enter);
        std::pin::Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
