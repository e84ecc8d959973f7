//! Unit tests of `payload`.

use super::*;
use crate::model::InstallationId;
use chrono::DateTime;
use serde_json::{json, Value};

fn spec() -> InstanceSpec {
    crate::model::sample_spec()
}

/// The payload read back from its text, without its `event_id` (a UUIDv7, checked here, and new per event); an
/// event without a payload reads as `{}`, which no assertion below accepts.
fn data(event: &Event) -> Value {
    let mut payload = event.payload().unwrap_or_default();
    let id = payload.remove("event_id").and_then(|id| id.as_str().and_then(|id| uuid::Uuid::parse_str(id).ok()));
    assert_eq!(id.map(|id| id.get_version_num()), Some(7), "every payload carries a UUIDv7 event_id first");
    Value::Object(payload)
}

/// Each fact has its own id, first in its payload (the dedupe key a backend reads, proto/README.md).
#[test]
fn every_event_has_its_own_id_first() {
    let at = Utc::now();
    let (a, b) = (
        Event::status_changed(&spec(), InstanceStatus::Online, Some("ready"), at),
        Event::status_changed(&spec(), InstanceStatus::Online, Some("ready"), at),
    );
    let (a, b) = (a.data.unwrap_or_default(), b.data.unwrap_or_default());
    assert!(a.starts_with("{\"event_id\":\"") && b.starts_with("{\"event_id\":\""), "{a}");
    assert_ne!(a, b, "two facts, two ids");
    let empty = Event::new(EventKind::ConfigRefreshed, None, json!({}));
    let parsed: Value = serde_json::from_str(&empty.data.unwrap_or_default()).unwrap_or_default();
    assert_eq!(parsed.as_object().map(|o| o.len()), Some(1), "an empty payload gets its id alone: {parsed}");
}

#[test]
fn payloads_have_the_backend_field_names() {
    let at = DateTime::parse_from_rfc3339("2025-01-15T10:30:00Z").unwrap().with_timezone(&Utc);
    let e = Event::status_changed(&spec(), InstanceStatus::Online, Some("ready"), at);
    assert_eq!(
        data(&e),
        json!({"installation_id": "i1", "team_id": "t1", "user_id": "u1", "status": "online",
               "status_message": "ready", "timestamp": "2025-01-15T10:30:00.000Z"})
    );
    let crash = CrashReport {
        pid: Some(42),
        exit_code: None,
        signal: Some(9),
        uptime_seconds: 3,
        crash_count: 2,
        will_restart: true,
    };
    let e = Event::crashed(&spec(), &crash);
    assert_eq!(e.kind, EventKind::ServerCrashed);
    assert_eq!(
        data(&e),
        json!({"server_id": "i1", "server_slug": "demo-acme-u1-i1", "team_id": "t1", "user_id": "u1",
               "process_id": 42, "exit_code": 0, "signal": "SIGKILL", "uptime_seconds": 3,
               "crash_count": 2, "will_restart": true})
    );
    let e = Event::permanently_failed(&spec(), &CrashReport { exit_code: Some(3), signal: None, ..crash });
    assert_eq!(data(&e)["last_error"], "Exit code: 3, signal: none");
    assert_eq!(data(&e)["total_crashes"], 2);
}

#[test]
fn tools_discovered_has_the_backend_shape() {
    let tools = ToolDef::listing([
        json!({"name": "create_issue", "description": "Create an issue",
               "inputSchema": {"type": "object", "required": ["repo"], "properties": {"n": {"maximum": 1e3}}}}),
        json!({"name": "ping"}),
    ]);
    let e = Event::tools_discovered(&spec(), &tools, &[142, 30]);
    assert_eq!(e.kind, EventKind::ToolsDiscovered);
    assert_eq!(e.process_id.as_deref(), Some("demo-acme-u1-i1"));
    assert_eq!(
        data(&e),
        json!({"installation_id": "i1", "installation_name": "demo-acme-u1-i1", "team_id": "t1",
               "server_slug": "demo", "tool_count": 2, "total_tokens": 172,
               "tools": [
                   {"tool_name": "create_issue", "description": "Create an issue",
                    "input_schema": {"type": "object", "required": ["repo"], "properties": {"n": {"maximum": 1e3}}},
                    "token_count": 142},
                   {"tool_name": "ping", "description": "", "input_schema": {}, "token_count": 30}],
               "discovered_at": iso(e.timestamp)})
    );
    // Field order as BP §8.5-4 lists it, after the dedupe key.
    let payload = e.payload().unwrap_or_default();
    let keys: Vec<&str> = payload.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "event_id",
            "installation_id",
            "installation_name",
            "team_id",
            "server_slug",
            "tool_count",
            "total_tokens",
            "tools",
            "discovered_at"
        ]
    );

    // A schema given as null reads as none; a tool without a count is neither listed nor counted.
    let lenient = ToolDef::listing([json!({"name": "a", "inputSchema": null}), json!({"name": "b"})]);
    let short = Event::tools_discovered(&spec(), &lenient, &[7]);
    assert_eq!(
        data(&short)["tools"],
        json!([{"tool_name": "a", "description": "", "input_schema": {}, "token_count": 7}])
    );
    assert_eq!((data(&short)["tool_count"].clone(), data(&short)["total_tokens"].clone()), (json!(1), json!(7)));

    let empty =
        Event::tools_discovered(&InstanceSpec { installation_id: InstallationId::from(""), ..spec() }, &[], &[]);
    assert_eq!(data(&empty)["installation_id"], "demo-acme-u1-i1");
    assert_eq!(data(&empty)["tool_count"], 0);
    assert_eq!(data(&empty)["total_tokens"], 0);
    assert_eq!(data(&empty)["tools"], json!([]));
}
