//! Replicas on one PostgreSQL database (issue 18, docs/scale-out.md): one registration and one leader for the
//! backend, the leader's commands run on every replica, a new leader when the old one goes, and every event
//! delivered exactly once however the replicas upload, stop or die.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use satellite::backend::wire::PollingMode;
use satellite::config::Config;
use satellite::model::InstanceStatus;
use satellite::store::testing::fresh_postgres_url;
use satellite::store::Store;
use serde_json::Value;

use crate::common::fake_backend::{Endpoint, FakeBackend};
use crate::common::lifecycle::{wait_status, DEADLINE};
use crate::common::*;
use crate::managed::{children_of, config, fast, refresh, spawn_managed_binary_with};

const ALICE: &str = "plain-acme-alice-inst1";
const BOB: &str = "plain-acme-bob-inst1";

fn on(url: &str) -> impl FnOnce(&mut Config) + '_ {
    move |config: &mut Config| {
        fast(config);
        config.database.url = Some(url.to_owned().into());
    }
}

async fn backend_status(base: &str) -> Value {
    match reqwest::get(format!("{base}/api/status/backend")).await {
        Ok(answer) => answer.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

async fn role(base: &str) -> String {
    backend_status(base).await["replica_role"].as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn replicas_share_one_registration_run_the_leaders_commands_and_hand_over_the_lead() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    // Polls every 2 s, so a pushed command is picked up within seconds.
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    let url = fresh_postgres_url().await.expect("a test PostgreSQL server (SATELLITE_TEST_POSTGRES_URL)");
    let token = FakeBackend::REGISTRATION_TOKEN;
    let a = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    let b = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    for sat in [&a, &b] {
        wait_status(sat, ALICE, InstanceStatus::Online).await;
    }
    assert_eq!(backend.calls(Endpoint::Register).len(), 1, "the second replica adopts the first one's registration");
    let roles = wait_until(DEADLINE, "one leader and one follower", || async {
        let roles = [role(&a.base_url()).await, role(&b.base_url()).await];
        let mut sorted = roles.clone();
        sorted.sort();
        (sorted == ["follower", "leader"]).then_some(roles)
    })
    .await;
    let (leader, follower) = if roles[0] == "leader" { (a, b) } else { (b, a) };
    let ids: HashSet<Value> = [backend_status(&leader.base_url()).await, backend_status(&follower.base_url()).await]
        .iter()
        .map(|s| s["satellite_id"].clone())
        .collect();
    assert_eq!(ids.len(), 1, "one identity: {ids:?}");

    // A configure the leader polls is answered once, by the leader, and run by the follower too.
    let mut changed = config();
    changed.mcp_servers.retain(|key, _| key.as_str() != BOB);
    backend.set_config(&changed);
    backend.push_command(refresh("cmd-remove-bob"));
    for sat in [&leader, &follower] {
        wait_until(DEADLINE, "bob's instance removed on both replicas", || async {
            sat.satellite.manager().get(&satellite::model::ProcessId(BOB.into())).is_none().then_some(())
        })
        .await;
    }
    assert_eq!(backend.results_for("cmd-remove-bob").len(), 1, "only the leader posts results");

    // The leader stops; the follower takes the lead and answers the next command.
    assert!(leader.satellite.shutdown().await);
    wait_until(DEADLINE, "the follower leads", || async {
        (role(&follower.base_url()).await == "leader").then_some(())
    })
    .await;
    backend.set_config(&config());
    backend.push_command(refresh("cmd-bob-back"));
    wait_status(&follower, BOB, InstanceStatus::Online).await;
    wait_until(DEADLINE, "the new leader's result", || async {
        (backend.results_for("cmd-bob-back").len() == 1).then_some(())
    })
    .await;
    backend.assert_no_violations();
    assert!(follower.satellite.shutdown().await);
}

/// Two replica processes; the backend goes away while both produce events, comes back slow, and the replica
/// holding a batch mid-upload is killed: every event ever produced reaches the backend exactly once.
#[tokio::test]
async fn events_of_both_replicas_arrive_exactly_once_though_one_dies_mid_upload() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let url = fresh_postgres_url().await.expect("a test PostgreSQL server (SATELLITE_TEST_POSTGRES_URL)");
    // A 6 s lease over batches the slow backend answers in 3 s: a live replica never loses its claim.
    let env = [("DATABASE_URL", url.as_str()), ("SATELLITE_EVENT_LEASE_MS", "6000")];
    // Migrated first, so a trigger records every event either replica appends to the outbox: what was produced,
    // to compare with what arrived (two replicas running the same instance can emit equal events in one ms).
    let store = Store::connect(std::path::Path::new("/nonexistent"), &database(&url)).await.unwrap();
    let audit = sqlx::PgPool::connect(&url).await.unwrap();
    for statement in [
        "CREATE TABLE produced (event_type TEXT, emitted_at TEXT, data TEXT)",
        "CREATE FUNCTION record_produced() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
           INSERT INTO produced VALUES (NEW.event_type, NEW.emitted_at, NEW.data); RETURN NEW; END $$",
        "CREATE TRIGGER produced AFTER INSERT ON event_outbox FOR EACH ROW EXECUTE FUNCTION record_produced()",
    ] {
        sqlx::query(statement).execute(&audit).await.unwrap();
    }
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ports = [free_port(), free_port()];
    let mut replicas: Vec<_> =
        dirs.iter().zip(ports).map(|(dir, port)| spawn_managed_binary_with(&backend, dir.path(), port, &env)).collect();
    let pids: Vec<u32> = replicas.iter().map(|r| r.id().unwrap()).collect();
    let children = wait_until(DEADLINE, "two server processes under each replica", || async {
        let children: Vec<Vec<u32>> = pids.iter().map(|pid| children_of(*pid)).collect();
        children.iter().all(|c| c.len() == 2).then_some(children)
    })
    .await;
    wait_until(DEADLINE, "the first events delivered", || async {
        (store.outbox().event_count().await.unwrap() == 0 && !backend.events().is_empty()).then_some(())
    })
    .await;

    // The backend goes away; a server under each replica crashes (events on both replicas meanwhile).
    backend.go_down().await;
    for c in &children {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c[0] as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    wait_until(DEADLINE, "both crashes queued", || async {
        let queued = store.outbox().events(Some("mcp.server.crashed"), 0, 10).await.unwrap();
        (queued.len() == 2).then_some(())
    })
    .await;

    // Back, but slow: each batch takes 3 s. The replica holding a claim is killed while a batch is in flight.
    backend.set_latency_for(Endpoint::Events, Duration::from_secs(3));
    backend.come_back().await;
    wait_until(DEADLINE, "a batch in flight", || async { (backend.in_flight() > 0).then_some(()) }).await;
    let holder = wait_until(DEADLINE, "a batch claimed", || async { claimed_by(&store).await }).await;
    let mut ids = Vec::new();
    for port in ports {
        ids.push(backend_status(&format!("http://127.0.0.1:{port}")).await["replica_id"].as_str().map(str::to_owned));
    }
    let victim = replicas.iter_mut().zip(&ids).find(|(_, id)| id.as_deref() == Some(holder.as_str()));
    let Some((victim, _)) = victim else { panic!("no replica claims {holder}: {ids:?}") };
    victim.start_kill().unwrap();
    victim.wait().await.unwrap();
    backend.set_latency_for(Endpoint::Events, Duration::ZERO);

    // The survivor sends the dead replica's batch once its lease lapses, and its own.
    let last_seq = wait_until(DEADLINE, "the outbox drained", || async {
        (store.outbox().event_count().await.unwrap() == 0).then_some(())?;
        Some(store.outbox().outbox_last_seq().await.unwrap())
    })
    .await;
    let delivered = backend.events();
    let mut arrived: HashMap<(String, String, String), i64> = HashMap::new();
    for e in &delivered {
        *arrived
            .entry((
                e.kind.as_str().to_owned(),
                e.timestamp.clone(),
                serde_json::to_string(&e.data).unwrap_or_default(),
            ))
            .or_default() += 1;
    }
    let mut made: HashMap<(String, String, String), i64> = HashMap::new();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT event_type, emitted_at, data FROM produced").fetch_all(&audit).await.unwrap();
    for (kind, at, data) in rows {
        let data = serde_json::from_str::<Value>(&data).unwrap().to_string();
        *made.entry((kind, at, data)).or_default() += 1;
    }
    // What was produced is what the trigger recorded: it commits with the event. The outbox's sequence is not
    // transactional (an insert cut short by the kill still uses a number), so it only bounds the count.
    let produced: i64 = made.values().sum();
    assert!(produced <= last_seq, "{produced} events recorded, the sequence at {last_seq}");
    assert_eq!(delivered.len() as i64, produced, "as many events arrived as were produced");
    let differ: Vec<_> = made.iter().filter(|(k, n)| arrived.get(*k) != Some(*n)).collect();
    assert!(differ.is_empty(), "each produced event arrived exactly once; these did not: {differ:?}");
    assert_eq!(arrived.len(), made.len());
    assert_eq!(delivered.iter().filter(|e| e.kind.as_str() == "mcp.server.crashed").count(), 2);
    for replica in &mut replicas {
        let _ = replica.start_kill();
        let _ = replica.wait().await;
    }
    backend.assert_no_violations();
}

fn database(url: &str) -> satellite::config::Database {
    satellite::config::Database { url: Some(url.to_owned().into()), max_connections: Some(2) }
}

/// The replica id holding a claim on an event, if one does.
async fn claimed_by(store: &Store) -> Option<String> {
    store.outbox().claims().await.unwrap().into_iter().next()
}

/// A backend with the test configuration, and a fresh PostgreSQL database for the replicas to share.
async fn backend_and_database() -> (FakeBackend, String) {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let url = fresh_postgres_url().await.expect("a test PostgreSQL server (SATELLITE_TEST_POSTGRES_URL)");
    (backend, url)
}

/// The shared credentials are not thrown away when the backend merely fails a verification, and when a replica
/// has to register again (the backend refused the key), the replicas already running adopt the new key.
#[tokio::test]
async fn shared_credentials_survive_a_failed_check_and_a_new_registration_reaches_running_replicas() {
    let (backend, url) = backend_and_database().await;
    let token = FakeBackend::REGISTRATION_TOKEN;
    let a = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    let satellite_id = backend_status(&a.base_url()).await["satellite_id"].as_str().unwrap_or("").to_owned();
    assert!(a.satellite.shutdown().await);

    // A 503 on the verification heartbeat: this start fails, and the credentials stay for the next one.
    backend.fail_next(Endpoint::Heartbeat, 503, 1);
    let failed = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await;
    assert!(failed.is_err(), "a backend that fails the check stops this start");
    let store = Store::connect(std::path::Path::new("/nonexistent"), &database(&url)).await.unwrap();
    assert!(store.replicas().shared_identity("test-satellite-01").await.unwrap().is_some(), "the credentials are kept");
    let b = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    assert_eq!(backend.calls(Endpoint::Register).len(), 1, "verified, not registered again");

    // The backend revokes the key; the next replica to start is refused, registers again with a new token, and
    // stops. The replica that kept running adopts the new key: as the only replica it leads, and its heartbeats
    // are accepted again (with the revoked key every one would be refused).
    backend.revoke_api_key(&satellite_id);
    let second = "deploystack_satellite_global_second0registration0token";
    backend.add_registration_token(second);
    let c = TestSatellite::managed(&backend.url(), second, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    assert_eq!(backend.calls(Endpoint::Register).len(), 2);
    assert!(c.satellite.shutdown().await);
    let accepted = backend.heartbeats().len();
    wait_until(DEADLINE, "the running replica's heartbeats accepted with the new key", || async {
        (backend.heartbeats().len() > accepted + 2).then_some(())
    })
    .await;
    backend.assert_no_violations();
    assert!(b.satellite.shutdown().await);
}

/// The backend refuses the shared credentials (a revoked key) and the registration that follows fails too (a
/// token the backend refuses for now): the shared credentials stay in the database, as the replicas' identity
/// promises ("replaced when the registration succeeds, kept if it fails"). Before, the refusal deleted them ahead
/// of the registration, so its failure left the replicas with no identity at all.
#[tokio::test]
async fn shared_credentials_refused_stay_when_the_registration_that_follows_fails() {
    let (backend, url) = backend_and_database().await;
    let token = FakeBackend::REGISTRATION_TOKEN;
    let a = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    let satellite_id = backend_status(&a.base_url()).await["satellite_id"].as_str().unwrap_or("").to_owned();
    assert!(!satellite_id.is_empty());
    assert!(a.satellite.shutdown().await);

    backend.revoke_api_key(&satellite_id);
    let second = "deploystack_satellite_global_second0registration0token";
    backend.add_registration_token(second);
    backend.fail_registration(503, "service_unavailable");
    let failed = TestSatellite::managed(&backend.url(), second, tempfile::tempdir().unwrap(), on(&url)).await;
    assert!(failed.is_err(), "refused credentials and a failed registration stop this start");
    assert_eq!(backend.calls(Endpoint::Register).len(), 2, "the registration was tried");
    let store = Store::connect(std::path::Path::new("/nonexistent"), &database(&url)).await.unwrap();
    let kept = store.replicas().shared_identity("test-satellite-01").await.unwrap();
    assert_eq!(kept.map(|k| k.satellite_id), Some(satellite_id), "the shared credentials are kept");
    backend.take_violations();
}

/// The database ends the leader's lock session (an idle timeout, an administrator, a proxy restart): the leader
/// notices, steps down, and the lead is taken again on a new session, never held by two replicas at once.
#[tokio::test]
async fn a_leader_whose_lock_session_is_cut_steps_down_and_one_replica_leads_again() {
    let (backend, url) = backend_and_database().await;
    let token = FakeBackend::REGISTRATION_TOKEN;
    let a = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    let b = TestSatellite::managed(&backend.url(), token, tempfile::tempdir().unwrap(), on(&url)).await.unwrap();
    let roles = || async {
        let mut roles = [role(&a.base_url()).await, role(&b.base_url()).await];
        roles.sort();
        roles
    };
    wait_until(DEADLINE, "one leader", || async { (roles().await == ["follower", "leader"]).then_some(()) }).await;
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let holder = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database =
                  (SELECT oid FROM pg_database WHERE datname = current_database())";
    let before: Vec<(i32,)> = sqlx::query_as(holder).fetch_all(&admin).await.unwrap();
    assert_eq!(before.len(), 1, "one lock held: {before:?}");
    sqlx::query("SELECT pg_terminate_backend($1)").bind(before[0].0).execute(&admin).await.unwrap();
    wait_until(DEADLINE, "the lead taken again on a new session, by one replica", || async {
        let now: Vec<(i32,)> = sqlx::query_as(holder).fetch_all(&admin).await.ok()?;
        (now.len() == 1 && now != before && roles().await == ["follower", "leader"]).then_some(())
    })
    .await;
    assert!(a.satellite.shutdown().await);
    assert!(b.satellite.shutdown().await);
}
