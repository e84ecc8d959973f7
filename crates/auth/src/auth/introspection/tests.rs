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
    let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO).stale_for(Duration::ZERO);
    auth.authenticate("tok").await.unwrap();
    assert_eq!(auth.sweep(), 1, "an expired entry is swept");
    auth.authenticate("tok").await.unwrap();
    auth.authenticate("tok").await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "an expired entry is never served while the plane answers");
    // Kept for stale use, an expired entry is swept only past its stale bound.
    let (introspect, _) = backend(alice(&[]), Duration::ZERO);
    let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO);
    auth.authenticate("tok").await.unwrap();
    assert_eq!(auth.sweep(), 0, "within the stale bound");
    assert_eq!(auth.cached_tokens(), 1);
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

/// Checks that may pass the gate at once; the test takes them all to make the control plane hang.
const GATE: usize = 1_000_000;

/// A control plane whose answer the test sets, and which can be made to hang.
struct Plane {
    answer: Arc<parking_lot::Mutex<Verdict>>,
    /// While closed (no permits), checks hang.
    gate: Arc<tokio::sync::Semaphore>,
    calls: Arc<AtomicU32>,
}

impl Plane {
    fn new(answer: Verdict) -> (Plane, Introspect) {
        let plane = Plane {
            answer: Arc::new(parking_lot::Mutex::new(answer)),
            gate: Arc::new(tokio::sync::Semaphore::new(GATE)),
            calls: Arc::new(AtomicU32::new(0)),
        };
        let (answer, gate, calls) = (plane.answer.clone(), plane.gate.clone(), plane.calls.clone());
        let introspect: Introspect = Arc::new(move |_token| {
            let (answer, gate) = (answer.clone(), gate.clone());
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let _pass = gate.acquire().await;
                let verdict = answer.lock().clone();
                verdict
            }
            .boxed()
        });
        (plane, introspect)
    }

    fn set(&self, verdict: Verdict) {
        *self.answer.lock() = verdict;
    }
}

fn down() -> Verdict {
    Verdict::Unavailable("connection refused".into())
}

/// The 3 a.m. case: the control plane goes away for longer than the cache keeps a token. A token checked before
/// keeps working (counted as stale), one never seen gets `Unavailable` (a 503, not `invalid_token`), and when the
/// control plane answers again, what it says counts at once.
#[tokio::test]
async fn an_outage_longer_than_the_cache_keeps_known_tokens_working() {
    let (plane, introspect) = Plane::new(alice(&[]));
    let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO);
    auth.authenticate("known").await.expect("checked while the control plane is up");
    plane.set(down());
    for _ in 0..3 {
        assert_eq!(auth.authenticate("known").await.map(|p| p.user), Ok(UserId::from("alice")));
    }
    assert!(auth.outage().is_some_and(|o| o.reason == "connection refused"));
    assert_eq!(auth.stale_answers(), 3);
    assert_eq!(auth.authenticate("never-seen").await, Err(AuthError::Unavailable("connection refused".into())));
    // Back, and the token was revoked meanwhile: the next check (in the background, then the next request's) says so.
    plane.set(Verdict::Inactive(Some("Token revoked".into())));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match auth.authenticate("known").await {
            Err(AuthError::Invalid(reason)) => {
                assert_eq!(reason, "Token revoked");
                break;
            }
            Ok(_) => assert!(Instant::now() < deadline, "the revocation was never seen"),
            Err(other) => panic!("{other:?}"),
        }
        tokio::task::yield_now().await;
    }
    assert!(auth.outage().is_none(), "an answer ends the outage");
    assert_eq!(auth.cached_tokens(), 0);
}

/// Once a check has failed, no request waits for the control plane: an expired entry is served at once while
/// one background check (single flight) waits for it.
#[tokio::test]
async fn during_an_outage_no_request_waits_for_the_control_plane() {
    let (plane, introspect) = Plane::new(alice(&[]));
    let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO);
    auth.authenticate("known").await.expect("up");
    plane.set(down());
    auth.authenticate("known").await.expect("stale, and the outage is now known");
    // The control plane now hangs: requests must not.
    let hold = plane.gate.acquire_many(GATE as u32).await.expect("gate");
    let calls = auth.calls();
    let all = tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join_all((0..50).map(|_| auth.authenticate("known"))),
    )
    .await
    .expect("no request waited for the hanging control plane");
    assert!(all.iter().all(Result::is_ok));
    assert_eq!(auth.calls(), calls + 1, "one background check for fifty requests");
    drop(hold);
}

/// `stale_for` zero turns the reuse off: an expired token is refused as unavailable while the plane is away.
#[tokio::test]
async fn no_stale_reuse_when_turned_off() {
    let (plane, introspect) = Plane::new(alice(&[]));
    let auth = TokenIntrospection::new(introspect, sat(), Duration::ZERO).stale_for(Duration::ZERO);
    auth.authenticate("known").await.expect("up");
    plane.set(down());
    assert!(matches!(auth.authenticate("known").await, Err(AuthError::Unavailable(_))));
    assert_eq!(auth.stale_answers(), 0);
}
