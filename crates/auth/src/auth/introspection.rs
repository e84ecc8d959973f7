//! Client tokens checked by the control plane (BP §10): a positive cache
//! keyed by the token's SHA-256 (never the token), 5 minutes from the
//! successful check, single-flight (concurrent first requests with one token
//! share one introspection call), no negative caching, the audience check of
//! SB §5.5, and invalidation by user (`invalidate_user_token_cache`).
//!
//! Stale if error (issue 73): while the control plane cannot be asked (refused, timed out, 5xx), a token it
//! called active within [`STALE_FOR`] (configurable, 0 disables) keeps working; once a check has failed, an
//! expired entry is served at once and checked again in the background, so an outage costs no request the
//! introspection timeout. A token never seen gets `Refusal::Unavailable` (503 with `Retry-After`, never
//! `invalid_token`): only the control plane's own "inactive" refuses a token.
//!
//! The call itself is a `Introspect` function supplied by the backend client,
//! so this module does no IO of its own and is tested with a counting fake.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use super::principal::{AuthError, Principal};
use crate::config::sha256_hex;
use crate::model::UserId;

#[cfg(test)]
mod tests;

/// Positive results live this long (BP §10).
pub const CACHE_TTL: Duration = Duration::from_secs(5 * 60);

/// How long after its last successful check a token keeps working while the control plane cannot be asked.
pub const STALE_FOR: Duration = Duration::from_secs(60 * 60);

/// What the control plane said about an active token, already mapped to the satellite's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Introspected {
    pub principal: Principal,
    /// `aud` of the response: `None` when absent, else the audiences it names (maybe none).
    pub audience: Option<Vec<String>>,
    pub client_id: Option<String>,
}

/// The outcome of one introspection call.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Active(Introspected),
    /// `active:false`, with the backend's description when it gave one.
    Inactive(Option<String>),
    /// The backend could not be asked (network, non-2xx, garbage): not cached, and never a refusal of the token.
    Unavailable(String),
}

/// Why a token was not taken.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The control plane said no (inactive, expired, another audience).
    Refused(AuthError),
    /// The control plane could not be asked, and the token was not known to be good recently enough.
    Unavailable(String),
}

/// The call to the control plane: token in, verdict out.
pub type Introspect = Arc<dyn Fn(String) -> BoxFuture<'static, Verdict> + Send + Sync>;

type Flight = Shared<BoxFuture<'static, Verdict>>;

struct Entry {
    found: Introspected,
    /// Served without asking until then.
    fresh_until: Instant,
    /// Served while the control plane cannot be asked until then.
    stale_until: Instant,
}

/// What the cache holds for a token.
enum Cached {
    Fresh(Introspected),
    Stale(Introspected),
    None,
}

/// Since when, and why, the control plane could not be asked (its last check failed).
#[derive(Debug, Clone, PartialEq)]
pub struct Outage {
    pub since: Instant,
    pub reason: String,
}

/// The cache in front of the introspection endpoint; cheap to clone.
#[derive(Clone)]
pub struct TokenIntrospection {
    inner: Arc<Inner>,
}

struct Inner {
    introspect: Introspect,
    /// Accepted audiences, without a trailing slash (BP §10).
    audiences: Vec<String>,
    ttl: Duration,
    stale_for: Duration,
    cache: Mutex<HashMap<String, Entry>>,
    /// Checks in flight by token hash, each with the `epoch` it took off in.
    flights: Mutex<HashMap<String, (u64, Flight)>>,
    /// Bumped by every invalidation: a check that took off before one may carry an answer the invalidation
    /// overrides, and is not cached.
    epoch: AtomicU64,
    /// Set by a check that could not reach the control plane, cleared by one that did.
    outage: Mutex<Option<Outage>>,
    calls: AtomicU64,
    /// Lookups answered from the cache, and those that were not (for `/metrics`).
    hits: AtomicU64,
    misses: AtomicU64,
    /// Requests admitted on a stale entry while the control plane could not be asked.
    stale_answers: AtomicU64,
}

impl TokenIntrospection {
    /// `audiences`: what an `aud` may name (`ManagedSettings::accepted_audiences`). Stale entries are served for
    /// [`STALE_FOR`] unless [`TokenIntrospection::stale_for`] says otherwise.
    pub fn new(introspect: Introspect, audiences: Vec<String>, ttl: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                introspect,
                audiences: audiences.into_iter().map(|a| a.trim_end_matches('/').to_owned()).collect(),
                ttl,
                stale_for: STALE_FOR,
                cache: Mutex::new(HashMap::new()),
                flights: Mutex::new(HashMap::new()),
                epoch: AtomicU64::new(0),
                outage: Mutex::new(None),
                calls: AtomicU64::new(0),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                stale_answers: AtomicU64::new(0),
            }),
        }
    }

    /// The same cache serving stale entries for `stale_for` past their last check (`ZERO`: never). Call before the
    /// cache is shared.
    pub fn stale_for(mut self, stale_for: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.stale_for = stale_for;
        }
        self
    }

    /// The principal of an active token, from the cache or one shared introspection call.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.verdict(token).await.map_err(|refusal| match refusal {
            Refusal::Refused(err) => err,
            Refusal::Unavailable(reason) => {
                tracing::warn!(reason = %reason, "token introspection failed for a token not seen recently; answered 503");
                AuthError::Unavailable(reason)
            }
        })
    }

    /// [`TokenIntrospection::authenticate`], telling a token the control plane refused from one it could not be
    /// asked about: a stream is not ended because the backend is briefly unreachable.
    pub async fn verdict(&self, token: &str) -> Result<Principal, Refusal> {
        let key = sha256_hex(token);
        let cached = self.cached(&key);
        match cached {
            Cached::Fresh(found) => {
                self.inner.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(found.principal);
            }
            // The control plane is known to be away: no request waits for it; the entry is checked in the
            // background and replaced (or dropped) when it answers.
            Cached::Stale(found) if self.outage().is_some() => {
                self.inner.stale_answers.fetch_add(1, Ordering::Relaxed);
                drop(self.flight(token, &key));
                return Ok(found.principal);
            }
            _ => {}
        }
        self.inner.misses.fetch_add(1, Ordering::Relaxed);
        match self.flight(token, &key).await {
            Verdict::Active(found) if self.inner.audience_ok(found.audience.as_deref()) => Ok(found.principal),
            Verdict::Active(_) => {
                Err(Refusal::Refused(AuthError::Invalid("Token audience does not include this satellite".into())))
            }
            Verdict::Inactive(description) => Err(Refusal::Refused(AuthError::Invalid(
                description.unwrap_or_else(|| "Token validation failed".into()),
            ))),
            Verdict::Unavailable(reason) => match cached {
                Cached::Stale(found) => {
                    self.inner.stale_answers.fetch_add(1, Ordering::Relaxed);
                    Ok(found.principal)
                }
                _ => Err(Refusal::Unavailable(reason)),
            },
        }
    }

    /// The check of `token` in flight, or a new one.
    fn flight(&self, token: &str, key: &str) -> Flight {
        let mut flights = self.inner.flights.lock();
        // A finished flight may still be listed for a moment; a cache hit covers the common case.
        flights
            .entry(key.to_owned())
            .or_insert_with(|| {
                let epoch = self.inner.epoch.load(Ordering::SeqCst);
                (epoch, self.take_off(token, key, epoch))
            })
            .1
            .clone()
    }

    /// One introspection call, run as a task of its own that lists itself under `key` until it lands and then
    /// records what it learnt ([`Inner::land`]): every caller may give up waiting (a client that hung up, a
    /// request timeout), or never wait (a background check), and the call still ends, updates the cache and
    /// leaves the list.
    fn take_off(&self, token: &str, key: &str, epoch: u64) -> Flight {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let (inner, token, key) = (self.inner.clone(), token.to_owned(), key.to_owned());
        let call = tokio::spawn(async move {
            let verdict = (inner.introspect)(token).await;
            inner.land(&key, epoch, &verdict);
            verdict
        });
        async move { call.await.unwrap_or_else(|err| Verdict::Unavailable(format!("introspection task: {err}"))) }
            .boxed()
            .shared()
    }

    fn cached(&self, key: &str) -> Cached {
        let now = Instant::now();
        let mut cache = self.inner.cache.lock();
        match cache.get(key) {
            Some(entry) if entry.fresh_until > now => Cached::Fresh(entry.found.clone()),
            Some(entry) if entry.stale_until > now => Cached::Stale(entry.found.clone()),
            Some(_) => {
                cache.remove(key);
                Cached::None
            }
            None => Cached::None,
        }
    }

    /// Since when the control plane could not be asked, when its last check failed.
    pub fn outage(&self) -> Option<Outage> {
        self.inner.outage.lock().clone()
    }

    /// Drop every cached token of `user`; returns how many. Checks in flight are not joined by later requests,
    /// and their answers are not cached (which user a token is of is known only once its check lands).
    pub fn invalidate_user(&self, user: &UserId) -> usize {
        let mut cache = self.inner.cache.lock();
        self.inner.epoch.fetch_add(1, Ordering::SeqCst);
        self.inner.flights.lock().clear();
        let before = cache.len();
        cache.retain(|_, entry| &entry.found.principal.user != user);
        before - cache.len()
    }

    /// Remove entries past their stale bound (the 5-minute sweep job); returns how many.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut cache = self.inner.cache.lock();
        let before = cache.len();
        cache.retain(|_, entry| entry.stale_until > now);
        before - cache.len()
    }

    /// Lookups answered from the cache and lookups that were not, so far.
    pub fn cache_counts(&self) -> (u64, u64) {
        (self.inner.hits.load(Ordering::Relaxed), self.inner.misses.load(Ordering::Relaxed))
    }

    /// Requests admitted on a stale entry so far (`satellite_token_stale_answers_total`).
    pub fn stale_answers(&self) -> u64 {
        self.inner.stale_answers.load(Ordering::Relaxed)
    }

    /// Introspection calls made so far.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    pub fn cached_tokens(&self) -> usize {
        self.inner.cache.lock().len()
    }
}

impl Inner {
    /// What a finished check teaches: an active token (of this satellite's audience) is cached unless an
    /// invalidation came while it was asked; an inactive one is dropped; a failed check marks the outage, and
    /// any answer ends it.
    fn land(&self, key: &str, epoch: u64, verdict: &Verdict) {
        let mut cache = self.cache.lock();
        match verdict {
            Verdict::Active(found) => {
                self.outage.lock().take();
                // The user's tokens were invalidated while this check was in flight (the answer may predate a
                // revocation): the request that asked goes ahead, as if it had come a moment earlier, but the
                // next asks again.
                if self.epoch.load(Ordering::SeqCst) == epoch && self.audience_ok(found.audience.as_deref()) {
                    let now = Instant::now();
                    let (fresh_until, stale_until) = (now + self.ttl, now + self.ttl.max(self.stale_for));
                    cache.insert(key.to_owned(), Entry { found: found.clone(), fresh_until, stale_until });
                } else {
                    cache.remove(key);
                }
            }
            Verdict::Inactive(_) => {
                self.outage.lock().take();
                cache.remove(key);
            }
            Verdict::Unavailable(reason) => {
                let mut outage = self.outage.lock();
                if outage.is_none() {
                    tracing::warn!(reason = %reason, "the control plane cannot check tokens; recently checked tokens keep working");
                    *outage = Some(Outage { since: Instant::now(), reason: reason.clone() });
                }
            }
        }
        drop(cache);
        let mut flights = self.flights.lock();
        // Not a newer check of the same token, listed after an invalidation took this one off the list.
        if flights.get(key).is_some_and(|(listed, _)| *listed == epoch) {
            flights.remove(key);
        }
    }

    /// BP §10, SB §5.5, OQ-14: an `aud` that names none of the accepted audiences is refused (an empty one or one
    /// of another shape too); no `aud` is accepted.
    fn audience_ok(&self, audience: Option<&[String]>) -> bool {
        audience.is_none_or(|audience| {
            audience.iter().any(|a| self.audiences.iter().any(|ok| a.trim_end_matches('/') == ok))
        })
    }
}
