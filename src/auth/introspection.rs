//! Client tokens checked by the control plane (BP §10): a positive cache
//! keyed by the token's SHA-256 (never the token), 5 minutes from the
//! successful check, single-flight (concurrent first requests with one token
//! share one introspection call), no negative caching, the audience check of
//! SB §5.5, and invalidation by user (`invalidate_user_token_cache`).
//!
//! The call itself is a `Introspect` function supplied by the backend client,
//! so this module does no IO of its own and is tested with a counting fake.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use super::principal::{AuthError, Principal};
use crate::config::sha256_hex;
use crate::model::UserId;

/// Positive results live this long (BP §10).
pub const CACHE_TTL: Duration = Duration::from_secs(5 * 60);

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
    /// The backend could not be asked (network, non-2xx, garbage): invalid for this request, not cached.
    Unavailable(String),
}

/// Why a token was not taken.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The control plane said no (inactive, expired, another audience).
    Refused(AuthError),
    /// The control plane could not be asked.
    Unavailable(String),
}

/// The call to the control plane: token in, verdict out.
pub type Introspect = Arc<dyn Fn(String) -> BoxFuture<'static, Verdict> + Send + Sync>;

type Flight = Shared<BoxFuture<'static, Verdict>>;

struct Entry {
    found: Introspected,
    expires: Instant,
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
    cache: Mutex<HashMap<String, Entry>>,
    /// Checks in flight by token hash, each with the `epoch` it took off in.
    flights: Mutex<HashMap<String, (u64, Flight)>>,
    /// Bumped by every invalidation: a check that took off before one may carry an answer the invalidation
    /// overrides, and is not cached.
    epoch: std::sync::atomic::AtomicU64,
    calls: std::sync::atomic::AtomicU64,
    /// Lookups answered from the cache, and those that were not (for `/metrics`).
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

impl TokenIntrospection {
    /// `audiences`: what an `aud` may name (`ManagedSettings::accepted_audiences`).
    pub fn new(introspect: Introspect, audiences: Vec<String>, ttl: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                introspect,
                audiences: audiences.into_iter().map(|a| a.trim_end_matches('/').to_owned()).collect(),
                ttl,
                cache: Mutex::new(HashMap::new()),
                flights: Mutex::new(HashMap::new()),
                epoch: std::sync::atomic::AtomicU64::new(0),
                calls: std::sync::atomic::AtomicU64::new(0),
                hits: std::sync::atomic::AtomicU64::new(0),
                misses: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The principal of an active token, from the cache or one shared introspection call.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.verdict(token).await.map_err(|refusal| match refusal {
            Refusal::Refused(err) => err,
            Refusal::Unavailable(reason) => {
                tracing::warn!(reason = %reason, "token introspection failed; the request is refused");
                AuthError::Invalid("Token validation failed".into())
            }
        })
    }

    /// [`TokenIntrospection::authenticate`], telling a token the control plane refused from one it could not be
    /// asked about: a stream is not ended because the backend is briefly unreachable.
    pub async fn verdict(&self, token: &str) -> Result<Principal, Refusal> {
        let key = sha256_hex(token);
        if let Some(found) = self.cached(&key) {
            self.inner.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(found.principal);
        }
        self.inner.misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (epoch, flight) = {
            let mut flights = self.inner.flights.lock();
            // A finished flight may still be listed for a moment; a cache hit above covers the common case.
            flights
                .entry(key.clone())
                .or_insert_with(|| {
                    let epoch = self.inner.epoch.load(std::sync::atomic::Ordering::SeqCst);
                    (epoch, self.take_off(token, &key, epoch))
                })
                .clone()
        };
        match flight.await {
            Verdict::Active(found) => {
                if !self.audience_ok(found.audience.as_deref()) {
                    return Err(Refusal::Refused(AuthError::Invalid(
                        "Token audience does not include this satellite".into(),
                    )));
                }
                let expires = Instant::now() + self.inner.ttl;
                let mut cache = self.inner.cache.lock();
                // The user's tokens were invalidated while this check was in flight (the answer may predate a
                // revocation): this request goes ahead, as if it had come a moment earlier, but the next asks again.
                if self.inner.epoch.load(std::sync::atomic::Ordering::SeqCst) == epoch {
                    cache.insert(key, Entry { found: found.clone(), expires });
                }
                Ok(found.principal)
            }
            Verdict::Inactive(description) => Err(Refusal::Refused(AuthError::Invalid(
                description.unwrap_or_else(|| "Token validation failed".into()),
            ))),
            Verdict::Unavailable(reason) => Err(Refusal::Unavailable(reason)),
        }
    }

    /// One introspection call, run as a task of its own that lists itself under `key` until it lands: every
    /// caller may give up waiting (a client that hung up, a request timeout) and the call still ends and leaves
    /// the list, instead of staying there, half-run, for the next request with the same token to resume.
    fn take_off(&self, token: &str, key: &str, epoch: u64) -> Flight {
        self.inner.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (inner, token, key) = (self.inner.clone(), token.to_owned(), key.to_owned());
        let call = tokio::spawn(async move {
            let verdict = (inner.introspect)(token).await;
            let mut flights = inner.flights.lock();
            // Not a newer check of the same token, listed after an invalidation took this one off the list.
            if flights.get(&key).is_some_and(|(listed, _)| *listed == epoch) {
                flights.remove(&key);
            }
            verdict
        });
        async move { call.await.unwrap_or_else(|err| Verdict::Unavailable(format!("introspection task: {err}"))) }
            .boxed()
            .shared()
    }

    fn cached(&self, key: &str) -> Option<Introspected> {
        let mut cache = self.inner.cache.lock();
        match cache.get(key) {
            Some(entry) if entry.expires > Instant::now() => Some(entry.found.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        }
    }

    /// BP §10, SB §5.5, OQ-14: an `aud` that names none of the accepted audiences is refused (an empty one or one
    /// of another shape too); no `aud` is accepted.
    fn audience_ok(&self, audience: Option<&[String]>) -> bool {
        audience.is_none_or(|audience| {
            audience.iter().any(|a| self.inner.audiences.iter().any(|ok| a.trim_end_matches('/') == ok))
        })
    }

    /// Drop every cached token of `user`; returns how many. Checks in flight are not joined by later requests,
    /// and their answers are not cached (which user a token is of is known only once its check lands).
    pub fn invalidate_user(&self, user: &UserId) -> usize {
        let mut cache = self.inner.cache.lock();
        self.inner.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.flights.lock().clear();
        let before = cache.len();
        cache.retain(|_, entry| &entry.found.principal.user != user);
        before - cache.len()
    }

    /// Remove expired entries (the 5-minute sweep job); returns how many.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut cache = self.inner.cache.lock();
        let before = cache.len();
        cache.retain(|_, entry| entry.expires > now);
        before - cache.len()
    }

    /// Lookups answered from the cache and lookups that were not, so far.
    pub fn cache_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.inner.hits.load(Relaxed), self.inner.misses.load(Relaxed))
    }

    /// Introspection calls made so far.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn cached_tokens(&self) -> usize {
        self.inner.cache.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TeamId;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Alice's active token; `audience` empty is no `aud` at all.
    fn alice(audience: &[&str]) -> Verdict {
        alice_for((!audience.is_empty()).then(|| audience.to_vec()))
    }

    /// Alice's active token with `aud` as given (`None`: absent).
    fn alice_for(audience: Option<Vec<&str>>) -> Verdict {
        Verdict::Active(Introspected {
            principal: Principal {
                user: UserId::from("alice"),
                team: TeamId::from("acme"),
                scopes: vec!["mcp:read".into()],
                client_id: Some("dyn_1".into()),
                role: crate::auth::Role::Member,
            },
            audience: audience.map(|names| names.iter().map(|a| a.to_string()).collect()),
            client_id: Some("dyn_1".into()),
        })
    }

    /// A backend that answers `verdict` after `delay` and counts its calls.
    fn backend(verdict: Verdict, delay: Duration) -> (Introspect, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let introspect: Introspect = Arc::new(move |_token| {
            seen.fetch_add(1, Ordering::SeqCst);
            let verdict = verdict.clone();
            async move {
                tokio::time::sleep(delay).await;
                verdict
            }
            .boxed()
        });
        (introspect, calls)
    }

    #[tokio::test]
    async fn a_thousand_concurrent_first_requests_make_one_call() {
        let (introspect, calls) = backend(alice(&[]), Duration::from_millis(50));
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        let all = futures::future::join_all((0..1000).map(|_| auth.authenticate("tok"))).await;
        assert!(all.iter().all(|r| r.as_ref().is_ok_and(|p| p.user.as_str() == "alice")));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Cached afterwards.
        auth.authenticate("tok").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn expired_entries_are_asked_again_and_swept() {
        let (introspect, calls) = backend(alice(&[]), Duration::ZERO);
        let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO);
        auth.authenticate("tok").await.unwrap();
        assert_eq!(auth.sweep(), 1, "an expired entry is swept");
        auth.authenticate("tok").await.unwrap();
        auth.authenticate("tok").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3, "an expired entry is never served");
    }

    /// A stream's credential checked again: a token the control plane refused ends it, one it could not be asked
    /// about (unreachable) does not, and an active one admits its user.
    #[tokio::test]
    async fn a_recheck_tells_a_refusal_from_an_outage() {
        use crate::auth::{Authenticator, Recheck};
        let check = |verdict: Verdict| async move {
            let (introspect, _) = backend(verdict, Duration::ZERO);
            let auth = Authenticator::with_introspection(
                crate::control::directory::Directory::default(),
                TokenIntrospection::new(introspect, sat(), CACHE_TTL),
            );
            auth.recheck("Bearer tok").await
        };
        assert!(matches!(check(Verdict::Inactive(None)).await, Recheck::Refused));
        assert!(matches!(check(Verdict::Unavailable("connection refused".into())).await, Recheck::Unknown));
        assert!(matches!(check(alice(&[])).await, Recheck::Admitted(p) if p.user.as_str() == "alice"));
    }

    #[tokio::test]
    async fn negative_and_failed_results_are_not_cached() {
        let (introspect, calls) = backend(Verdict::Inactive(Some("Token has expired".into())), Duration::ZERO);
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        for _ in 0..3 {
            assert_eq!(auth.authenticate("tok").await, Err(AuthError::Invalid("Token has expired".into())));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let (introspect, calls) = backend(Verdict::Unavailable("connection refused".into()), Duration::ZERO);
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        assert!(auth.authenticate("tok").await.is_err());
        assert!(auth.authenticate("tok").await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// What `ManagedSettings::accepted_audiences` gives for `http://sat:3001/` plus one operator audience.
    fn sat() -> Vec<String> {
        ["deploystack:mcp:satellite", "http://sat:3001/mcp", "http://sat:3001/", "https://proxy.example/mcp/"]
            .map(String::from)
            .to_vec()
    }

    #[tokio::test]
    async fn audience_must_name_this_satellite_when_present() {
        for (aud, ok) in [
            (None, true),
            // Present but naming nothing (`[]`, or another shape): not this satellite (OQ-14).
            (Some(vec![]), false),
            (Some(vec!["http://sat:3001/mcp"]), true),
            (Some(vec!["http://sat:3001/"]), true),
            (Some(vec!["https://other.example/mcp", "http://sat:3001"]), true),
            (Some(vec!["https://other.example/mcp"]), false),
            (Some(vec!["deploystack:mcp:satellite"]), true),
            (Some(vec!["deploystack:mcp:other"]), false),
            (Some(vec!["https://proxy.example/mcp/"]), true),
        ] {
            let (introspect, _) = backend(alice_for(aud.clone()), Duration::ZERO);
            let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
            assert_eq!(auth.authenticate("tok").await.is_ok(), ok, "{aud:?}");
            assert_eq!(auth.cached_tokens(), usize::from(ok), "a refused audience is not cached");
        }
    }

    /// A check in flight when the user's tokens are invalidated (the backend answered "active" just before it
    /// revoked the token) is not cached: the next request asks again, and gets the revocation.
    #[tokio::test]
    async fn a_check_in_flight_during_an_invalidation_is_not_cached() {
        let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (asked, gate) = (Arc::new(tokio::sync::Semaphore::new(0)), Arc::new(tokio::sync::Semaphore::new(0)));
        let (answers, told, opened) = (revoked.clone(), asked.clone(), gate.clone());
        let introspect: Introspect = Arc::new(move |_token| {
            let (revoked, asked, gate) = (answers.clone(), told.clone(), opened.clone());
            async move {
                // The answer is made now, and delivered once the test lets it go.
                let verdict = if revoked.load(Ordering::SeqCst) { Verdict::Inactive(None) } else { alice(&[]) };
                asked.add_permits(1);
                let _ = gate.acquire().await;
                verdict
            }
            .boxed()
        });
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        let first = tokio::spawn({
            let auth = auth.clone();
            async move { auth.authenticate("tok").await }
        });
        let _ = asked.acquire().await;
        revoked.store(true, Ordering::SeqCst);
        auth.invalidate_user(&UserId::from("alice"));
        gate.add_permits(100);
        assert!(first.await.unwrap().is_ok(), "the request made before the invalidation goes ahead");
        assert_eq!(auth.cached_tokens(), 0, "its answer is not kept");
        assert!(auth.authenticate("tok").await.is_err(), "the next request asks again and is refused");
    }

    #[tokio::test]
    async fn invalidating_a_user_drops_only_their_tokens() {
        let (introspect, calls) = backend(alice(&[]), Duration::ZERO);
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        auth.authenticate("one").await.unwrap();
        auth.authenticate("two").await.unwrap();
        assert_eq!(auth.invalidate_user(&UserId::from("bob")), 0);
        assert_eq!(auth.invalidate_user(&UserId::from("alice")), 2);
        auth.authenticate("one").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    /// Callers that give up before the backend answers (clients hanging up with random tokens) leave nothing
    /// behind: each call ends on its own and leaves the list of calls in flight. Before, an abandoned call stayed
    /// listed for ever, half-run, and the next request with that token resumed it.
    #[tokio::test]
    async fn abandoned_calls_do_not_stay_in_flight() {
        let (introspect, calls) = backend(alice(&[]), Duration::from_millis(50));
        let auth = TokenIntrospection::new(introspect, sat(), CACHE_TTL);
        for i in 0..100 {
            let gave_up = tokio::time::timeout(Duration::from_millis(1), auth.authenticate(&format!("tok-{i}"))).await;
            assert!(gave_up.is_err(), "the caller gives up before the answer");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 100);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !auth.inner.flights.lock().is_empty() {
            assert!(Instant::now() < deadline, "abandoned calls still in flight");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        auth.authenticate("tok-0").await.expect("a fresh call answers");
    }

    #[test]
    fn the_cache_key_is_a_hash_not_the_token() {
        let key = sha256_hex("secret-token");
        assert_eq!(key.len(), 64);
        assert!(!key.contains("secret"));
    }
}
