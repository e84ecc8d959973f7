//! Issue 73, item 1: a backend that cannot check tokens logs no one out. Against the FakeBackend, with a token
//! cache of half a second so the outage outlasts it: a backend that is down, one that answers 500, one slower
//! than the 10 s introspection timeout. Known-good callers keep working (stale answers, counted), a token never
//! seen gets 503 with `Retry-After` and `error="server_error"` (never `invalid_token`), `/readyz` and
//! `/api/status/backend` say what is degraded, and once the backend answers again, its word counts.

use std::time::Duration;

use reqwest::StatusCode;
use satellite::config::Config;
use satellite::model::InstanceStatus;
use serde_json::{json, Value};

use crate::common::fake_backend::{Endpoint, FakeBackend, TokenInfo};
use crate::common::lifecycle::{wait_status, DEADLINE};
use crate::common::*;
use crate::managed::{config, fast};

const ALICE: &str = "plain-acme-alice-inst1";

fn short_token_cache(config: &mut Config) {
    fast(config);
    if let satellite::config::Mode::Managed(m) = &mut config.mode {
        m.token_cache_ttl = Duration::from_millis(500);
    }
}

/// A discover as `token`: the HTTP status and the reply.
async fn discover(sat: &TestSatellite, token: &str) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let caller = Caller::for_url(format!("{}/mcp", sat.base_url()), Some(token));
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"discover_mcp_tools","arguments":{"query":"ok","limit":3}}});
    caller.post_modern(&modern(body)).await
}

/// A 2026-07-28 request (no session to keep): each request is authenticated on its own.
fn modern(mut body: Value) -> Value {
    body["params"]["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}});
    body
}

async fn get(sat: &TestSatellite, path: &str) -> Value {
    let response = reqwest::get(format!("{}{path}", sat.base_url())).await.expect("status route answers");
    response.json().await.unwrap_or(Value::Null)
}

/// Requests as `token` keep being answered until the satellite reports the outage of token checks.
async fn served_until_degraded(sat: &TestSatellite, token: &str) {
    wait_until(DEADLINE, "the satellite sees the outage, serving the known token meanwhile", || async {
        let (status, _, reply) = discover(sat, token).await;
        assert_eq!(status, StatusCode::OK, "a known-good caller is never refused: {reply}");
        let ready = get(sat, "/readyz").await;
        (ready["status"] == "ready" && ready["degraded"]["token_checks"]["state"] == "degraded").then_some(())
    })
    .await;
}

async fn assert_new_token_waits(sat: &TestSatellite) {
    let (status, headers, reply) = discover(sat, "never-seen-token").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(headers.get("retry-after").is_some(), "says when to retry");
    let challenge = headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(challenge.contains("error=\"server_error\"") && !challenge.contains("invalid_token"), "{challenge}");
}

#[tokio::test]
async fn a_backend_that_cannot_check_tokens_logs_no_one_out() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = TestSatellite::managed(
        &backend.url(),
        FakeBackend::REGISTRATION_TOKEN,
        tempfile::tempdir().expect("dir"),
        short_token_cache,
    )
    .await
    .expect("managed satellite starts");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.add_token("alice-token", TokenInfo::new("alice", "acme"));
    assert_eq!(discover(&sat, "alice-token").await.0, StatusCode::OK);

    // Down: connections refused, for longer than the cache keeps the token.
    backend.go_down().await;
    served_until_degraded(&sat, "alice-token").await;
    assert_new_token_waits(&sat).await;
    let report = get(&sat, "/api/status/backend").await;
    assert_eq!(report["token_checks"]["state"], "degraded", "{report}");
    assert!(report["token_checks"]["stale_answers"].as_u64().is_some_and(|n| n > 0), "{report}");
    let metrics =
        reqwest::get(format!("{}/metrics", sat.base_url())).await.expect("metrics").text().await.unwrap_or_default();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("satellite_introspection_cache_total{result=\"stale\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );

    // Back: its answers count at once, and the degraded state ends.
    backend.come_back().await;
    wait_until(DEADLINE, "token checks back to normal", || async {
        assert_eq!(discover(&sat, "alice-token").await.0, StatusCode::OK);
        (get(&sat, "/readyz").await.get("degraded").is_none()).then_some(())
    })
    .await;

    // Answering 500 is the same as being down (a few answers; the later checks find the backend well again).
    backend.fail_next(Endpoint::Introspect, 500, 8);
    served_until_degraded(&sat, "alice-token").await;
    assert_new_token_waits(&sat).await;

    // Back again, and alice's token revoked meanwhile: the backend's "inactive" is the only way to 401.
    backend.remove_token("alice-token");
    wait_until(DEADLINE, "the revocation seen", || async {
        let (status, headers, _) = discover(&sat, "alice-token").await;
        let challenge = headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        (status == StatusCode::UNAUTHORIZED && challenge.contains("invalid_token")).then_some(())
    })
    .await;
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A backend slower than the introspection timeout (10 s) is an outage too: the known token keeps working and,
/// once the outage is known, no request waits for the slow backend.
#[tokio::test]
async fn a_backend_slower_than_the_introspection_timeout_is_an_outage() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = TestSatellite::managed(
        &backend.url(),
        FakeBackend::REGISTRATION_TOKEN,
        tempfile::tempdir().expect("dir"),
        short_token_cache,
    )
    .await
    .expect("managed satellite starts");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.add_token("alice-token", TokenInfo::new("alice", "acme"));
    assert_eq!(discover(&sat, "alice-token").await.0, StatusCode::OK);
    backend.set_latency_for(Endpoint::Introspect, Duration::from_secs(12));
    served_until_degraded(&sat, "alice-token").await;
    // Known now: fifty requests at once are all answered while the backend still hangs.
    let answers = futures::future::join_all((0..50).map(|_| discover(&sat, "alice-token"))).await;
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::OK));
    backend.set_latency_for(Endpoint::Introspect, Duration::ZERO);
    assert!(sat.satellite.shutdown().await);
}

/// Issue 73, item 2: a backend slower than the events timeout stores each batch and answers too late. The
/// satellite sends the batch again with the same event ids (the backend's dedupe key), fewer at a time, later and
/// with more time: the backend stores each fact once and gets less, not more, while it is slow.
#[tokio::test]
async fn a_backend_slower_than_the_events_timeout_stores_each_fact_once() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let slow_events = |config: &mut Config| {
        fast(config);
        if let satellite::config::Mode::Managed(m) = &mut config.mode {
            m.event_timeout = Duration::from_millis(400);
        }
    };
    let sat = TestSatellite::managed(
        &backend.url(),
        FakeBackend::REGISTRATION_TOKEN,
        tempfile::tempdir().expect("dir"),
        slow_events,
    )
    .await
    .expect("managed satellite starts");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let drained = || async { (sat.satellite.store().outbox().event_count().await.ok() == Some(0)).then_some(()) };
    wait_until(DEADLINE, "the outbox drained", drained).await;
    let before = backend.calls(Endpoint::Events).len();
    // Slow: every batch is stored at once and answered after 700 ms, past the 400 ms the satellite waits at first.
    backend.set_answer_delay_for(Endpoint::Events, Duration::from_millis(700));
    let manager = sat.satellite.manager().clone();
    for _ in 0..3 {
        manager.restart(&satellite::model::ProcessId::from(ALICE)).await.expect("restart");
        wait_status(&sat, ALICE, InstanceStatus::Online).await;
    }
    wait_until(DEADLINE, "every event accepted despite the slow backend", drained).await;
    backend.set_answer_delay_for(Endpoint::Events, Duration::ZERO);

    let events = backend.events();
    let mut ids: Vec<&str> = events.iter().filter_map(|e| e.data.get("event_id").and_then(Value::as_str)).collect();
    assert_eq!(ids.len(), events.len(), "every event carries its id");
    let stored = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), stored, "no fact stored twice");
    assert!(backend.duplicate_events() > 0, "a batch answered too late was sent again (and recognised by its ids)");
    // After the first timeout, each batch is at most half the one before it until one is accepted.
    let sizes: Vec<usize> = backend.calls(Endpoint::Events)[before..]
        .iter()
        .map(|call| call.body["events"].as_array().map_or(0, Vec::len))
        .collect();
    assert!(sizes.len() >= 2, "{sizes:?}");
    assert!(sizes[1] <= sizes[0].div_ceil(2), "the batch sent again is smaller: {sizes:?}");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}
