//! What a remote server sends, read within bounds. A server that answers with an endless body, or with one SSE
//! event that never ends, is cut off with an error instead of being held in memory until the satellite (and every
//! team on it) runs out. The bound on one message is the stdio transport's bound on one line.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

/// The largest message (one JSON body, one SSE event) read from a remote server.
pub(crate) const MAX_MESSAGE_BYTES: usize = super::stdio::MAX_LINE_BYTES;

/// How much of an error answer's body is read: enough for a JSON-RPC error object, and for the preview.
pub(crate) const ERROR_BODY_BYTES: usize = 64 * 1024;

/// Why a body stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("{0}")]
    Read(reqwest::Error),
    #[error("a message longer than {0} bytes")]
    TooLarge(usize),
}

/// At most `max` bytes of `response`'s body, as text: what an error answer says, without reading an endless one
/// to its end.
pub(crate) async fn head(response: reqwest::Response, max: usize) -> String {
    let mut body = response.bytes_stream();
    let mut kept: Vec<u8> = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        let room = max - kept.len();
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if kept.len() >= max {
            break;
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// The SSE events of `response`, each at most `max` bytes: the bytes read since the last event came out are
/// counted, so an event that never ends is an error once it passes `max`.
pub(crate) struct Events {
    inner: BoxStream<'static, Result<Event, EventStreamError<BodyError>>>,
    unparsed: Arc<AtomicUsize>,
}

impl Events {
    pub(crate) fn of(response: reqwest::Response, max: usize) -> Self {
        let unparsed = Arc::new(AtomicUsize::new(0));
        let counter = unparsed.clone();
        let bytes = response.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(BodyError::Read)?;
            if counter.fetch_add(chunk.len(), Ordering::Relaxed) + chunk.len() > max {
                return Err(BodyError::TooLarge(max));
            }
            Ok(chunk)
        });
        Self { inner: bytes.eventsource().boxed(), unparsed }
    }
}

impl Stream for Events {
    type Item = Result<Event, EventStreamError<BodyError>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(Some(Ok(_))) = &next {
            self.unparsed.store(0, Ordering::Relaxed);
        }
        next
    }
}
