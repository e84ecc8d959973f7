//! Client activity (SB §17): requests of OAuth clients and instance-token
//! callers aggregated per (user, team, client) and reported every 30 s as
//! `mcp.client.activity` events (take-and-reset).

use std::collections::HashMap;

use crate::events::ClientActivity;
use crate::model::iso;
use chrono::{DateTime, Utc};
use parking_lot::Mutex;

/// What the HTTP layer knows about one authenticated request.
#[derive(Debug, Clone, Default)]
pub struct Seen<'a> {
    pub user_id: &'a str,
    pub team_id: &'a str,
    /// OAuth client id, or `instance:<path>` for instance tokens (OQ-46).
    pub client_id: &'a str,
    pub auth_type: &'a str,
    pub client_name_header: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub forwarded_for: Option<&'a str>,
    pub real_ip: Option<&'a str>,
    pub tool_call: bool,
}

#[derive(Clone)]
struct Record {
    user_id: String,
    team_id: String,
    client_id: String,
    auth_type: String,
    client_name: String,
    user_agent: String,
    ip_address: String,
    /// The last session id seen as it came (in memory only): it becomes its reference when taken.
    session_id: Option<String>,
    request_count: u64,
    tool_call_count: u64,
    last_activity_at: DateTime<Utc>,
}

/// Everything but the raw session id, which is a bearer of the session (only its reference leaves memory).
impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("user_id", &self.user_id)
            .field("team_id", &self.team_id)
            .field("client_id", &self.client_id)
            .field("auth_type", &self.auth_type)
            .field("client_name", &self.client_name)
            .field("session_id", &self.session_id.as_ref().map(|_| "[hidden]"))
            .field("request_count", &self.request_count)
            .field("tool_call_count", &self.tool_call_count)
            .field("last_activity_at", &self.last_activity_at)
            .finish_non_exhaustive()
    }
}

impl Record {
    fn first(seen: &Seen<'_>, now: DateTime<Utc>) -> Record {
        Record {
            user_id: seen.user_id.to_owned(),
            team_id: seen.team_id.to_owned(),
            client_id: seen.client_id.to_owned(),
            auth_type: seen.auth_type.to_owned(),
            client_name: client_name(seen.client_name_header, seen.session_id.is_some(), seen.user_agent),
            user_agent: seen.user_agent.unwrap_or("unknown").to_owned(),
            ip_address: ip_address(seen.forwarded_for, seen.real_ip),
            session_id: None,
            request_count: 0,
            tool_call_count: 0,
            last_activity_at: now,
        }
    }
}

#[derive(Debug, Default)]
pub struct ActivityTracker {
    records: Mutex<HashMap<String, Record>>,
}

impl ActivityTracker {
    /// Count one request. Called on every authenticated request: a client already known costs no allocation.
    pub fn record(&self, seen: &Seen<'_>) {
        thread_local! {
            static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        let now = Utc::now();
        KEY.with_borrow_mut(|key| {
            key.clear();
            for (n, part) in [seen.user_id, seen.team_id, seen.client_id].into_iter().enumerate() {
                if n > 0 {
                    key.push(':');
                }
                key.push_str(part);
            }
            let mut records = self.records.lock();
            if !records.contains_key(key.as_str()) {
                records.insert(key.clone(), Record::first(seen, now));
            }
            let Some(record) = records.get_mut(key.as_str()) else { return };
            record.request_count += 1;
            record.tool_call_count += u64::from(seen.tool_call);
            record.last_activity_at = now;
            if let Some(session) = seen.session_id {
                if record.session_id.as_deref() != Some(session) {
                    record.session_id = Some(session.to_owned());
                }
            }
        });
    }

    /// Every record as an `mcp.client.activity` payload (BP §8.5-14), and start over.
    pub fn take(&self) -> Vec<ClientActivity> {
        let records: Vec<Record> = self.records.lock().drain().map(|(_, r)| r).collect();
        records
            .into_iter()
            .map(|r| ClientActivity {
                user_id: r.user_id,
                team_id: r.team_id,
                oauth_client_id: r.client_id.clone(),
                auth_type: r.auth_type,
                auth_identifier: r.client_id,
                client_name: r.client_name,
                user_agent: r.user_agent,
                ip_address: r.ip_address,
                request_count: r.request_count,
                tool_call_count: r.tool_call_count,
                last_activity_at: iso(r.last_activity_at),
                // Never the id itself: whoever reads the events must not be able to use the session.
                session_id: r.session_id.as_deref().map(crate::secrets::session_reference),
            })
            .collect()
    }
}

/// SB §17: the first rule that matches names the client.
pub fn client_name(header: Option<&str>, has_session: bool, user_agent: Option<&str>) -> String {
    if let Some(name) = header.filter(|h| !h.trim().is_empty()) {
        return name.trim().to_owned();
    }
    let ua = user_agent.unwrap_or("");
    let lower = ua.to_ascii_lowercase();
    let name = if has_session && ua == "undici" {
        "VS Code"
    } else if lower.contains("cursor") {
        "Cursor"
    } else if lower.contains("claude") {
        "Claude Desktop"
    } else if lower.contains("cline") {
        "Cline"
    } else if lower.contains("windsurf") {
        "Windsurf"
    } else if has_session {
        "MCP Client"
    } else if lower.contains("vscode") {
        "VS Code"
    } else if lower.contains("mcp") {
        "MCP Client"
    } else {
        "Unknown Client"
    };
    name.to_owned()
}

/// Whether decoded JSON-RPC messages (one, or a batch's) call `tools/call`. The front door counts them from the
/// messages it decodes anyway: reading the body a second time for this cost ~2% of a proxied call's instructions.
pub fn calls_a_tool(messages: &[serde_json::Value]) -> bool {
    messages.iter().any(|m| m.get("method").and_then(serde_json::Value::as_str) == Some("tools/call"))
}

/// SB §17: the first `X-Forwarded-For` entry, else `X-Real-IP`, else `unknown`.
pub fn ip_address(forwarded_for: Option<&str>, real_ip: Option<&str>) -> String {
    forwarded_for
        .and_then(|f| f.split(',').next())
        .map(str::trim)
        .filter(|ip| !ip.is_empty())
        .or(real_ip.map(str::trim).filter(|ip| !ip.is_empty()))
        .unwrap_or("unknown")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_are_found_in_single_messages_and_batches() {
        let calls = |body: &str| {
            crate::mcp::protocol::decode_frame(body.as_bytes()).is_ok_and(|(messages, _)| calls_a_tool(&messages))
        };
        assert!(calls(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#));
        assert!(calls(r#"[{"method":"ping","id":1},{"method":"tools/call","id":2}]"#));
        assert!(!calls(r#"{"method":"tools/list","params":{"note":"tools/call"}}"#));
        assert!(!calls(r#"{"method":"tools/list","params":{"method":"tools/call"}}"#));
        assert!(!calls(r#"{"method":["tools/call"]}"#));
        assert!(!calls("not json"));
        assert_eq!(ip_address(Some(" 203.0.113.7 , 10.0.0.1"), Some("10.0.0.2")), "203.0.113.7");
        assert_eq!(ip_address(None, Some("10.0.0.2")), "10.0.0.2");
        assert_eq!(ip_address(None, None), "unknown");
    }

    #[test]
    fn client_names_follow_the_rules_in_order() {
        assert_eq!(client_name(Some("My Agent"), true, Some("cursor/1")), "My Agent");
        assert_eq!(client_name(None, true, Some("undici")), "VS Code");
        assert_eq!(client_name(None, false, Some("undici")), "Unknown Client");
        assert_eq!(client_name(None, false, Some("Cursor/0.42")), "Cursor");
        assert_eq!(client_name(None, false, Some("Claude-User")), "Claude Desktop");
        assert_eq!(client_name(None, true, Some("python-httpx/0.28")), "MCP Client");
        assert_eq!(client_name(None, false, Some("vscode/1.9")), "VS Code");
        assert_eq!(client_name(None, false, Some("mcp-remote")), "MCP Client");
        assert_eq!(client_name(None, false, None), "Unknown Client");
    }

    #[test]
    fn a_record_reports_the_last_session_seen_as_its_reference_and_the_last_time() {
        let tracker = ActivityTracker::default();
        let seen =
            Seen { user_id: "alice", team_id: "acme", client_id: "c", session_id: Some("s-1"), ..Seen::default() };
        tracker.record(&seen);
        let first = tracker.take();
        tracker.record(&seen);
        tracker.record(&Seen { session_id: Some("s-2"), ..seen.clone() });
        tracker.record(&Seen { session_id: None, ..seen.clone() });
        let taken = tracker.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].request_count, 3);
        assert_eq!(taken[0].session_id.as_deref(), Some(crate::secrets::session_reference("s-2").as_str()));
        assert!(taken[0].last_activity_at >= first[0].last_activity_at, "an ISO time, later or equal");
        assert!(chrono::DateTime::parse_from_rfc3339(&taken[0].last_activity_at).is_ok());
    }

    /// The tracker holds live session ids until it reports their references: printing it shows none of them.
    #[test]
    fn the_tracker_printed_for_debugging_shows_no_session_id() {
        let tracker = ActivityTracker::default();
        let session = "8e0f6c1a-live-session-id";
        tracker.record(&Seen {
            user_id: "alice",
            team_id: "acme",
            client_id: "c",
            session_id: Some(session),
            ..Seen::default()
        });
        let printed = format!("{tracker:?}");
        assert!(printed.contains("alice") && printed.contains("[hidden]"), "{printed}");
        assert!(!printed.contains(session), "{printed}");
    }

    #[test]
    fn requests_aggregate_per_user_team_and_client_and_are_taken_once() {
        let tracker = ActivityTracker::default();
        let seen = Seen {
            user_id: "alice",
            team_id: "acme",
            client_id: "dyn_1",
            auth_type: "oauth",
            user_agent: Some("claude-code/1"),
            forwarded_for: Some("203.0.113.7, 10.0.0.1"),
            session_id: Some("s-1"),
            ..Seen::default()
        };
        tracker.record(&seen);
        tracker.record(&Seen { tool_call: true, ..seen.clone() });
        tracker.record(&Seen { client_id: "dyn_2", ..seen.clone() });
        let mut taken: Vec<serde_json::Value> =
            tracker.take().iter().map(|r| serde_json::to_value(r).unwrap()).collect();
        taken.sort_by_key(|r| r["oauth_client_id"].as_str().unwrap_or("").to_owned());
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[0]["request_count"], 2);
        assert_eq!(taken[0]["tool_call_count"], 1);
        assert_eq!(taken[0]["ip_address"], "203.0.113.7");
        assert_eq!(taken[0]["client_name"], "Claude Desktop");
        assert_eq!(taken[0]["session_id"], crate::secrets::session_reference("s-1"));
        assert!(!taken[0]["session_id"].as_str().unwrap().contains("s-1"), "never the id itself");
        assert!(tracker.take().is_empty(), "take resets");
    }
}
