//! Request bodies read only once the caller is known. A route takes the body unread (`unread`), authenticates
//! the caller on the request head, and reads the body (`Unread::read`) only then: a stranger with no token is
//! answered at once and holds none of the `max_concurrent_requests` places while it trickles a body in.

use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use warp::Filter;

use super::{McpError, MAX_BODY_BYTES};

type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, warp::Error>> + Send>>;

/// A request body not read yet; dropping it reads nothing.
pub struct Unread(Chunks);

/// The body of a request whose `Content-Length` is at most `MAX_BODY_BYTES` (411 without one, 413 past it),
/// left unread.
pub fn unread() -> impl Filter<Extract = (Unread,), Error = warp::Rejection> + Copy {
    warp::body::content_length_limit(MAX_BODY_BYTES).and(warp::body::stream()).map(wrap)
}

fn wrap<S, B>(chunks: S) -> Unread
where
    S: Stream<Item = Result<B, warp::Error>> + Send + 'static,
    B: Buf,
{
    Unread(Box::pin(chunks.map_ok(|mut chunk| chunk.copy_to_bytes(chunk.remaining()))))
}

impl Unread {
    /// The whole body. Bounded by the `Content-Length` checked in `unread` (hyper reads no further), and again
    /// here; a connection that breaks mid-body is a 400 with the reason.
    pub async fn read(mut self) -> Result<Bytes, McpError> {
        let unreadable = |err: warp::Error| McpError::BadRequest(format!("the request body could not be read: {err}"));
        // Most bodies come in one piece: returned as it is, no copy.
        let Some(first) = self.0.next().await.transpose().map_err(unreadable)? else { return Ok(Bytes::new()) };
        let Some(second) = self.0.next().await.transpose().map_err(unreadable)? else { return Ok(first) };
        let mut whole = BytesMut::with_capacity(first.len() + second.len());
        whole.extend_from_slice(&first);
        whole.extend_from_slice(&second);
        while let Some(chunk) = self.0.next().await.transpose().map_err(unreadable)? {
            if (whole.len() + chunk.len()) as u64 > MAX_BODY_BYTES {
                return Err(McpError::PayloadTooLarge { limit: MAX_BODY_BYTES });
            }
            whole.extend_from_slice(&chunk);
        }
        Ok(whole.freeze())
    }
}
