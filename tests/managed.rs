//! Managed mode against the FakeBackend (BP strictly, every body checked against proto/): registration and
//! stored credentials, config, heartbeats, commands with de-duplication, events delivered while the backend
//! goes away, and clients authenticated by introspection.

use std::time::Duration;

use satellite::backend::wire::{
    Command, CommandKind, CommonPayload, ConfigResponse, ConfigurePayload, PollingMode, Priority, RestartPayload,
    ResultStatus, TargetPayload,
};
use satellite::config::Config;
use satellite::control::McpServerEntry;
use satellite::model::InstanceStatus;
use serde_json::{json, Value};

use crate::common::fake_backend::{Endpoint, FakeBackend, Fault, TokenInfo};
use crate::common::lifecycle::{wait_status, DEADLINE};
use crate::common::*;

const ALICE: &str = "plain-acme-alice-inst1";
const BOB: &str = "plain-acme-bob-inst1";

/// One stdio installation (an allow-listed `python3` running the fixture server) for alice and bob.
pub(crate) fn config() -> ConfigResponse {
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    let entry = |user: &str| McpServerEntry {
        installation_id: "inst1".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Plain".into(),
        server_slug: Some("plain".into()),
        installation_name: "Plain".into(),
        transport_type: Some("stdio".into()),
        command: Some("python3".into()),
        args: Some(vec![script.clone(), "plain".into()]),
        enabled: Some(true),
        user_id: user.into(),
        ..Default::default()
    };
    ConfigResponse::from_entries([(ALICE, entry("alice")), (BOB, entry("bob"))])
}

/// Fast cadences so tests wait seconds, not minutes.
pub(crate) fn fast(config: &mut Config) {
    config.activity_interval = Duration::from_millis(300);
    if let satellite::config::Mode::Managed(m) = &mut config.mode {
        m.heartbeat_interval = Duration::from_millis(200);
        m.event_interval = Duration::from_millis(100);
        m.poll_idle = Duration::from_secs(2);
    }
}

async fn start(backend: &FakeBackend, dir: tempfile::TempDir, token: &str) -> TestSatellite {
    TestSatellite::managed(&backend.url(), token, dir, fast).await.expect("managed satellite starts")
}

/// A satellite registered afresh against `backend`, once alice's and bob's instances of `config()` are online.
async fn start_online(backend: &FakeBackend) -> TestSatellite {
    let sat = start(backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    wait_status(&sat, BOB, InstanceStatus::Online).await;
    sat
}

/// A `configure` that asks for a full refresh, as the backend sends after an installation changed.
pub(crate) fn refresh(id: &str) -> Command {
    Command::new(
        id,
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload {
            common: CommonPayload { event: Some("mcp_installation_updated".into()), ..Default::default() },
            ..Default::default()
        }),
    )
}

/// The first result the backend recorded for a command, once there is one.
/// The `mcp.client.activity` reports whose `field` is `value`, once they count at least `requests` requests; with the
/// requests and tool calls they count.
async fn client_activity(backend: &FakeBackend, field: &str, value: &str, requests: u64) -> (Vec<Value>, u64, u64) {
    let sum = |seen: &[Value], counter: &str| seen.iter().filter_map(|d| d[counter].as_u64()).sum::<u64>();
    let seen = wait_until(DEADLINE, &format!("client activity of {field} {value}"), || async {
        let seen: Vec<Value> = backend
            .events()
            .into_iter()
            .filter(|e| e.kind.as_str() == "mcp.client.activity" && e.data[field] == value)
            .map(|e| Value::Object(e.data))
            .collect();
        (sum(&seen, "request_count") >= requests).then_some(seen)
    })
    .await;
    let (requests, calls) = (sum(&seen, "request_count"), sum(&seen, "tool_call_count"));
    (seen, requests, calls)
}

async fn first_result(backend: &FakeBackend, id: &str) -> satellite::backend::wire::CommandResult {
    wait_until(DEADLINE, &format!("a result for {id}"), || async { backend.results_for(id).into_iter().next() }).await
}

fn satellite_id(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(dir.join("persistent_data/backend.key.json")).expect("credentials file");
    let stored: Value = serde_json::from_str(&text).unwrap();
    stored["satellite_id"].as_str().expect("satellite id").to_owned()
}

fn delivered(backend: &FakeBackend, event_type: &str, status: Option<&str>, user: &str) -> usize {
    backend
        .events()
        .iter()
        .filter(|e| {
            e.kind.as_str() == event_type && e.data["user_id"] == user && status.is_none_or(|s| e.data["status"] == s)
        })
        .count()
}

#[tokio::test]
async fn registers_applies_the_config_beats_and_delivers_events() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = start_online(&backend).await;
    assert_eq!(backend.calls(Endpoint::Register).len(), 1);

    let beats = wait_until(DEADLINE, "three heartbeats", || async {
        let beats = backend.heartbeats();
        (beats.len() >= 3).then_some(beats)
    })
    .await;
    // The verification-free first start: the first periodic beat carries satellite_url, later ones do not.
    assert_eq!(beats[0]["satellite_url"], "", "unset DEPLOYSTACK_SATELLITE_URL is sent as \"\" once");
    assert!(beats[1].get("satellite_url").is_none() && beats[2].get("satellite_url").is_none());
    let last = beats.last().unwrap();
    assert!(last["system_metrics"]["memory_usage_mb"].as_u64() > Some(0));
    assert_eq!(last["mcp_status"]["summary"]["online_servers"], 2);
    assert_eq!(last["processes_by_team"]["acme"].as_array().map(Vec::len), Some(2));
    // Alice's and Bob's instances of one server list the same tool: it is named once (BP §3.3: names only), so the
    // beat does not grow with members x tools. Before, each instance's tools were listed again.
    let names: Vec<&Value> = last["mcp_status"]["tool_names"].as_array().expect("tool names").iter().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(last["mcp_status"]["summary"]["total_tools"], 1);

    wait_until(DEADLINE, "online status events for both users", || async {
        (delivered(&backend, "mcp.server.status_changed", Some("online"), "alice") >= 1
            && delivered(&backend, "mcp.server.status_changed", Some("online"), "bob") >= 1)
            .then_some(())
    })
    .await;
    wait_until(DEADLINE, "the outbox drained", || async {
        (sat.satellite.store().outbox().event_count().await.unwrap() == 0).then_some(())
    })
    .await;
    // Every discovery is reported with token counts (SB §15), checked by the fake against its schema.
    let discovered: Vec<_> =
        backend.events().into_iter().filter(|e| e.kind.as_str() == "mcp.tools.discovered").collect();
    assert!(discovered.len() >= 2, "one per instance");
    let first = &discovered[0].data;
    assert_eq!(first["installation_id"], "inst1");
    assert_eq!(first["tool_count"], 1);
    let tool_tokens = first["tools"][0]["token_count"].as_u64().unwrap();
    assert!(tool_tokens > 0);
    assert_eq!(first["total_tokens"].as_u64(), Some(tool_tokens));
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A backend that refuses a heartbeat as too large (413) gets later beats without the lists that grow with the
/// instances and tools, so it goes on hearing the satellite. Before, the same beat went every 30 s and was refused
/// every time: the backend's `last_heartbeat` went stale and the satellite looked dead.
#[tokio::test]
async fn a_heartbeat_refused_as_too_large_is_followed_by_smaller_ones() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = start_online(&backend).await;
    let full = wait_until(DEADLINE, "a heartbeat naming the tool", || async {
        backend
            .heartbeats()
            .into_iter()
            .find(|b| b["mcp_status"]["tool_names"].as_array().is_some_and(|t| !t.is_empty()))
    })
    .await;
    assert_eq!(full["mcp_status"]["summary"]["total_tools"], 1);
    let accepted = backend.heartbeats().len();
    backend.fail_next(Endpoint::Heartbeat, 413, 1);
    let slim = wait_until(DEADLINE, "a heartbeat accepted after the refusal", || async {
        let beats = backend.heartbeats();
        (beats.len() > accepted && backend.calls(Endpoint::Heartbeat).iter().any(|c| c.status == 413))
            .then(|| beats.last().cloned())
            .flatten()
    })
    .await;
    assert_eq!(slim["mcp_status"]["tool_names"], json!([]), "{slim}");
    assert_eq!(slim["mcp_status"]["instances"], json!([]));
    assert!(slim.get("processes_by_team").is_none_or(Value::is_null), "{slim}");
    assert_eq!(slim["mcp_status"]["summary"]["total_tools"], 1, "the summary still counts them");
    assert_eq!(slim["mcp_status"]["summary"]["online_servers"], 2);
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn stored_credentials_are_reused_and_refused_ones_lead_to_a_new_registration() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    // Each start gets its own TempDir (the harness owns it); the state moves along by copying.
    let TestSatellite { satellite, dir: first, .. } =
        start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    assert!(satellite.shutdown().await);
    let sid = satellite_id(first.path());
    let meta = std::fs::metadata(first.path().join("persistent_data/backend.key.json")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);

    // Restart: the stored key is verified with a heartbeat; the used token is not needed again.
    let TestSatellite { satellite, dir: second, .. } =
        TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempdir_at(first.path()), fast)
            .await
            .expect("restart with stored credentials");
    assert_eq!(backend.calls(Endpoint::Register).len(), 1, "no second registration");
    assert_eq!(satellite_id(second.path()), sid);
    assert!(satellite.shutdown().await);

    // The backend forgets the key: the satellite registers again with a fresh token.
    backend.revoke_api_key(&sid);
    let token = "deploystack_satellite_global_second0registration";
    backend.add_registration_token(token);
    let sat =
        TestSatellite::managed(&backend.url(), token, tempdir_at(second.path()), fast).await.expect("re-registers");
    assert_eq!(backend.calls(Endpoint::Register).len(), 2);
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(sat.satellite.shutdown().await);
    backend.take_violations();
}

/// The verification heartbeat failing for a moment (a 503 from a proxy while the backend restarts) says nothing of
/// the stored key: the start that met it fails (its token was used up by the first registration), and the next one
/// verifies the key and runs as the same satellite. Before, the failure emptied the key file, and with the token
/// used every later start failed until an operator made a new one.
#[tokio::test]
async fn a_verification_heartbeat_failing_for_a_moment_keeps_the_stored_credentials() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let TestSatellite { satellite, dir: first, .. } =
        start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    assert!(satellite.shutdown().await);
    let sid = satellite_id(first.path());

    backend.fail_next(Endpoint::Heartbeat, 503, 1);
    // Left on disk when the failing start drops it, to read what that start left of the credentials.
    let mut unlucky = tempdir_at(first.path());
    unlucky.disable_cleanup(true);
    let kept = unlucky.path().to_owned();
    let failed = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, unlucky, fast).await;
    assert!(failed.is_err(), "the used token cannot register again");
    assert_eq!(satellite_id(&kept), sid, "the stored credentials are kept");
    // The failed start's database connections close behind it (its pool was dropped, not closed): copied before
    // the last has checkpointed its WAL, the copy could lose the WAL file midway, or take a torn database.
    let wal = kept.join("data/satellite.db-wal");
    wait_until(DEADLINE, "the failed start's database closed", || {
        let open = wal.exists();
        async move { (!open).then_some(()) }
    })
    .await;

    let sat = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempdir_at(&kept), fast)
        .await
        .expect("the next start verifies the stored key");
    assert_eq!(satellite_id(sat.dir.path()), sid, "the same satellite");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(sat.satellite.shutdown().await);
    std::fs::remove_dir_all(&kept).expect("remove the kept directory");
    backend.take_violations();
}

/// A TempDir handle for an existing directory (kept: `into_path` semantics without deleting).
fn tempdir_at(path: &std::path::Path) -> tempfile::TempDir {
    let fresh = tempfile::tempdir().unwrap();
    // Copy the persistent data and database over so the new handle owns a copy of the same state.
    copy_dir(path, fresh.path());
    fresh
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
        }
    }
}

#[tokio::test]
async fn a_missing_backend_or_a_bad_token_is_one_fatal_line() {
    let dir = tempfile::tempdir().unwrap();
    let err = TestSatellite::managed(
        &format!("http://127.0.0.1:{}", free_port()),
        FakeBackend::REGISTRATION_TOKEN,
        dir,
        fast,
    )
    .await
    .err()
    .expect("no backend, no start");
    assert!(err.to_string().starts_with("the backend is not reachable at startup"), "{err}");
    assert_eq!(err.exit_code(), 1);
    let backend = FakeBackend::start().await;
    let err =
        TestSatellite::managed(&backend.url(), "your_registration_token_here", tempfile::tempdir().unwrap(), fast)
            .await
            .err()
            .expect("placeholder token refused");
    assert!(err.to_string().contains("placeholder"), "{err}");
    assert!(!err.to_string().contains('\n'));
}

#[tokio::test]
async fn commands_run_once_each_get_a_result_and_a_redelivered_one_gets_its_result_again() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    // An idle backend says "come back in 60 s"; this one says 2 s, the fastest the policy allows.
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let configs_before = backend.calls(Endpoint::Config).len();

    // The config answer takes 3 s, so the 2 s polls deliver the configure again while it runs; and the first
    // result post fails, so the backend delivers it again after it ran.
    backend.set_latency_for(Endpoint::Config, Duration::from_secs(3));
    backend.fail_next(Endpoint::CommandResult, 500, 1);
    backend.push_command(refresh("cmd-refresh"));
    backend.push_command(Command::new(
        "cmd-unknown",
        Priority::Immediate,
        CommandKind::Unknown { command_type: "teleport".into(), payload: json!({}) },
    ));
    backend.push_command(Command::new(
        "cmd-restart",
        Priority::Immediate,
        CommandKind::Restart(RestartPayload {
            common: CommonPayload {
                installation_id: Some("inst1".into()),
                user_id: Some("alice".into()),
                ..Default::default()
            },
            reason: Some("manual_restart".into()),
        }),
    ));
    let results = wait_until(DEADLINE, "results for all three commands", || async {
        let done = ["cmd-refresh", "cmd-unknown", "cmd-restart"].map(|id| backend.results_for(id));
        done.iter().all(|r| !r.is_empty()).then_some(done)
    })
    .await;
    backend.set_latency_for(Endpoint::Config, Duration::ZERO);
    assert_eq!(results[0][0].status, ResultStatus::Completed);
    assert_eq!(results[0][0].result.as_ref().unwrap()["configuration_applied"], true);
    assert!(backend.calls(Endpoint::Commands).len() >= 3, "polled again while the configure ran");
    assert_eq!(results[1][0].status, ResultStatus::Failed);
    assert_eq!(results[1][0].error_message.as_deref(), Some("Unknown command type: teleport"));
    assert_eq!(results[2][0].status, ResultStatus::Completed);
    assert_eq!(
        backend.calls(Endpoint::Config).len(),
        configs_before + 1,
        "the re-delivered configure ran once; its stored result was posted again"
    );
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(backend.pending_commands().is_empty());

    // update_tool_status switches a tool for every member at once, without restarting anything.
    let pid = sat.satellite.manager().get(&satellite::model::ProcessId::from(BOB)).unwrap().pid();
    backend.push_command(Command::new(
        "cmd-disable",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload {
            common: CommonPayload { installation_id: Some("inst1".into()), ..Default::default() },
            action: Some("update_tool_status".into()),
            tool_name: Some("ok".into()),
            is_disabled: Some(true),
            ..Default::default()
        }),
    ));
    let done = first_result(&backend, "cmd-disable").await;
    assert_eq!(done.status, ResultStatus::Completed);
    for id in [ALICE, BOB] {
        assert!(sat.satellite.manager().get(&satellite::model::ProcessId::from(id)).unwrap().tool_disabled("ok"));
    }
    assert_eq!(sat.satellite.manager().get(&satellite::model::ProcessId::from(BOB)).unwrap().pid(), pid);
    let beat = wait_until(DEADLINE, "a heartbeat without the disabled tool", || async {
        backend
            .heartbeats()
            .into_iter()
            .last()
            .filter(|b| b["mcp_status"]["tool_names"].as_array().is_some_and(Vec::is_empty))
    })
    .await;
    assert_eq!(beat["mcp_status"]["summary"]["total_tools"], 0);
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn events_emitted_while_the_backend_is_down_arrive_when_it_is_back() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    wait_until(DEADLINE, "the outbox drained", || async {
        (sat.satellite.store().outbox().event_count().await.unwrap() == 0).then_some(())
    })
    .await;
    backend.go_down().await;
    let manager = sat.satellite.manager().clone();
    for _ in 0..5 {
        manager.restart(&satellite::model::ProcessId::from(ALICE)).await.unwrap();
        wait_status(&sat, ALICE, InstanceStatus::Online).await;
    }
    let queued = sat.satellite.store().outbox().event_count().await.unwrap();
    assert!(queued >= 5 * 4, "restarting, connecting, discovering, online per restart are kept ({queued})");
    backend.come_back().await;
    wait_until(DEADLINE, "every queued event delivered", || async {
        (sat.satellite.store().outbox().event_count().await.unwrap() == 0).then_some(())
    })
    .await;
    assert_eq!(delivered(&backend, "mcp.server.status_changed", Some("restarting"), "alice"), 5);
    assert!(delivered(&backend, "mcp.server.status_changed", Some("online"), "alice") >= 6);
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn clients_authenticate_by_introspection_with_one_call_for_concurrent_first_requests() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.add_token("alice-token", TokenInfo::new("alice", "acme"));
    backend.add_token("expired-token", TokenInfo::new("bob", "acme").inactive());
    let url = format!("{}/mcp", sat.base_url());

    let before = backend.calls(Endpoint::Introspect).len();
    let callers = (0..50).map(|_| {
        let url = url.clone();
        async move {
            let mut caller = Caller::for_url(url, Some("alice-token"));
            caller.initialize().await;
            caller
        }
    });
    let callers = futures::future::join_all(callers).await;
    assert_eq!(
        backend.calls(Endpoint::Introspect).len(),
        before + 1,
        "50 concurrent first requests, one introspection"
    );
    let found = callers[0].tool("discover_mcp_tools", json!({"query": "ok"})).await;
    let text = found["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("plain:ok"), "alice sees her own tools: {found}");

    let refused = Caller::for_url(url, Some("expired-token"))
        .post_raw(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}).to_string(), &[])
        .await;
    assert_eq!(refused.0, 401);
    assert_eq!(refused.2["error"]["code"], -32002);

    // Alice's client shows up in the activity report (SB §17), with every request counted once.
    let (activity, _, calls) = client_activity(&backend, "user_id", "alice", 51).await;
    assert!(activity.iter().all(|d| d["team_id"] == "acme" && d["auth_type"] == "oauth"));
    assert_eq!(calls, 1, "one discover call");

    // An introspection answer with an empty client id is a client unknown, not a client named "": the activity
    // event requires a name (BP §8.5-14), and the fake refuses one without. Before, its reports were refused.
    let mut nameless = TokenInfo::new("carol", "acme");
    nameless.client_id = String::new();
    backend.add_token("carol-token", nameless);
    let mut carol = Caller::for_url(format!("{}/mcp", sat.base_url()), Some("carol-token"));
    carol.initialize().await;
    let (activity, _, _) = client_activity(&backend, "user_id", "carol", 1).await;
    assert!(activity.iter().all(|d| d["oauth_client_id"] == "unknown"), "{activity:?}");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// What a client did since the last activity report (every 30 s) is reported at shutdown too: before, the report
/// job stopped with the others and a satellite stopped between two reports lost up to 30 s of activity.
#[tokio::test]
async fn a_clients_activity_since_the_last_report_is_reported_at_shutdown() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let rare_reports = |config: &mut Config| {
        fast(config);
        config.activity_interval = Duration::from_secs(3600);
    };
    let dir = tempfile::tempdir().unwrap();
    let sat = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, dir, rare_reports)
        .await
        .expect("managed satellite starts");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.add_token("alice-token", TokenInfo::new("alice", "acme"));
    let mut caller = Caller::for_url(format!("{}/mcp", sat.base_url()), Some("alice-token"));
    caller.initialize().await;
    let found = caller.tool("discover_mcp_tools", json!({"query": "ok"})).await;
    assert!(found["result"].is_object(), "{found}");
    assert!(sat.satellite.shutdown().await);
    let reported: Vec<_> =
        backend.events().into_iter().filter(|e| e.kind.as_str() == "mcp.client.activity").map(|e| e.data).collect();
    assert!(
        reported.iter().any(|d| d["user_id"] == "alice" && d["tool_call_count"] == 1),
        "alice's call is reported at shutdown: {reported:?}"
    );
    backend.assert_no_violations();
}

#[tokio::test]
async fn garbage_truncated_and_slow_answers_never_stop_serving() {
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    // One entry the satellite must refuse (stdio without args), the rest applied.
    let mut raw = serde_json::to_value(config()).unwrap();
    raw["mcp_servers"]["broken-acme-alice-inst2"] = json!({
        "installation_id": "inst2", "team_id": "acme", "team_slug": "acme", "server_name": "Broken",
        "installation_name": "Broken", "transport_type": "stdio", "command": "python3", "enabled": true,
        "user_id": "alice", "some_future_field": {"x": 1}
    });
    backend.set_config_raw(raw);
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(sat.satellite.manager().get(&satellite::model::ProcessId::from("broken-acme-alice-inst2")).is_none());

    // Garbage and truncated poll answers are failed polls (backoff), then commands still get through.
    backend.fault_next(Endpoint::Commands, Fault::Garbage, 1);
    backend.fault_next(Endpoint::Commands, Fault::Truncated, 1);
    backend.push_command(Command::new(
        "cmd-after-garbage",
        Priority::Immediate,
        CommandKind::Unknown { command_type: "noop".into(), payload: json!({}) },
    ));
    // A config answer that is garbage fails that configure command with the reason; serving goes on.
    backend.fault_next(Endpoint::Config, Fault::Garbage, 1);
    backend.push_command(Command::new(
        "cmd-garbage-config",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload::default()),
    ));
    let results = wait_until(DEADLINE, "both commands answered", || async {
        let a = backend.results_for("cmd-after-garbage");
        let b = backend.results_for("cmd-garbage-config");
        (!a.is_empty() && !b.is_empty()).then_some((a, b))
    })
    .await;
    assert_eq!(results.0[0].status, ResultStatus::Failed);
    assert_eq!(results.1[0].status, ResultStatus::Failed);
    assert!(results.1[0].error_message.as_deref().unwrap_or("").contains("config"), "{:?}", results.1[0]);
    let reported = wait_until(DEADLINE, "a config.error event", || async {
        backend.events().into_iter().find(|e| e.kind.as_str() == "config.error")
    })
    .await;
    assert_eq!(
        reported.data["error_type"],
        "server_error",
        "an answer that is not JSON: {}",
        Value::Object(reported.data.clone())
    );
    assert_eq!(reported.data["status_code"], Value::Null);
    assert_eq!(
        sat.satellite.manager().get(&satellite::model::ProcessId::from(ALICE)).unwrap().status().status,
        InstanceStatus::Online
    );

    // A config answer over the 32 MB cap is refused whole; the running config stays.
    let mut huge = serde_json::to_value(config()).unwrap();
    let padding = "x".repeat(1024 * 1024);
    for n in 0..34 {
        huge["mcp_servers"][format!("pad-acme-alice-p{n}")] = json!({
            "installation_id": format!("p{n}"), "team_id": "acme", "team_slug": "acme", "server_name": "Pad",
            "installation_name": "Pad", "transport_type": "stdio", "command": "python3", "args": ["x"],
            "env": {"PADDING": padding}, "enabled": true, "user_id": "alice"
        });
    }
    backend.set_config_raw(huge);
    backend.push_command(Command::new(
        "cmd-huge",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload::default()),
    ));
    let huge = first_result(&backend, "cmd-huge").await;
    assert_eq!(huge.status, ResultStatus::Failed);
    assert!(huge.error_message.as_deref().unwrap_or("").contains("larger than"), "{:?}", huge.error_message);
    assert_eq!(sat.satellite.manager().instances().len(), 2, "the last good config keeps serving");

    // A backend that hangs longer than the heartbeat timeout: beats fail, the satellite keeps serving calls.
    backend.set_latency_for(Endpoint::Heartbeat, Duration::from_secs(12));
    let alice = sat.satellite.manager().get(&satellite::model::ProcessId::from(ALICE)).unwrap();
    let answer =
        sat.satellite.manager().call(&alice, "tools/call", Some(json!({"name": "ok"})), Duration::from_secs(10)).await;
    assert!(answer.is_ok());
    backend.set_latency_for(Endpoint::Heartbeat, Duration::ZERO);
    assert!(sat.satellite.shutdown().await);
}

/// Live children of `parent` (from /proc).
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?;
            let ppid: u32 = fields.next()?.parse().ok()?;
            // The satellite's process-tree watchdog is its child too, but no MCP server.
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let watchdog = cmdline.split(|b| *b == 0).nth(1) == Some(b"reaper".as_slice());
            (ppid == parent && state != "Z" && !watchdog).then_some(pid)
        })
        .collect()
}

fn spawn_managed_binary(backend: &FakeBackend, dir: &std::path::Path) -> tokio::process::Child {
    spawn_managed_binary_with(backend, dir, free_port(), &[])
}

/// The satellite binary in managed mode in `dir` on `port`, with `extra` environment (a shared database, say).
pub(crate) fn spawn_managed_binary_with(
    backend: &FakeBackend,
    dir: &std::path::Path,
    port: u16,
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    tokio::process::Command::new(satellite_exe())
        .envs(extra.iter().copied())
        .arg("serve")
        .current_dir(dir)
        .env_remove("SATELLITE_CONFIG")
        .env("PORT", port.to_string())
        .env("DEPLOYSTACK_BACKEND_URL", backend.url())
        .env("DEPLOYSTACK_SATELLITE_NAME", "kill-nine-satellite")
        .env("DEPLOYSTACK_REGISTRATION_TOKEN", FakeBackend::REGISTRATION_TOKEN)
        .env("EVENT_BATCH_INTERVAL_MS", "100")
        .env("SATELLITE_HEARTBEAT_INTERVAL_MS", "200")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn satellite")
}

#[tokio::test]
async fn events_queued_when_the_satellite_is_killed_are_delivered_after_it_restarts() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let dir = tempfile::tempdir().unwrap();
    let mut satellite = spawn_managed_binary(&backend, dir.path());
    let sat_pid = satellite.id().unwrap();
    wait_until(DEADLINE, "alice online at the backend", || async {
        (delivered(&backend, "mcp.server.status_changed", Some("online"), "alice") > 0).then_some(())
    })
    .await;
    let first_children = wait_until(DEADLINE, "two server processes", || async {
        let c = children_of(sat_pid);
        (c.len() == 2).then_some(c)
    })
    .await;

    // Backend away; a server crashes (its events are queued), then the satellite itself is killed.
    backend.go_down().await;
    let crashes_before = backend.events().iter().filter(|e| e.kind.as_str() == "mcp.server.crashed").count();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first_children[0] as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    wait_until(DEADLINE, "the crashed server restarted", || async {
        let now = children_of(sat_pid);
        (now.len() == 2 && !now.contains(&first_children[0])).then_some(())
    })
    .await;
    satellite.start_kill().unwrap();
    satellite.wait().await.unwrap();
    wait_until(DEADLINE, "no server outlives the satellite", || async {
        first_children.iter().chain(children_of(sat_pid).iter()).all(|p| !process_exists(*p)).then_some(())
    })
    .await;

    // Back up: the restarted satellite sends what the killed one had queued.
    backend.come_back().await;
    let mut again = spawn_managed_binary(&backend, dir.path());
    let crashed = wait_until(DEADLINE, "the queued crash event delivered", || async {
        let crashed: Vec<_> =
            backend.events().into_iter().filter(|e| e.kind.as_str() == "mcp.server.crashed").collect();
        (crashed.len() > crashes_before).then_some(crashed)
    })
    .await;
    assert_eq!(crashed.last().unwrap().data["signal"], "SIGKILL");
    assert_eq!(backend.calls(Endpoint::Register).len(), 1, "the restart used the stored credentials");
    again.start_kill().unwrap();
    again.wait().await.unwrap();
    backend.assert_no_violations();
}

#[tokio::test]
async fn two_teams_of_three_with_stdio_and_http_instances_then_modified_and_removed() {
    let http = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    let entries = |stdio_args_for: &dyn Fn(&str) -> Vec<String>, drop_globex_http: bool| {
        let mut all = Vec::new();
        for team in ["acme", "globex"] {
            for n in 1..=3 {
                let user = format!("{team}-u{n}");
                all.push((
                    format!("plain-{team}-{user}-s-{team}"),
                    McpServerEntry {
                        installation_id: format!("s-{team}"),
                        team_id: team.into(),
                        team_slug: team.into(),
                        server_name: "Plain".into(),
                        server_slug: Some("plain".into()),
                        installation_name: "Plain".into(),
                        transport_type: Some("stdio".into()),
                        command: Some("python3".into()),
                        args: Some(stdio_args_for(&user)),
                        enabled: Some(true),
                        user_id: user.clone(),
                        ..Default::default()
                    },
                ));
                if drop_globex_http && team == "globex" {
                    continue;
                }
                all.push((
                    format!("demo-{team}-{user}-h-{team}"),
                    McpServerEntry {
                        installation_id: format!("h-{team}"),
                        team_id: team.into(),
                        team_slug: team.into(),
                        server_name: "Demo".into(),
                        server_slug: Some("demo".into()),
                        installation_name: "Demo".into(),
                        transport_type: Some("http".into()),
                        url: Some(http.url("/mcp").to_string()),
                        timeout: Some(45000.0),
                        enabled: Some(true),
                        user_id: user.clone(),
                        ..Default::default()
                    },
                ));
            }
        }
        ConfigResponse::from_entries(all)
    };
    let plain = |_: &str| vec![script.clone(), "plain".into()];
    backend.set_config(&entries(&plain, false));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    let manager = sat.satellite.manager().clone();
    wait_until(DEADLINE, "12 instances online", || async {
        let all = manager.instances();
        (all.len() == 12 && all.iter().all(|i| i.status().status == InstanceStatus::Online)).then_some(())
    })
    .await;
    let pid_of = |id: &str| manager.get(&satellite::model::ProcessId::from(id)).and_then(|i| i.pid());
    let changed = "plain-acme-acme-u2-s-acme";
    let untouched = "plain-acme-acme-u1-s-acme";
    let (changed_pid, untouched_pid) = (pid_of(changed).unwrap(), pid_of(untouched).unwrap());

    // One user's args change and globex's HTTP installation goes away; a configure command announces it.
    let modified = |user: &str| {
        let mut args = vec![script.clone(), "plain".into()];
        if user == "acme-u2" {
            args.push("--verbose".into());
        }
        args
    };
    backend.set_config(&entries(&modified, true));
    backend.push_command(refresh("cmd-update"));
    let result = first_result(&backend, "cmd-update").await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.result.as_ref().unwrap()["total_servers"], 9);
    wait_until(DEADLINE, "the changed instance restarted", || async {
        pid_of(changed).filter(|p| *p != changed_pid).map(|_| ())
    })
    .await;
    assert_eq!(pid_of(untouched), Some(untouched_pid), "an unchanged instance keeps its process");
    assert_eq!(manager.instances().len(), 9);
    assert!(manager.instances().iter().all(|i| i.spec().installation_id.0 != "h-globex"));
    assert!(!process_exists(changed_pid));
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// The `oauth1` installation of a remote server at `url` that needs each user's OAuth token, for `user`.
fn oauth_entry(url: &str, user: &str) -> McpServerEntry {
    McpServerEntry {
        installation_id: "oauth1".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Demo".into(),
        server_slug: Some("demo".into()),
        installation_name: "Demo".into(),
        transport_type: Some("http".into()),
        url: Some(url.to_owned()),
        timeout: Some(45000.0),
        enabled: Some(true),
        requires_oauth: Some(true),
        user_id: user.into(),
        ..Default::default()
    }
}

/// The backend's credential check (BP §6.2) of `installation`, as it sends it.
fn credential_check(id: &str, installation: &str) -> Command {
    use satellite::backend::wire::{CheckType, HealthCheckPayload};
    Command::new(
        id,
        Priority::Immediate,
        CommandKind::HealthCheck(HealthCheckPayload {
            common: CommonPayload { installation_id: Some(installation.into()), ..Default::default() },
            check_type: Some(CheckType::CredentialValidation),
        }),
    )
}

/// `user`'s token for `oauth1`, as the backend's token endpoints hold it: its key, a valid status, the token.
fn oauth_grant(
    user: &str,
    access: &str,
) -> (
    satellite::backend::wire::OAuthTokenRequest,
    satellite::backend::wire::OAuthTokenStatus,
    satellite::backend::wire::OAuthToken,
) {
    use satellite::backend::wire::{Credential, OAuthToken, OAuthTokenRequest, OAuthTokenStatus};
    (
        OAuthTokenRequest { installation_id: "oauth1".into(), user_id: user.into(), team_id: "acme".into() },
        OAuthTokenStatus { exists: true, expired: Some(false), expires_at: None, can_refresh: Some(true) },
        OAuthToken {
            access_token: Credential::new(access),
            refresh_token: None,
            token_type: Some("Bearer".into()),
            expires_at: None,
            scope: None,
        },
    )
}

#[tokio::test]
async fn remote_servers_needing_oauth_get_each_users_token_and_reauthorisation_brings_them_back() {
    let http = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let url = http.url("/mcp").to_string();
    backend.set_config(&ConfigResponse::from_entries([
        ("demo-acme-alice-oauth1", oauth_entry(&url, "alice")),
        ("demo-acme-bob-oauth1", oauth_entry(&url, "bob")),
    ]));
    let (key, status, token) = oauth_grant("alice", "ya29.alice");
    backend.add_oauth_token(key, status, Some(token));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, "demo-acme-alice-oauth1", InstanceStatus::Online).await;
    let bob = wait_status(&sat, "demo-acme-bob-oauth1", InstanceStatus::RequiresReauth).await;
    assert!(bob.message.unwrap().starts_with("OAuth authorization required for Demo"), "bob has not authorised yet");
    let asked: Vec<Value> = backend.calls(Endpoint::TokenStatus).into_iter().map(|c| c.body).collect();
    assert!(asked
        .iter()
        .any(|b| b["user_id"] == "alice" && b["installation_id"] == "oauth1" && b["team_id"] == "acme"));
    assert_eq!(backend.calls(Endpoint::TokenRetrieve).iter().filter(|c| c.body["user_id"] == "alice").count(), 1);

    // Bob authorises in the dashboard; the backend announces it with a configure.
    let (key, status, token) = oauth_grant("bob", "ya29.bob");
    backend.add_oauth_token(key, status, Some(token));
    backend.push_command(refresh("cmd-reauth"));
    wait_status(&sat, "demo-acme-bob-oauth1", InstanceStatus::Online).await;

    // The backend's credential check: every member's instance answers with its token.
    for (id, installation) in [("cmd-check", "oauth1"), ("cmd-check-missing", "nope")] {
        backend.push_command(credential_check(id, installation));
    }
    let (ok, missing) = wait_until(DEADLINE, "both credential checks answered", || async {
        let ok = backend.results_for("cmd-check").into_iter().next()?;
        let missing = backend.results_for("cmd-check-missing").into_iter().next()?;
        Some((ok, missing))
    })
    .await;
    assert_eq!(ok.result.unwrap()["credential_validation"]["valid"], true);
    let missing = missing.result.unwrap();
    assert_eq!(missing["credential_validation"]["valid"], false);
    assert_eq!(missing["credential_validation"]["error"], "Server configuration not found on this satellite");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn legacy_sse_connections_are_reported_when_opened_and_closed() {
    use futures::StreamExt;
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.add_token("alice-token", TokenInfo::new("alice", "acme"));
    let http = reqwest::Client::new();
    let stream = http
        .get(format!("{}/sse", sat.base_url()))
        .bearer_auth("alice-token")
        .header("user-agent", "Cursor/0.42")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut body = stream.bytes_stream();
    let mut text = String::new();
    while !text.contains("/message?session=") {
        text.push_str(&String::from_utf8_lossy(&body.next().await.expect("endpoint event").unwrap()));
    }
    let path = text.split("data:").nth(1).unwrap().lines().next().unwrap().trim().to_owned();
    // Neither calls a tool: a body cut off mid-message, and "tools/call" only as a parameter's value.
    let message = |body: String| {
        http.post(format!("{}{path}", sat.base_url()))
            .bearer_auth("alice-token")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(message("{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\"".into()).await.unwrap().status(), 400);
    let decoy = json!({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"method": "tools/call"}});
    assert!(message(decoy.to_string()).await.unwrap().status().is_success());
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "execute_mcp_tool", "arguments": {"tool_path": "plain:ok", "arguments": {}}}});
    let posted =
        http.post(format!("{}{path}", sat.base_url())).bearer_auth("alice-token").json(&call).send().await.unwrap();
    assert!(posted.status().is_success());
    let connected = wait_until(DEADLINE, "mcp.client.connected", || async {
        backend.events().into_iter().find(|e| e.kind.as_str() == "mcp.client.connected")
    })
    .await;
    assert_eq!(connected.data["client_type"], "cursor");
    assert_eq!(connected.data["team_id"], "acme");
    assert_eq!(connected.data["transport"], "sse");
    // The legacy SSE caller's requests count as client activity like any other (BP §8.5-14).
    let activity = wait_until(DEADLINE, "mcp.client.activity for the SSE caller", || async {
        backend.events().into_iter().find(|e| {
            e.kind.as_str() == "mcp.client.activity" && e.data["user_id"] == "alice" && e.data["tool_call_count"] == 1
        })
    })
    .await;
    assert_eq!(activity.data["team_id"], "acme");
    assert_eq!(activity.data["session_id"], connected.data["session_id"], "the stream's session, by reference");
    drop(body);
    let gone = wait_until(DEADLINE, "mcp.client.disconnected", || async {
        backend.events().into_iter().find(|e| e.kind.as_str() == "mcp.client.disconnected")
    })
    .await;
    assert_eq!(gone.data["session_id"], connected.data["session_id"]);
    // The events pair connect and disconnect but never carry the id itself, which would let whoever reads
    // them (the backend, any process that reads the outbox) use the session.
    let session = path.split("session=").nth(1).unwrap();
    for data in [&connected.data, &gone.data] {
        let text = serde_json::to_string(data).unwrap();
        assert!(!text.contains(session), "{text}");
    }
    assert_eq!(gone.data["tool_execution_count"], 1);
    assert_eq!(gone.data["disconnect_reason"], "client_close");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// `security.auth.failed` is rate-limited per source (BP §8.5-20): a burst of refusals from one address is one
/// event, another address gets its own; neither carries the token, only its hash prefix.
#[tokio::test]
async fn refused_tokens_are_reported_once_per_source_without_the_token() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    // The marker command below is picked up within 2 s, not at the idle 60 s.
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    // The start-up configuration emits a `config.refreshed` of its own; the marker below is the next one.
    let refreshed = || backend.events().into_iter().filter(|e| e.kind.as_str() == "config.refreshed").count();
    wait_until(DEADLINE, "the start-up config.refreshed", || async { (refreshed() == 1).then_some(()) }).await;
    const STOLEN: &str = "stolen-token-0123456789abcdef";
    let from =
        |ip: [u8; 4]| reqwest::Client::builder().local_address(std::net::IpAddr::from(ip)).build().expect("client");
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    for (client, times) in [(from([127, 0, 0, 1]), 5), (from([127, 0, 0, 2]), 1)] {
        for _ in 0..times {
            let refused = client
                .post(format!("{}/mcp", sat.base_url()))
                .bearer_auth(STOLEN)
                // What a guesser may write to hide behind: kept apart, never taken for the source.
                .header("x-forwarded-for", "203.0.113.99")
                .header("accept", "application/json, text/event-stream")
                .json(&ping)
                .send()
                .await
                .expect("answered");
            assert_eq!(refused.status(), 401);
        }
    }
    // Events leave the outbox in order: once an event emitted after the refusals arrived, so did all of theirs.
    backend.push_command(refresh("cmd-marker"));
    wait_until(DEADLINE, "config.refreshed after the refusals", || async { (refreshed() == 2).then_some(()) }).await;
    let failures: Vec<Value> = backend
        .events()
        .into_iter()
        .filter(|e| e.kind.as_str() == "security.auth.failed")
        .map(|e| Value::Object(e.data))
        .collect();
    let sources: Vec<&str> = failures.iter().filter_map(|f| f["ip_address"].as_str()).collect();
    assert_eq!(sources, ["127.0.0.1", "127.0.0.2"], "one event per source: {failures:?}");
    assert!(failures.iter().all(|f| f["forwarded_for"] == "203.0.113.99"), "{failures:?}");
    let prefix = &satellite::config::sha256_hex(STOLEN)[..8];
    for failure in &failures {
        assert_eq!(failure["token_sha256_prefix"], prefix);
        assert!(!failure.to_string().contains(STOLEN), "never the token: {failure}");
    }
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A managed satellite whose config gives alice's instance a path and an instance token, online, and alice
/// connected to it by that token (`?token=`).
async fn alice_by_instance_token() -> (FakeBackend, TestSatellite, Caller) {
    const TOKEN: &str = "ds_inst_a11ce0123456789abcdef0123456789abcdef0123456789abcdef01234567";
    let backend = FakeBackend::start().await;
    let mut config = config();
    let alice = config.mcp_servers.get_mut(ALICE).expect("alice's entry");
    alice["instance_path"] = json!("alice-plain");
    alice["instance_token_hash"] = json!(satellite::config::sha256_hex(TOKEN));
    backend.set_config(&config);
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let alice = Caller::connect(&sat, &format!("/i/alice-plain/mcp?token={TOKEN}"), None).await;
    (backend, sat, alice)
}

#[tokio::test]
async fn instance_token_callers_are_reported_with_their_requests_and_tool_calls() {
    let (backend, sat, alice) = alice_by_instance_token().await;
    let called = alice.tool("ok", json!({})).await;
    assert!(called["result"].is_object(), "{called}");
    let (status, listed) = alice.call("tools/list", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    // Neither of these calls a tool: a body that is not JSON, and "tools/call" only as a parameter's value.
    let (status, _, unreadable) = alice.post_raw("{\"method\":\"tools/call\"".to_owned(), &[]).await;
    assert_eq!(status, 400, "{unreadable}");
    let (_, decoy) = alice.call("ping", json!({"method": "tools/call"})).await;
    assert!(decoy.get("result").is_some() || decoy.get("error").is_some(), "{decoy}");

    let (activity, requests, calls) = client_activity(&backend, "auth_type", "instance_token", 5).await;
    assert_eq!((requests, calls), (5, 1), "initialize, a tool call, a listing, two that call nothing: {activity:?}");
    assert!(activity.iter().all(|d| d["user_id"] == "alice" && d["team_id"] == "acme"), "{activity:?}");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// One event bigger than the backend takes (its 1 MiB body limit answers 413) must not stop the events after it:
/// the satellite holds that event (kept in the outbox with the reason, never sent) and sends the rest.
#[tokio::test]
async fn an_event_too_large_for_the_backend_is_held_and_later_events_still_arrive() {
    let (backend, sat, alice) = alice_by_instance_token().await;
    // A request log of a call with a megabyte of arguments, as they were logged before a request log kept at most
    // `logcapture::MAX_LOGGED_TEXT_BYTES` of each (an outbox written then may still hold one); a catalogue of that
    // size is the other such event.
    let blob = "x".repeat(crate::common::fake_backend::BODY_LIMIT + 64 * 1024);
    let entry = json!({"user_id": "alice", "tool_name": "plain:ok", "tool_params": {"blob": blob},
        "response_time_ms": 1, "success": true, "timestamp": satellite::model::iso(chrono::Utc::now())});
    let data = json!({"installation_id": "inst-alice", "team_id": "acme", "requests": [entry]}).to_string();
    let oversized = satellite::store::NewEvent {
        event_type: "mcp.request.logs",
        emitted_at: satellite::model::iso(chrono::Utc::now()),
        data: data.into(),
        process_id: Some(ALICE),
        held: None,
    };
    sat.satellite.store().outbox().append_events(&[oversized]).await.expect("written to the outbox");
    let held = wait_until(DEADLINE, "the oversized request log held in the outbox", || async {
        let events = sat.satellite.store().outbox().events(None, 0, 1_000).await.unwrap();
        events.into_iter().find(|e| e.held.as_deref().is_some_and(|why| why.contains("too large")))
    })
    .await;
    assert_eq!(held.event_type, "mcp.request.logs");
    assert!(backend.calls(Endpoint::Events).iter().any(|c| c.status == 413), "the backend did refuse it");

    let called = alice.tool("ok", json!({"marker": "after-the-big-one"})).await;
    assert!(called["result"].is_object(), "{called}");
    wait_until(DEADLINE, "the next call's request log delivered", || async {
        backend
            .events()
            .iter()
            .any(|e| {
                e.kind.as_str() == "mcp.request.logs"
                    && Value::Object(e.data.clone()).to_string().contains("after-the-big-one")
            })
            .then_some(())
    })
    .await;
    assert!(
        !backend.events().iter().any(|e| Value::Object(e.data.clone()).to_string().contains(&blob[..4096])),
        "never half-sent"
    );
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// The backend failing for a moment on the token endpoints (5xx, 429, a timeout) says nothing about the user's
/// token: the instance is retried like an unreachable server and comes online, and nobody is asked to
/// re-authorise (SB §11.3). Only "no token" means re-authorise.
#[tokio::test]
async fn a_backend_failing_for_a_moment_on_the_token_endpoints_does_not_ask_for_reauthorisation() {
    let http = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    let entry = oauth_entry(http.url("/mcp").as_str(), "alice");
    backend.set_config(&ConfigResponse::from_entries([("demo-acme-alice-oauth1", entry)]));
    let (key, status, token) = oauth_grant("alice", "ya29.alice");
    backend.add_oauth_token(key, status, Some(token));
    backend.fail_next(Endpoint::TokenStatus, 503, 1);
    backend.fail_next(Endpoint::TokenRetrieve, 429, 1);
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, "demo-acme-alice-oauth1", InstanceStatus::Online).await;
    // Every status it went through, as recorded (in the same transaction as the events that report them).
    let process = satellite::model::ProcessId::from("demo-acme-alice-oauth1");
    let history = sat.satellite.store().statuses().status_history(&process).await.unwrap();
    let statuses: Vec<&str> = history.iter().map(|r| r.status.as_str()).collect();
    assert!(statuses.contains(&"error"), "the failed connect was recorded: {statuses:?}");
    assert!(!statuses.contains(&"requires_reauth"), "{statuses:?}");
    let failed: Vec<u16> = [Endpoint::TokenStatus, Endpoint::TokenRetrieve]
        .into_iter()
        .flat_map(|endpoint| backend.calls(endpoint))
        .map(|c| c.status)
        .filter(|s| *s != 200)
        .collect();
    assert_eq!(failed, [503, 429], "both endpoints failed once and were asked again");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A first config fetch that fails (BP §1.9: the satellite starts with no servers) is asked again until it
/// succeeds, without waiting for a command that only an installation change would bring.
#[tokio::test]
async fn a_first_config_fetch_that_fails_is_retried_until_the_servers_run() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.fail_next(Endpoint::Config, 503, 2);
    let sat = start_online(&backend).await;
    let fetched: Vec<u16> = backend.calls(Endpoint::Config).into_iter().map(|c| c.status).collect();
    assert_eq!(fetched[..3], [503, 503, 200], "asked again after each failure: {fetched:?}");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A config entry the satellite cannot read this time (here a newer backend's `timeout` as a string) is refused and
/// reported, but it is not an uninstall: the instance it ran goes on as it was. Before, the refused key counted as
/// removed: alice's server was stopped and its tools dropped while the backend still listed it.
#[tokio::test]
async fn an_entry_that_cannot_be_read_leaves_its_running_instance_alone() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let sat = start_online(&backend).await;
    let alice = sat.satellite.manager().get(&satellite::model::ProcessId::from(ALICE)).expect("alice's instance");
    let pid = alice.pid().expect("alice's process");

    let mut odd = serde_json::to_value(config()).expect("config as JSON");
    odd["mcp_servers"][ALICE]["timeout"] = json!("45000");
    backend.set_config_raw(odd);
    backend.push_command(refresh("c-odd"));
    assert_eq!(first_result(&backend, "c-odd").await.status, ResultStatus::Completed);
    // The refresh's own event comes after anything its apply emitted: once it is here, a stop would be too.
    let refreshed = wait_until(DEADLINE, "the refresh reported", || async {
        backend.events().into_iter().find(|e| e.kind.as_str() == "config.refreshed" && e.data["rejected_count"] == 1)
    })
    .await;
    assert_eq!(delivered(&backend, "mcp.server.stopped", None, "alice"), 0, "{refreshed:?}");
    let now = sat.satellite.manager().get(&satellite::model::ProcessId::from(ALICE)).expect("alice's instance");
    assert!(std::sync::Arc::ptr_eq(&alice, &now), "the same instance runs");
    assert_eq!((now.status().status, now.pid()), (InstanceStatus::Online, Some(pid)));
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A `configure` whose config fetch fails is answered `failed`, and the backend does not send it again: the
/// satellite fetches again on its own until a config is applied. Before, only the first fetch was retried, and
/// bob's new instance waited for the next unrelated `configure`.
#[tokio::test]
async fn a_configure_whose_fetch_fails_is_applied_once_the_backend_answers() {
    let backend = FakeBackend::start().await;
    let mut alice_only = config();
    alice_only.mcp_servers.remove(BOB);
    backend.set_config(&alice_only);
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(sat.satellite.manager().get(&satellite::model::ProcessId::from(BOB)).is_none());

    backend.set_config(&config());
    backend.fail_next(Endpoint::Config, 503, 1);
    backend.push_command(refresh("c-bob"));
    assert_eq!(first_result(&backend, "c-bob").await.status, ResultStatus::Failed, "the fetch failed");
    wait_status(&sat, BOB, InstanceStatus::Online).await;
    let fetched: Vec<u16> = backend.calls(Endpoint::Config).into_iter().map(|c| c.status).collect();
    assert_eq!(fetched[1..3], [503, 200], "fetched again after the failure: {fetched:?}");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// A 2xx is the whole answer of health, the heartbeat and events (BP §1.5, §3.4, §8.3): one whose body the
/// satellite cannot read (not JSON, cut short) is still accepted. Before, a cut events answer re-sent a batch the
/// backend had already processed (each event twice on the dashboard), a cut verification heartbeat threw the
/// working credentials away and registered again, and a health answer that is not JSON stopped the start.
#[tokio::test]
async fn a_2xx_answer_that_cannot_be_read_is_still_a_2xx() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    let TestSatellite { satellite, dir: first, .. } =
        start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    assert!(satellite.shutdown().await);
    let before = backend.events().len();

    backend.fault_next(Endpoint::Health, Fault::Garbage, 1);
    backend.fault_next(Endpoint::Heartbeat, Fault::Truncated, 1);
    backend.fault_next(Endpoint::Events, Fault::Truncated, 1);
    backend.fault_next(Endpoint::Events, Fault::CutConnection, 1);
    let sat = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempdir_at(first.path()), fast)
        .await
        .expect("starts: the health answer that is not JSON and the cut heartbeat are 2xx");
    assert_eq!(backend.calls(Endpoint::Register).len(), 1, "the stored credentials were kept");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    wait_until(DEADLINE, "the outbox drained after a cut events answer", || async {
        let drained = sat.satellite.store().outbox().event_count().await.ok() == Some(0);
        (drained && backend.events().len() > before).then_some(())
    })
    .await;
    // Stopped first: its last upload sends whatever is still kept, so a batch taken as failed shows up twice.
    assert!(sat.satellite.shutdown().await);
    let mut seen = std::collections::HashMap::new();
    for event in &backend.events()[before..] {
        let key = (event.kind.as_str().to_owned(), event.timestamp.clone(), Value::Object(event.data.clone()));
        *seen.entry(key).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).map(|(k, n)| (&k.0, *n)).collect();
    assert!(twice.is_empty(), "events that arrived more than once: {twice:?}");
    backend.take_violations();
}

/// Commands of odd shapes (BP §0, §4.3, §6.5): one whose `command_type` is null or whose id is a number gets its
/// `failed` result, one that is not an object at all is passed over, and the commands after them run. Before, one
/// such command failed every poll, and, redelivered at the head of the queue, stopped every command after it
/// (installs, removals, revocations) until the backend gave up on it.
#[tokio::test]
async fn an_odd_command_is_answered_or_passed_over_and_the_ones_after_it_run() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.push_raw_command(json!(null));
    backend
        .push_raw_command(json!({"id": "c-null-type", "command_type": null, "priority": "immediate", "payload": {}}));
    backend.push_raw_command(json!({"id": 42, "command_type": "noop", "priority": 7, "payload": "x"}));
    backend.push_command(refresh("c-after"));
    for id in ["c-null-type", "42", "c-after"] {
        let result = wait_until(DEADLINE, &format!("a result for {id}"), || async {
            backend.results_for(id).into_iter().next()
        })
        .await;
        let expected = if id == "c-after" { ResultStatus::Completed } else { ResultStatus::Failed };
        assert_eq!(result.status, expected, "{id}: {result:?}");
    }
    assert!(sat.satellite.shutdown().await);
    backend.take_violations();
}

/// A legacy `kill` names its server by `server_name` (BP §6.3): the config key names one user's instance, a
/// server's name or slug its installation. Before, only `installation_id` was read and such a kill was failed
/// ("installation_id is required"), leaving the server running.
#[tokio::test]
async fn a_legacy_kill_by_server_name_stops_what_it_names() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let sat = start_online(&backend).await;
    let kill = |id: &str, name: &str| {
        let common = CommonPayload { server_name: Some(name.into()), ..Default::default() };
        Command::new(id, Priority::Immediate, CommandKind::Kill(TargetPayload { common }))
    };
    backend.push_command(kill("c-kill-alice", ALICE));
    backend.push_command(kill("c-kill-nothing", "no-such-server"));
    let killed = first_result(&backend, "c-kill-alice").await;
    assert_eq!(killed.status, ResultStatus::Completed, "{killed:?}");
    let unknown = first_result(&backend, "c-kill-nothing").await;
    assert_eq!(unknown.status, ResultStatus::Failed);
    assert!(unknown.error_message.as_deref().unwrap_or("").contains("no server named no-such-server"), "{unknown:?}");
    let alice = satellite::model::ProcessId::from(ALICE);
    wait_until(DEADLINE, "alice's instance stopped", || {
        let running = sat.satellite.manager().get(&alice).is_some_and(|i| i.status().status == InstanceStatus::Online);
        async move { (!running).then_some(()) }
    })
    .await;
    let bob = sat.satellite.manager().get(&satellite::model::ProcessId::from(BOB)).map(|i| i.status().status);
    assert_eq!(bob, Some(InstanceStatus::Online), "bob's instance of the same installation is not touched");

    // The server's slug names the installation: every member's instance of it.
    backend.push_command(kill("c-kill-plain", "plain"));
    assert_eq!(first_result(&backend, "c-kill-plain").await.status, ResultStatus::Completed);
    wait_until(DEADLINE, "bob's instance stopped", || {
        let bob = satellite::model::ProcessId::from(BOB);
        let running = sat.satellite.manager().get(&bob).is_some_and(|i| i.status().status == InstanceStatus::Online);
        async move { (!running).then_some(()) }
    })
    .await;
    assert!(sat.satellite.shutdown().await);
    backend.take_violations();
}

/// A `kill` stops an instance with no automatic restart (BP §6.3), so a later `mcp_recovery` of its installation,
/// which says the remote server is reachable again, leaves it stopped and says so; a `restart` starts it. Before, the
/// recovery connected it again and brought it back online behind the admin's back.
#[tokio::test]
async fn a_recovery_leaves_a_killed_remote_instance_stopped() {
    let http = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let mut entry = oauth_entry(http.url("/mcp").as_str(), "alice");
    entry.requires_oauth = None;
    const REMOTE: &str = "demo-acme-alice-oauth1";
    backend.set_config(&ConfigResponse::from_entries([(REMOTE, entry)]));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, REMOTE, InstanceStatus::Online).await;
    let common = || CommonPayload { installation_id: Some("oauth1".into()), ..Default::default() };
    backend.push_command(Command::new(
        "c-kill",
        Priority::Immediate,
        CommandKind::Kill(TargetPayload { common: common() }),
    ));
    assert_eq!(first_result(&backend, "c-kill").await.status, ResultStatus::Completed);
    wait_status(&sat, REMOTE, InstanceStatus::Offline).await;

    let recovery = ConfigurePayload {
        common: CommonPayload { event: Some("mcp_recovery".into()), ..common() },
        ..Default::default()
    };
    backend.push_command(Command::new("c-recover", Priority::Immediate, CommandKind::Configure(recovery)));
    let recovered = first_result(&backend, "c-recover").await;
    assert_eq!(recovered.status, ResultStatus::Completed, "{recovered:?}");
    let answer = serde_json::to_value(&recovered).unwrap_or_default();
    assert_eq!(answer["result"]["stopped"][0]["server_name"], REMOTE, "{answer}");
    let instance = sat.satellite.manager().get(&satellite::model::ProcessId::from(REMOTE)).expect("instance");
    assert_eq!(instance.status().status, InstanceStatus::Offline, "still stopped after the recovery");

    let restart = RestartPayload { common: common(), reason: Some("manual_restart".into()) };
    backend.push_command(Command::new("c-restart", Priority::Immediate, CommandKind::Restart(restart)));
    assert_eq!(first_result(&backend, "c-restart").await.status, ResultStatus::Completed);
    wait_status(&sat, REMOTE, InstanceStatus::Online).await;
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// The heartbeat's running instances carry the backend's instance row id (BP §3.3, the `instance_id` of the
/// config entry), "unknown" when it sent none. Before, the process id went there, which matches no row.
#[tokio::test]
async fn the_heartbeat_names_instances_by_the_backends_instance_id() {
    let backend = FakeBackend::start().await;
    let mut config = config();
    if let Some(entry) = config.mcp_servers.get_mut(ALICE) {
        entry["instance_id"] = json!("inst_8f2kA1");
    }
    backend.set_config(&config);
    let sat = start_online(&backend).await;
    let reported = wait_until(DEADLINE, "a heartbeat with both running instances", || async {
        backend.heartbeats().into_iter().rev().find_map(|beat| {
            let instances = beat.pointer("/mcp_status/instances")?.as_array()?.clone();
            let by_user =
                |user: &str| instances.iter().find(|i| i["user_id"] == user).map(|i| i["instance_id"].clone());
            Some((by_user("alice")?, by_user("bob")?))
        })
    })
    .await;
    assert_eq!(reported, (json!("inst_8f2kA1"), json!("unknown")));
    assert!(sat.satellite.shutdown().await);
    backend.assert_no_violations();
}

/// BP §1 step 8: the heartbeat starts before the first configuration is applied (step 9), with its first beat at
/// once. A registration becomes active with its first beat, and only active satellites get commands, so a beat
/// that waited for the first configuration's servers to start left a new satellite inactive for as long as its
/// slowest server took to answer (minutes with many per-user instances).
#[tokio::test]
async fn the_first_heartbeat_does_not_wait_for_the_first_configurations_servers() {
    let backend = FakeBackend::start().await;
    // A handshake-era server that never answers `initialize` (the probe for 2026-07-28 it refuses with a 404): its
    // instance stays in its handshake for the two minutes it is given.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        while let Ok((mut connection, _)) = silent.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = connection.read(&mut buf).await {
                    seen.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&seen).contains("server/discover") {
                        seen.clear();
                        let refused = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
                        if connection.write_all(refused).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let entry = McpServerEntry { requires_oauth: Some(false), timeout: Some(120_000.0), ..oauth_entry(&url, "alice") };
    backend.set_config(&ConfigResponse::from_entries([("demo-acme-alice-silent", entry)]));
    let sat =
        TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempfile::tempdir().unwrap(), |c| {
            fast(c);
            c.upstream.handshake_timeout = Duration::from_secs(120);
        })
        .await
        .expect("managed satellite starts");
    // Well inside the two minutes the instance's start may take.
    wait_until(Duration::from_secs(20), "a heartbeat", || async { (!backend.heartbeats().is_empty()).then_some(()) })
        .await;
    let statuses = wait_until(DEADLINE, "the instance", || async {
        let statuses: Vec<InstanceStatus> = sat.satellite.manager().instances().iter().map(|i| i.state()).collect();
        (!statuses.is_empty()).then_some(statuses)
    })
    .await;
    assert!(statuses.iter().all(|s| *s != InstanceStatus::Online), "{statuses:?}");
    backend.assert_no_violations();
    held.abort();
    assert!(sat.satellite.shutdown().await);
}

/// The backend's credential check (BP §6.2) of an instance waiting for re-authorisation, which holds no connection
/// to ask on: it connects afresh with the credentials held now. Before the user authorises, the check says the
/// credentials need re-authorising (`needs_reauth`); after, with no configure in between, the check finds them
/// good and the instance comes back `online`, announced (OQ-8). Before, both checks failed with "not connected",
/// without `needs_reauth`, and the instance stayed hidden until some configure came.
#[tokio::test]
async fn a_credential_check_of_an_instance_waiting_for_reauthorisation_connects_afresh() {
    let http = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Immediate, 2)));
    let url = http.url("/mcp").to_string();
    backend.set_config(&ConfigResponse::from_entries([("demo-acme-bob-oauth1", oauth_entry(&url, "bob"))]));
    let sat = start(&backend, tempfile::tempdir().unwrap(), FakeBackend::REGISTRATION_TOKEN).await;
    wait_status(&sat, "demo-acme-bob-oauth1", InstanceStatus::RequiresReauth).await;
    backend.push_command(credential_check("cmd-check-before", "oauth1"));
    let before = wait_until(DEADLINE, "the first check answered", || async {
        backend.results_for("cmd-check-before").into_iter().next()
    })
    .await;
    let before = before.result.unwrap()["credential_validation"].clone();
    assert_eq!((before["valid"].clone(), before["needs_reauth"].clone()), (json!(false), json!(true)), "{before}");

    let (key, status, token) = oauth_grant("bob", "ya29.bob");
    backend.add_oauth_token(key, status, Some(token));
    backend.push_command(credential_check("cmd-check-after", "oauth1"));
    let after = wait_until(DEADLINE, "the second check answered", || async {
        backend.results_for("cmd-check-after").into_iter().next()
    })
    .await;
    let after = after.result.unwrap()["credential_validation"].clone();
    assert_eq!(after["valid"], true, "{after}");
    assert_eq!(
        sat.satellite.manager().get(&"demo-acme-bob-oauth1".into()).map(|i| i.state()),
        Some(InstanceStatus::Online)
    );
    wait_until(DEADLINE, "bob's instance announced online", || async {
        (delivered(&backend, "mcp.server.status_changed", Some("online"), "bob") >= 1).then_some(())
    })
    .await;
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// The time between the first two requests the backend saw at `endpoint` (the first answered with a
/// `Retry-After`), once both came.
async fn first_gap(backend: &FakeBackend, endpoint: Endpoint) -> Duration {
    let calls = wait_until(DEADLINE, "a second request after the one answered with Retry-After", || async {
        let calls = backend.calls(endpoint);
        (calls.len() >= 2).then_some(calls)
    })
    .await;
    assert!(matches!(calls[0].status, 429 | 503), "{endpoint:?}: the first answer was {}", calls[0].status);
    calls[1].at.duration_since(calls[0].at).unwrap_or_default()
}

/// A 429 or 503 with `Retry-After` (RFC 9110 §10.2.3, delta-seconds or an HTTP-date) is waited out by the loop that
/// met it, however short its own backoff: the heartbeat (a beat every second), the configuration fetch (2 s after
/// a failure), the command poll (4 s after a failure at a 2 s cadence) and the event upload (3.1 s after a 429).
/// The backend saw the next request no sooner than it asked. Before, each loop kept its own cadence and called the
/// busy backend again within its own backoff.
#[tokio::test]
async fn every_loop_waits_out_the_retry_after_of_a_busy_backend() {
    let backend = FakeBackend::start().await;
    backend.set_config(&config());
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    // Each loop's first request meets the busy backend; the Retry-After asked is well past its own backoff.
    backend.fault_next(Endpoint::Heartbeat, Fault::RetryAfter(429, "3".into()), 1);
    backend.fault_next(Endpoint::Config, Fault::RetryAfter(503, "6".into()), 1);
    backend.fault_next(Endpoint::Commands, Fault::RetryAt(503, Duration::from_secs(10)), 1);
    backend.fault_next(Endpoint::Events, Fault::RetryAfter(429, "8".into()), 1);
    let every_second = |config: &mut Config| {
        fast(config);
        if let satellite::config::Mode::Managed(m) = &mut config.mode {
            m.heartbeat_interval = Duration::from_secs(1);
        }
    };
    let sat = TestSatellite::managed(
        &backend.url(),
        FakeBackend::REGISTRATION_TOKEN,
        tempfile::tempdir().unwrap(),
        every_second,
    )
    .await
    .expect("managed satellite starts");
    let heartbeat = first_gap(&backend, Endpoint::Heartbeat).await;
    assert!(heartbeat >= Duration::from_millis(2_900), "heartbeat again after {heartbeat:?}, asked 3 s");
    let config_fetch = first_gap(&backend, Endpoint::Config).await;
    assert!(config_fetch >= Duration::from_millis(5_900), "config fetched again after {config_fetch:?}, asked 6 s");
    // An HTTP-date says whole seconds: 10 s after the answer is written as 9-10 s.
    let poll = first_gap(&backend, Endpoint::Commands).await;
    assert!(poll >= Duration::from_millis(8_900), "polled again after {poll:?}, asked until a date 9-10 s ahead");
    let events = first_gap(&backend, Endpoint::Events).await;
    assert!(events >= Duration::from_millis(7_900), "events sent again after {events:?}, asked 8 s");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}
