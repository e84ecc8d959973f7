//! Requests in flight per caller. `max_concurrent_requests` is one pool for everyone: a caller the satellite admits
//! could otherwise hold all of it (requests that trickle their bodies in for the request timeout, or slow tool
//! calls), and every other member would get 503. Each caller (a user of a team, across `/mcp`, their instance
//! endpoints and `/message`) holds at most `max_concurrent_requests_per_caller` places at once; one more is
//! refused at once with 429 and `Retry-After`, which says whose limit it is. A place is held from the moment the
//! caller is authenticated until the answer starts (an SSE answer, once started, holds none).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub use crate::model::member_key;

/// Places past its limit a caller may hold for bodies that hold no request.
pub const SPARE: usize = 4;
/// The largest body a spare place is taken for.
pub const SPARE_BODY_BYTES: u64 = 4096;

/// The two limits of every caller: requests in flight, and long-lived streams open.
#[derive(Clone)]
pub struct Places {
    /// Requests in flight per caller (`max_concurrent_requests_per_caller`).
    pub requests: CallerLimits,
    /// Long-lived streams open per caller (`max_streams_per_caller`): session GET streams, legacy SSE streams and
    /// `subscriptions/listen`, each holding its place for as long as it is open.
    pub streams: CallerLimits,
}

/// The places of every caller; cheap to clone.
#[derive(Clone)]
pub struct CallerLimits {
    inner: Arc<Inner>,
}

struct Inner {
    max: usize,
    /// Places held, by caller; a caller with none is not listed.
    held: Mutex<HashMap<Arc<str>, usize>>,
}

/// One place of a caller, given back when dropped.
pub struct Place {
    inner: Arc<Inner>,
    caller: Arc<str>,
}

impl CallerLimits {
    pub fn new(max: usize) -> Self {
        Self { inner: Arc::new(Inner { max: max.max(1), held: Mutex::new(HashMap::new()) }) }
    }

    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// A place for `caller`, or `None` when it holds all of its own already.
    pub fn take(&self, caller: Arc<str>) -> Option<Place> {
        self.take_of(caller, self.inner.max)
    }

    /// At its limit, one of [`SPARE`] more places a caller may hold, for a small body that turns out to hold no
    /// request (a cancellation, an answer to a server's question): the caller checks what the body held.
    pub fn take_spare(&self, caller: &str) -> Option<Place> {
        self.take_of(format!("spare\u{0}{caller}").into(), SPARE)
    }

    fn take_of(&self, caller: Arc<str>, max: usize) -> Option<Place> {
        let mut held = self.inner.held.lock();
        match held.get_mut(&caller) {
            Some(n) if *n >= max => return None,
            Some(n) => *n += 1,
            None => {
                held.insert(caller.clone(), 1);
            }
        }
        drop(held);
        Some(Place { inner: self.inner.clone(), caller })
    }

    /// A place for `caller`, or at its limit a spare one for a body whose declared length (`content_length`) is
    /// at most [`SPARE_BODY_BYTES`]: what that body holds must then be no request ([`Admitted::admits`]). `None`
    /// when it gets neither.
    /// `caller` is a [`member_key`], shared: an instance makes its member's once (`Instance::member_key`).
    pub fn admit(&self, caller: Arc<str>, content_length: Option<&str>) -> Option<Admitted> {
        let spare = match self.take(caller.clone()) {
            Some(place) => return Some(Admitted { _place: place, spare: false }),
            None => {
                let small =
                    content_length.and_then(|n| n.trim().parse::<u64>().ok()).is_some_and(|n| n <= SPARE_BODY_BYTES);
                small.then(|| self.take_spare(&caller)).flatten()?
            }
        };
        Some(Admitted { _place: spare, spare: true })
    }

    /// Places `caller` holds now.
    pub fn held(&self, caller: &str) -> usize {
        self.inner.held.lock().get(caller).copied().unwrap_or(0)
    }
}

/// A request's place, held until its answer starts.
pub struct Admitted {
    _place: Place,
    /// Taken past the caller's limit, for a body that must hold no request.
    spare: bool,
}

impl Admitted {
    /// Whether the body read holds what this place was taken for: anything on an ordinary place; on a spare one,
    /// no request (a cancellation, an answer to a server's question, another notification).
    pub fn admits(&self, messages: &[serde_json::Value]) -> bool {
        let request = |m: &serde_json::Value| m.get("method").is_some() && m.get("id").is_some_and(|id| !id.is_null());
        !self.spare || !messages.iter().any(request)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.inner.held.lock();
        if let Some(n) = held.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_holds_at_most_its_own_places_and_gets_them_back() {
        let limits = CallerLimits::new(2);
        let take = |caller: &str| limits.take(caller.into());
        let (a, b) = (take("alice").unwrap(), take("alice").unwrap());
        assert!(take("alice").is_none(), "a third place is refused");
        let bob = take("bob").expect("another caller is not held back");
        drop(a);
        assert_eq!(limits.held("alice"), 1);
        let spares: Vec<_> = (0..SPARE).map(|_| limits.take_spare("alice").expect("a spare place")).collect();
        assert!(limits.take_spare("alice").is_none(), "spare places are few");
        drop(spares);
        let c = take("alice").expect("a place given back is taken again");
        drop((b, c, bob));
        assert_eq!((limits.held("alice"), limits.held("bob")), (0, 0));
        assert!(limits.inner.held.lock().is_empty(), "callers holding nothing are not kept");
    }

    /// At its limit a caller is still admitted for a small body, which must hold no request: a cancellation or
    /// an answer to a server's question gets through, a request, a large body or one of unknown length does not.
    #[test]
    fn at_its_limit_a_caller_is_admitted_only_for_a_small_body_holding_no_request() {
        let limits = CallerLimits::new(1);
        let first = limits.admit("alice".into(), None).expect("a place");
        assert!(first.admits(&[serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call"})]));
        assert!(limits.admit("alice".into(), None).is_none(), "no length: no spare place");
        assert!(limits.admit("alice".into(), Some("5000")).is_none(), "too large for a spare place");
        let spare = limits.admit("alice".into(), Some(" 120 ")).expect("a spare place");
        let cancel = serde_json::json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}});
        let answer = serde_json::json!({"jsonrpc":"2.0","id":"satellite-1","result":{}});
        assert!(spare.admits(&[cancel.clone(), answer]));
        let request = serde_json::json!({"jsonrpc":"2.0","id":2,"method":"ping"});
        assert!(!spare.admits(&[cancel, request]), "a request on a spare place is refused");
        drop((first, spare));
        assert!(limits.inner.held.lock().is_empty(), "callers holding nothing are not kept");
    }
}
