//! A request body must arrive whole within the body-read timeout once the satellite waits for it: a body that
//! never finishes (a `Content-Length` promising more than comes, a chunked body that stops) is answered 408 with
//! `Connection: close` then, rather than 504 at the request timeout, its place and connection held all that while.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;
use warp::http::{HeaderValue, Version};
use warp::reply::Response;

use super::McpError;

/// A request body read under a deadline. The clock starts at the first read that has to wait (a body that is
/// there already costs no timer), and a body still unfinished at the deadline ends in an error; a handler that
/// never reads its body (a stranger refused on the head) is never timed.
pub struct Timed<B> {
    body: B,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl<B> Timed<B> {
    pub fn new(body: B, timeout: Duration) -> Self {
        Self { body, timeout, deadline: None, expired: false }
    }
}

/// The body of a request did not arrive within the body-read timeout.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within the body-read timeout")
    }
}

impl std::error::Error for BodyTimedOut {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for Timed<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.expired = true;
                let _ = EXPIRED.try_with(|expired| expired.set(true));
                Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

tokio::task_local! {
    /// Set when the body of the request being answered ran out of time.
    static EXPIRED: Cell<bool>;
}

/// Answer a request (the future `answering`), and say whether its body ran out of time meanwhile: whatever the
/// route made of the failed read (a 400, a rejection), the answer is then 408.
pub async fn watching<F: Future>(answering: F) -> (F::Output, bool) {
    EXPIRED
        .scope(Cell::new(false), async {
            let answered = answering.await;
            (answered, EXPIRED.try_with(Cell::get).unwrap_or(false))
        })
        .await
}

/// 408 with a JSON-RPC error that says why; over HTTP/1 with `Connection: close` (RFC 9110 §15.5.9), since the rest
/// of the body may still come, and what follows it on the connection could not be told from it. HTTP/2 has no
/// connection header: its stream is reset instead.
pub fn timed_out(version: Version, timeout: Duration) -> Response {
    let mut response = McpError::RequestTimeout { seconds: timeout.as_secs() }
        .into_response(&super::oauth::ResourceUrls { public_url: String::new() });
    if version < Version::HTTP_2 {
        response.headers_mut().insert(warp::http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body whose sender stalls ends in an error at the deadline, and the request is marked timed out; a body
    /// that is all there is read whole, with no timer.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out_and_a_whole_one_does_not() {
        use futures::StreamExt;
        let half = Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from_static(b"{\"jsonrpc\"")));
        let stalled = http_body_util::StreamBody::new(futures::stream::iter([half]).chain(futures::stream::pending()));
        let timed = Timed::new(stalled, Duration::from_secs(2));
        let (read, expired) = watching(timed.collect()).await;
        assert!(read.is_err_and(|err| err.is::<BodyTimedOut>()), "the read fails");
        assert!(expired);

        let whole = Timed::new(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")), Duration::from_secs(2));
        let (read, expired) = watching(whole.collect()).await;
        assert_eq!(read.expect("read").to_bytes(), "{}");
        assert!(!expired);
    }

    #[test]
    fn the_answer_is_408_and_closes_an_http1_connection() {
        let answer = timed_out(Version::HTTP_11, Duration::from_secs(30));
        assert_eq!(answer.status(), warp::http::StatusCode::REQUEST_TIMEOUT);
        assert_eq!(answer.headers()["connection"], "close");
        assert!(timed_out(Version::HTTP_2, Duration::from_secs(30)).headers().get("connection").is_none());
    }
}
