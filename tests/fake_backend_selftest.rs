//! The FakeBackend proven with plain reqwest before anything builds on it: the whole managed-mode conversation,
//! its refusals, scripted failures, latency, and going down and coming back on the same port.

use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use satellite::backend::wire::*;
use satellite::control::McpServerEntry;
use serde_json::{json, Value};

use crate::common::fake_backend::{Endpoint, FakeBackend, Fault, TokenInfo};

const TS: &str = "2025-01-15T10:30:00.000Z";

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(backend: &FakeBackend) -> Self {
        Self { http: reqwest::Client::new(), base: backend.url() }
    }

    async fn send(&self, method: reqwest::Method, path: &str, key: Option<&str>, body: Option<Value>) -> (u16, String) {
        let mut request =
            self.http.request(method, format!("{}{path}", self.base)).header(CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.expect("the fake backend answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    async fn post(&self, path: &str, key: Option<&str>, body: Value) -> (u16, Value) {
        let (status, text) = self.send(reqwest::Method::POST, path, key, Some(body)).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let (status, text) = self.send(reqwest::Method::GET, path, key, None).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn poll(&self, sid: &str, key: &str) -> CommandsResponse {
        let (status, body) = self.get(&format!("{}?last_poll={TS}&limit=10", path::commands(sid)), Some(key)).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_value(body).unwrap()
    }
}

fn beat() -> Value {
    serde_json::to_value(HeartbeatRequest::verification("0.1.0", 64, 2)).unwrap()
}

fn status_event(user: Option<&str>) -> Value {
    let mut data = json!({"installation_id": "i1", "team_id": "t1", "status": "online", "timestamp": TS});
    if let Some(user) = user {
        data["user_id"] = json!(user);
    }
    json!({"type": "mcp.server.status_changed", "timestamp": TS, "data": data})
}

#[tokio::test]
async fn the_whole_conversation_in_protocol_order() {
    let backend = FakeBackend::start().await;
    let client = Client::new(&backend);

    // E1
    assert_eq!(client.get(path::HEALTH, None).await, (200, json!({"status": "ok"})));

    // E2: refusals, then success
    let register = json!({"name": "rust-satellite-01", "capabilities": ["stdio", "http", "sse"]});
    let (status, body) = client.post(path::REGISTER, None, register.clone()).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("registration_token_required")));
    let (status, body) =
        client.post(path::REGISTER, Some("deploystack_satellite_global_short"), register.clone()).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("invalid_registration_token")));
    let (status, body) =
        client.post(path::REGISTER, Some(FakeBackend::REGISTRATION_TOKEN), json!({"name": "Bad Name"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(backend.take_violations().len(), 1, "a bad name is a recorded violation");
    let (status, body) = client.post(path::REGISTER, Some(FakeBackend::REGISTRATION_TOKEN), register.clone()).await;
    assert_eq!(status, 200, "{body}");
    let registered: RegisterResponse = serde_json::from_value(body).unwrap();
    let sid = registered.satellite.id.clone();
    let key = registered.satellite.api_key.expose().to_owned();
    assert_eq!(sid.len(), 15);
    assert!(key.starts_with("deploystack_satellite_api_global_"));
    assert_eq!(registered.satellite.id.len(), 15);
    let (status, body) = client.post(path::REGISTER, Some(FakeBackend::REGISTRATION_TOKEN), register.clone()).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("token_already_used")));
    backend.fail_registration(401, "token_expired");
    backend.add_registration_token("deploystack_satellite_global_second0token");
    let (status, body) =
        client.post(path::REGISTER, Some("deploystack_satellite_global_second0token"), register.clone()).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("token_expired")));

    // E4 before the first heartbeat: inactive, nothing delivered
    backend.push_command(Command::new(
        "c1",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload {
            common: CommonPayload { event: Some("mcp_installation_created".into()), ..Default::default() },
            ..Default::default()
        }),
    ));
    backend.push_command(Command::new(
        "c2",
        Priority::Normal,
        CommandKind::Unknown { command_type: "update".into(), payload: json!({}) },
    ));
    let poll = client.poll(&sid, &key).await;
    assert!(poll.commands.is_empty());
    assert_eq!((poll.polling_mode, poll.next_poll_interval), (Some(PollingMode::Slow), Some(60)));

    // E3: auth, satellite id, schema, success
    assert_eq!(client.post(&path::heartbeat(&sid), None, beat()).await.0, 401);
    assert_eq!(client.post(&path::heartbeat(&sid), Some("wrong"), beat()).await.0, 401);
    assert_eq!(client.post(&path::heartbeat("nosuchsatellite"), Some(&key), beat()).await.0, 404);
    assert_eq!(client.post(&path::heartbeat(&sid), Some(&key), json!({"status": "active"})).await.0, 400);
    assert_eq!(backend.take_violations().len(), 1);
    let (status, body) = client.post(&path::heartbeat(&sid), Some(&key), beat()).await;
    assert_eq!(status, 200, "{body}");
    let _: Ack = serde_json::from_value(body).unwrap();
    assert!(backend.is_active(&sid));
    assert_eq!(backend.heartbeats().len(), 1);

    // E4: delivered until a result arrives; mode from priorities
    let poll = client.poll(&sid, &key).await;
    assert_eq!(poll.commands.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
    assert_eq!((poll.polling_mode.clone(), poll.next_poll_interval), (Some(PollingMode::Immediate), Some(2)));
    assert_eq!(poll.commands[1].kind, CommandKind::Unknown { command_type: "update".into(), payload: json!({}) });
    assert_eq!(client.poll(&sid, &key).await.commands.len(), 2, "re-delivered while no result");
    let (status, _) = client.get(&format!("{}?last_poll={TS}&limit=99", path::commands(&sid)), Some(&key)).await;
    assert_eq!(status, 400);
    backend.take_violations();

    // E5
    let result = serde_json::to_value(CommandResult::completed("c1", json!({"configuration_applied": true}))).unwrap();
    let (status, body) = client.post(&path::command_result(&sid), Some(&key), result).await;
    assert_eq!(status, 200, "{body}");
    let unknown = serde_json::to_value(CommandResult::unknown_type("c2", "update")).unwrap();
    assert_eq!(client.post(&path::command_result(&sid), Some(&key), unknown).await.0, 200);
    let stray = serde_json::to_value(CommandResult::failed("nope", "x", None)).unwrap();
    assert_eq!(client.post(&path::command_result(&sid), Some(&key), stray).await.0, 404);
    assert_eq!(client.post(&path::command_result(&sid), Some(&key), json!({"command_id": "c1"})).await.0, 400);
    assert_eq!(backend.take_violations().len(), 1);
    assert!(backend.pending_commands().is_empty());
    assert_eq!(backend.results().iter().map(|r| r.command_id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
    assert_eq!(backend.results_for("c2")[0].error_message.as_deref(), Some("Unknown command type: update"));
    let poll = client.poll(&sid, &key).await;
    assert!(poll.commands.is_empty());
    backend.push_command(Command::new("c3", Priority::High, CommandKind::Kill(Default::default())));
    assert_eq!(client.poll(&sid, &key).await.next_poll_interval, Some(10));
    backend.set_poll_hint(Some((PollingMode::Normal, 5)));
    assert_eq!(client.poll(&sid, &key).await.next_poll_interval, Some(5));

    // E6
    let entry = McpServerEntry {
        installation_id: "i1".into(),
        team_id: "t1".into(),
        team_slug: "acme".into(),
        server_name: "Files".into(),
        installation_name: "Files".into(),
        transport_type: Some("stdio".into()),
        command: Some("npx".into()),
        args: Some(vec!["-y".into(), "files".into()]),
        enabled: Some(true),
        user_id: "u1".into(),
        ..Default::default()
    };
    backend.set_config(&ConfigResponse::from_entries([("files-acme-u1-i1", entry)]));
    let (status, body) = client.get(&path::config(&sid), Some(&key)).await;
    assert_eq!(status, 200);
    let config: ConfigResponse = serde_json::from_value(body).unwrap();
    assert_eq!(config.desired_state().instances.len(), 1);

    // E7: per-event failures inside a 200, envelope failures as 400
    let batch = json!({"events": [status_event(Some("u1")), status_event(None),
                                  {"type": "mcp.unknown.event", "timestamp": TS, "data": {}}]});
    let (status, body) = client.post(&path::events(&sid), Some(&key), batch).await;
    assert_eq!(status, 200, "{body}");
    let answer: EventsResponse = serde_json::from_value(body).unwrap();
    assert_eq!((answer.processed, answer.failed), (1, 2));
    assert_eq!(answer.failures.iter().map(|f| f.index).collect::<Vec<_>>(), [1, 2]);
    assert!(answer.failures[0].error.contains("user_id"), "{:?}", answer.failures);
    assert_eq!(answer.failures[1].error, "Unknown event type: mcp.unknown.event");
    assert_eq!(backend.take_violations().len(), 2);
    assert_eq!(backend.events().len(), 1);
    assert_eq!(client.post(&path::events(&sid), Some(&key), json!({"events": []})).await.0, 400);
    let mut extra = status_event(Some("u1"));
    extra["id"] = json!("evt");
    assert_eq!(client.post(&path::events(&sid), Some(&key), json!({"events": [extra]})).await.0, 400);
    assert_eq!(backend.take_violations().len(), 2);

    // E8
    backend.add_token("alice-token", TokenInfo::new("alice", "t1").with_aud(&["http://localhost:3001/mcp"]));
    backend.add_token("old-token", TokenInfo::new("bob", "t1").inactive());
    let (status, body) = client.post(path::INTROSPECT, Some(&key), json!({"token": "alice-token"})).await;
    assert_eq!(status, 200);
    let active: IntrospectResponse = serde_json::from_value(body.clone()).unwrap();
    assert!(active.active, "{body}");
    assert_eq!((active.sub.as_deref(), active.team_id.as_deref()), (Some("alice"), Some("t1")));
    assert_eq!(active.audiences(), ["http://localhost:3001/mcp"]);
    assert!(active.scopes().contains(&"mcp:tools:execute"));
    for token in ["old-token", "unknown-token"] {
        let (status, body) = client.post(path::INTROSPECT, None, json!({"token": token})).await;
        assert_eq!((status, body["active"].as_bool()), (200, Some(false)));
    }
    assert_eq!(backend.calls(Endpoint::Introspect).len(), 3);

    // E9, E10
    let who = OAuthTokenRequest { installation_id: "i2".into(), user_id: "u1".into(), team_id: "t1".into() };
    let ask = serde_json::to_value(&who).unwrap();
    let (status, body) = client.post(&path::tokens_status(&sid), Some(&key), ask.clone()).await;
    assert_eq!((status, body), (200, json!({"exists": false})));
    assert_eq!(client.post(&path::tokens_retrieve(&sid), Some(&key), ask.clone()).await.0, 404);
    backend.add_oauth_token(
        who,
        OAuthTokenStatus { exists: true, expired: Some(false), expires_at: Some(TS.into()), can_refresh: Some(true) },
        Some(OAuthToken {
            access_token: Credential::new("ya29.token"),
            refresh_token: None,
            token_type: Some("Bearer".into()),
            expires_at: Some(TS.into()),
            scope: None,
        }),
    );
    let (status, body) = client.post(&path::tokens_status(&sid), Some(&key), ask.clone()).await;
    assert_eq!((status, body["exists"].as_bool()), (200, Some(true)));
    let (status, body) = client.post(&path::tokens_retrieve(&sid), Some(&key), ask).await;
    assert_eq!(status, 200);
    let token: OAuthToken = serde_json::from_value(body).unwrap();
    assert_eq!(token.access_token.expose(), "ya29.token");

    // Every call recorded, secrets redacted; no violation left over.
    let calls = backend.all_calls();
    assert!(calls.len() > 30);
    let heartbeat = backend.calls(Endpoint::Heartbeat).pop().unwrap();
    assert_eq!(heartbeat.headers.get("authorization").map(String::as_str), Some("Bearer <redacted>"));
    assert!(calls.iter().all(|c| !c.headers.values().any(|v| v.contains(&key))));
    backend.assert_no_violations();
}

#[tokio::test]
async fn failures_latency_and_outages_are_scripted() {
    let backend = FakeBackend::start().await;
    let client = Client::new(&backend);
    let credentials = backend.register_directly("rust-satellite-02");
    let (sid, key) = (credentials.satellite_id.clone(), credentials.api_key.clone());
    assert!(backend.is_active(&sid), "stored credentials of an active satellite");

    backend.fail_next(Endpoint::Heartbeat, 500, 2);
    backend.fail_next(Endpoint::Events, 429, 1);
    let statuses = [
        client.post(&path::heartbeat(&sid), Some(&key), beat()).await.0,
        client.post(&path::heartbeat(&sid), Some(&key), beat()).await.0,
        client.post(&path::heartbeat(&sid), Some(&key), beat()).await.0,
    ];
    assert_eq!(statuses, [500, 500, 200]);
    let batch = json!({"events": [status_event(Some("u1"))]});
    assert_eq!(client.post(&path::events(&sid), Some(&key), batch.clone()).await.0, 429);
    assert_eq!(client.post(&path::events(&sid), Some(&key), batch).await.0, 200);
    assert_eq!(backend.events().len(), 1, "the refused batch was not processed");

    backend.fault_next(Endpoint::Config, Fault::Garbage, 1);
    backend.fault_next(Endpoint::Config, Fault::Truncated, 1);
    let (status, garbage) = client.get(&path::config(&sid), Some(&key)).await;
    assert_eq!(status, 200);
    assert!(garbage.is_string(), "not JSON: {garbage}");
    let (status, truncated) = client.get(&path::config(&sid), Some(&key)).await;
    assert_eq!(status, 200);
    let full = json!({"mcp_servers": {}}).to_string();
    assert_eq!(truncated.as_str(), Some(&full[..full.len() / 2]), "the first half of the real answer");
    assert_eq!(client.get(&path::config(&sid), Some(&key)).await.0, 200);

    backend.revoke_api_key(&sid);
    assert_eq!(client.post(&path::heartbeat(&sid), Some(&key), beat()).await.0, 401);
    let again = backend.register_directly("rust-satellite-02");
    assert_eq!(again.satellite_id, sid, "registration upserts by name");
    let key = again.api_key;

    backend.set_latency_for(Endpoint::Health, Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(client.get(path::HEALTH, None).await.0, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    backend.set_latency_for(Endpoint::Health, Duration::ZERO);

    // Down: connections refused, pooled ones cut. Back: same port, same state.
    backend.go_down().await;
    let refused = client.http.get(format!("{}{}", backend.url(), path::HEALTH)).send().await;
    assert!(refused.is_err(), "the backend is down: {refused:?}");
    assert!(reqwest::Client::new().get(format!("{}{}", backend.url(), path::HEALTH)).send().await.is_err());
    backend.come_back().await;
    assert_eq!(client.get(path::HEALTH, None).await.0, 200);
    assert_eq!(client.post(&path::heartbeat(&sid), Some(&key), beat()).await.0, 200);

    // A request without Content-Type breaks BP §0 and is recorded.
    let bare = client.http.get(format!("{}{}", backend.url(), path::HEALTH)).send().await.unwrap();
    assert_eq!(bare.status().as_u16(), 200);
    assert_eq!(backend.take_violations().len(), 1);
    backend.assert_no_violations();
}
