//! A long backend outage under steady client load (BP §8.3): a managed satellite serves a client that calls a
//! tool every 50 ms while the backend is down for `OUTAGE_SECONDS` (default 600, ten minutes), then the backend
//! comes back. Prints the events produced, delivered, still queued and dropped (0 expected below the outbox
//! quota), the outbox's peak depth, and the time the backlog takes to drain.
//!
//! `cargo bench --bench outage` (ten minutes), or `OUTAGE_SECONDS=60 cargo bench --bench outage` for a short run.

#[allow(unused_imports)]
#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fake_backend::{FakeBackend, TokenInfo};
use common::{fixture, wait_until, Caller, TestSatellite};
use satellite::backend::wire::ConfigResponse;
use satellite::control::McpServerEntry;
use serde_json::json;

const TOKEN: &str = "outage-bench-token-0123456789";

fn config() -> ConfigResponse {
    let entry = McpServerEntry {
        installation_id: "inst1".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Plain".into(),
        server_slug: Some("plain".into()),
        installation_name: "Plain".into(),
        transport_type: Some("stdio".into()),
        command: Some("python3".into()),
        args: Some(vec![fixture("misbehaving_server.py").to_string_lossy().into_owned(), "plain".into()]),
        enabled: Some(true),
        user_id: "alice".into(),
        ..Default::default()
    };
    ConfigResponse::from_entries([("plain-acme-alice-inst1", entry)])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let outage = Duration::from_secs(std::env::var("OUTAGE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(600));
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.add_token(TOKEN, TokenInfo::new("alice", "acme"));
    let sat =
        TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempfile::tempdir().unwrap(), |c| {
            c.activity_interval = Duration::from_secs(5);
            if let satellite::config::Mode::Managed(m) = &mut c.mode {
                m.event_interval = Duration::from_millis(500);
            }
        })
        .await
        .expect("managed satellite starts");
    sat.wait_ready().await;
    let caller = Caller::connect(&sat, "/mcp", Some(TOKEN)).await;
    wait_until(Duration::from_secs(30), "the server online", || async {
        let reply = caller.execute("plain:ok", json!({})).await;
        (reply["result"]["content"][0]["text"] == "ok").then_some(())
    })
    .await;

    // Steady load: one call every 50 ms, all through the outage and the drain.
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, calls, failures) = (stop.clone(), calls.clone(), failures.clone());
        let caller = Caller::connect(&sat, "/mcp", Some(TOKEN)).await;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let reply = caller.execute("plain:ok", json!({})).await;
                calls.fetch_add(1, Ordering::Relaxed);
                if reply["result"]["content"][0]["text"] != "ok" {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let store = sat.satellite.store().clone();
    let first_seq = store.outbox().outbox_last_seq().await.unwrap_or(0);
    let delivered_before = backend.events().len();
    println!("outage bench: backend down for {}s under one call every 50 ms", outage.as_secs());
    backend.go_down().await;
    let down_at = Instant::now();
    let mut peak = 0i64;
    while down_at.elapsed() < outage {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak = peak.max(store.outbox().event_count().await.unwrap_or(0));
    }
    backend.come_back().await;
    let back_at = Instant::now();
    let produced_during = store.outbox().outbox_last_seq().await.unwrap_or(0) - first_seq;
    let drained = wait_until(Duration::from_secs(600), "the outbox drained", || async {
        (store.outbox().event_count().await.unwrap_or(i64::MAX) <= 5).then_some(back_at.elapsed())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    // Let the last batch go out, then count everything once.
    wait_until(Duration::from_secs(60), "the last events delivered", || async {
        (store.outbox().event_count().await.unwrap_or(i64::MAX) == 0).then_some(())
    })
    .await;
    let produced = store.outbox().outbox_last_seq().await.unwrap_or(0) - first_seq;
    let delivered = (backend.events().len() - delivered_before) as i64;
    let queued = store.outbox().event_count().await.unwrap_or(0);
    let dropped = produced - delivered - queued;
    println!("| figure | value |\n| --- | --- |");
    println!("| outage | {} s |", outage.as_secs());
    println!("| client calls (failed) | {} ({}) |", calls.load(Ordering::Relaxed), failures.load(Ordering::Relaxed));
    println!("| events produced during the outage | {produced_during} |");
    println!("| outbox peak depth | {peak} |");
    println!("| events produced in all | {produced} |");
    println!("| events delivered | {delivered} |");
    println!("| events still queued | {queued} |");
    println!("| events dropped | {dropped} |");
    println!("| time to drain after the backend came back | {:.1} s |", drained.as_secs_f64());
    println!("| drain rate | {:.0} events/s |", produced_during as f64 / drained.as_secs_f64().max(0.001));
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}
