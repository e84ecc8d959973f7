//! The wire types of `backend::wire` against the schemas in proto/: every type serializes to a body its schema
//! accepts, BP's own examples validate (and parse), every `Event` constructor's data validates against its
//! payload schema, and broken bodies are rejected, so a drift on either side fails here.

use satellite::backend::wire::*;
use satellite::control::McpServerEntry;
use satellite::events::{
    ClientActivity, ClientConnected, ClientDisconnected, ConfigErrorKind, CrashReport, Event, EventKind,
    RequestLogEntry, ServerLogEntry,
};
use satellite::model::InstanceStatus;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::common::fake_backend::{proto_validator, schema_errors};

/// `value` conforms to proto/`schema`.schema.json.
#[track_caller]
fn conforms(schema: &str, value: &Value) {
    let errors = schema_errors(&proto_validator(schema), value);
    assert!(errors.is_empty(), "{schema}: {errors:#?}\nin {value:#}");
}

#[track_caller]
fn rejected(schema: &str, value: &Value) {
    assert!(!schema_errors(&proto_validator(schema), value).is_empty(), "{schema} accepted {value:#}");
}

/// Serialize `typed`, check it against `schema`, and read it back unchanged.
#[track_caller]
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(schema: &str, typed: &T) -> Value {
    let value = serde_json::to_value(typed).unwrap();
    conforms(schema, &value);
    let back: T = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(&back, typed, "{schema} round trip");
    value
}

/// A BP example validates and parses into its wire type.
#[track_caller]
fn example<T: DeserializeOwned>(schema: &str, value: Value) -> T {
    conforms(schema, &value);
    serde_json::from_value(value).unwrap_or_else(|err| panic!("{schema}: {err}"))
}

const TS: &str = "2025-01-15T10:30:00.000Z";

fn entry(user: &str) -> McpServerEntry {
    McpServerEntry {
        installation_id: "U3hCfHenbK5kH2_8ehSGx".into(),
        team_id: "4vj7igb2fcwzmko".into(),
        team_slug: "acme".into(),
        server_name: "GitHub".into(),
        server_slug: Some("github".into()),
        installation_name: "GitHub (Acme)".into(),
        transport_type: Some("stdio".into()),
        command: Some("npx".into()),
        args: Some(vec!["-y".into(), "@modelcontextprotocol/server-github".into()]),
        enabled: Some(true),
        user_id: user.into(),
        ..McpServerEntry::default()
    }
}

#[test]
fn every_wire_type_serializes_to_its_schema() {
    round_trip("health-response", &HealthResponse { status: Some("ok".into()) });
    round_trip("error", &BackendError::new("Satellite not found"));
    let mut refused = BackendError::new("token_expired");
    refused.message = Some("expired".into());
    refused.instructions = Some("regenerate".into());
    round_trip("register-error", &refused);
    assert_eq!(refused.registration_code(), RegisterErrorCode::TokenExpired);

    round_trip(
        "register-request",
        &RegisterRequest {
            name: "rust-satellite-01".into(),
            capabilities: Some(vec![Transport::Stdio, Transport::Http, Transport::Sse]),
            system_info: Some(SystemInfo {
                os: Some("linux linux".into()),
                arch: Some("x64".into()),
                node_version: Some("rust-satellite/0.1.0".into()),
                memory_mb: Some(15923),
            }),
        },
    );
    let registered = round_trip(
        "register-response",
        &RegisterResponse {
            success: true,
            satellite: RegisteredSatellite {
                id: "k6hm1j7sy2radj8".into(),
                name: Some("rust-satellite-01".into()),
                satellite_type: Some(SatelliteType::Global),
                team_id: None,
                status: Some("inactive".into()),
                api_key: Credential::new("deploystack_satellite_api_global_EACQ7NeRD4gNjFjPAiz90AR7NqL-LF9d"),
            },
            message: None,
        },
    );
    assert_eq!(registered["satellite"]["status"], "inactive");

    let metric = ProcessMetric {
        installation_id: "U3hCfHenbK5kH2_8ehSGx".into(),
        installation_name: "github-acme-u1-U3hCfHenbK5kH2_8ehSGx".into(),
        status: ProcessStatus::Running,
        pid: Some(48211),
        uptime_seconds: 412,
        message_count: 17,
        error_count: 0,
        health_status: HealthStatus::Unknown,
        last_activity: TS.into(),
    };
    let full = HeartbeatRequest {
        status: SatelliteStatus::Active,
        system_metrics: SystemMetrics {
            cpu_usage_percent: 3.5,
            memory_usage_mb: 87,
            disk_usage_percent: None,
            uptime_seconds: Some(3600),
            network_rx_bytes: None,
            network_tx_bytes: None,
        },
        processes: vec![LegacyProcess {
            id: "http-proxy-notion-1736934600000".into(),
            server_name: "notion".into(),
            status: LegacyProcessStatus::Running,
            health_status: HealthStatus::Healthy,
            performance_metrics: Some(PerformanceMetrics { total_requests: 3, avg_response_time_ms: 12.5 }),
        }],
        processes_by_team: Some([("4vj7igb2fcwzmko".to_owned(), vec![metric.clone()])].into()),
        mcp_status: Some(McpStatus {
            summary: McpStatusSummary { total_instances: 1, active_instances: 1, total_tools: 1, ..Default::default() },
            instances: vec![McpInstanceStatus {
                installation_id: metric.installation_id.clone(),
                installation_name: metric.installation_name.clone(),
                instance_id: "unknown".into(),
                user_id: "u1".into(),
                team_id: "4vj7igb2fcwzmko".into(),
                status: ProcessStatus::Running,
                transport_type: Transport::Stdio,
                uptime_seconds: 412,
                message_count: 17,
                error_count: 0,
                health_status: HealthStatus::Unknown,
                pid: None,
            }],
            tool_names: vec![ToolName {
                namespaced_name: "github:create_issue".into(),
                server_slug: "github".into(),
                transport: Transport::Stdio,
            }],
            server_status_counts: ServerStatusCounts { online: 1, ..Default::default() },
        }),
        normalized_data: None,
        error_count: Some(0),
        version: Some("0.1.0".into()),
        satellite_url: Some(String::new()),
    };
    let beat = round_trip("heartbeat-request", &full);
    assert!(beat.get("normalized_data").is_none(), "None is omitted");
    assert!(beat["processes_by_team"]["4vj7igb2fcwzmko"][0].get("pid").is_some());
    let verification = round_trip("heartbeat-request", &HeartbeatRequest::verification("0.1.0", 64, 2));
    assert!(verification.get("satellite_url").is_none() && verification.get("mcp_status").is_none());
    round_trip("ack-response", &Ack { success: true, message: Some("Heartbeat recorded for satellite x".into()) });

    let common = |installation: &str| CommonPayload {
        installation_id: Some(installation.into()),
        team_id: Some("4vj7igb2fcwzmko".into()),
        ..CommonPayload::default()
    };
    let poll = CommandsResponse {
        commands: vec![
            Command::new(
                "c1",
                Priority::Immediate,
                CommandKind::Configure(ConfigurePayload {
                    common: CommonPayload { event: Some("mcp_installation_created".into()), ..common("i1") },
                    ..Default::default()
                }),
            ),
            Command::new(
                "c2",
                Priority::Normal,
                CommandKind::Configure(ConfigurePayload {
                    common: common("i1"),
                    action: Some("update_tool_status".into()),
                    tool_name: Some("delete_repo".into()),
                    is_disabled: Some(true),
                    ..Default::default()
                }),
            ),
            Command::new(
                "c3",
                Priority::Low,
                CommandKind::Spawn(SpawnPayload {
                    common: common("i1"),
                    transport_type: Some("stdio".into()),
                    installation_name: Some("github-acme-u1-i1".into()),
                    command: Some("npx".into()),
                    args: Some(vec!["-y".into(), "x".into()]),
                    ..Default::default()
                }),
            ),
            Command::new("c4", Priority::Normal, CommandKind::Kill(TargetPayload { common: common("i1") })),
            Command::new(
                "c5",
                Priority::High,
                CommandKind::Restart(RestartPayload { common: common("i1"), reason: Some("manual_restart".into()) }),
            ),
            Command::new(
                "c6",
                Priority::Immediate,
                CommandKind::HealthCheck(HealthCheckPayload {
                    common: common("i1"),
                    check_type: Some(CheckType::CredentialValidation),
                }),
            ),
            Command::new(
                "c7",
                Priority::Normal,
                CommandKind::InvalidateUserTokenCache(InvalidateUserTokenCachePayload {
                    user_id: Some("u1".into()),
                    user_email: None,
                }),
            ),
            Command::new(
                "c8",
                Priority::Normal,
                CommandKind::Unknown { command_type: "update".into(), payload: json!({"anything": 1}) },
            ),
        ],
        polling_mode: Some(PollingMode::Immediate),
        next_poll_interval: Some(2),
    };
    round_trip("commands-response", &poll);

    round_trip("command-result-request", &CommandResult::completed("c1", json!({"configuration_applied": true})));
    round_trip("command-result-request", &CommandResult::failed("c2", "Missing required fields", None));
    round_trip("command-result-request", &CommandResult::unknown_type("c8", "update"));
    round_trip("ack-response", &Ack { success: true, message: None });

    let config = ConfigResponse::from_entries([("github-acme-u1-i1", entry("u1")), ("github-acme-u2-i1", entry("u2"))]);
    round_trip("config-response", &config);
    assert_eq!(config.desired_state().instances.len(), 2);
    assert!(config.entries().all(|(_, e)| e.is_ok()));

    let data = json!({"error_type": "network", "error_message": "x", "status_code": null, "retry_in": 60});
    conforms("event.config.error", &data);
    let Value::Object(data) = data else { unreachable!() };
    let envelope = EventEnvelope { kind: EventKind::ConfigError, timestamp: TS.into(), data };
    round_trip("events-request", &EventsRequest::batch(vec![envelope; 100]).unwrap());
    round_trip(
        "events-response",
        &EventsResponse {
            success: true,
            processed: 1,
            failed: 1,
            event_ids: vec!["evt_1".into()],
            failures: vec![EventFailure { index: 1, event_type: "x".into(), error: "Unknown event type: x".into() }],
        },
    );
    let no_failures =
        round_trip("events-response", &EventsResponse { success: true, processed: 1, ..Default::default() });
    assert!(no_failures.get("failures").is_none(), "failures only when non-empty");

    round_trip(
        "introspect-request",
        &IntrospectRequest { token: Credential::new("client-token"), expected_team_id: Some("t".into()) },
    );
    let active = IntrospectResponse {
        active: true,
        sub: Some("u1".into()),
        team_id: Some("t1".into()),
        scope: Some("mcp:read mcp:tools:execute".into()),
        aud: Some(Audience::Many(vec!["http://localhost:3001/mcp".into()])),
        ..IntrospectResponse::default()
    };
    round_trip("introspect-response", &active);
    assert_eq!(active.scopes(), ["mcp:read", "mcp:tools:execute"]);
    round_trip("introspect-response", &IntrospectResponse::inactive("invalid_token", "Token has expired"));

    round_trip(
        "oauth-token-request",
        &OAuthTokenRequest { installation_id: "i".into(), user_id: "u".into(), team_id: "t".into() },
    );
    round_trip(
        "oauth-token-status-response",
        &OAuthTokenStatus {
            exists: true,
            expired: Some(false),
            expires_at: Some("2025-12-22T12:00:00Z".into()),
            can_refresh: Some(true),
        },
    );
    round_trip("oauth-token-status-response", &OAuthTokenStatus::default());
    round_trip(
        "oauth-token-retrieve-response",
        &OAuthToken {
            access_token: Credential::new("ya29.a0AfB_byABC123"),
            refresh_token: Some(Credential::new("1//0gABC123")),
            token_type: Some("Bearer".into()),
            expires_at: Some("2025-12-22T12:00:00Z".into()),
            scope: Some("read write".into()),
        },
    );
}

#[test]
fn the_examples_of_the_protocol_document_validate_and_parse() {
    // §2.1, §2.2, §2.3
    let _: RegisterRequest = example(
        "register-request",
        json!({"name": "dev-satellite-001", "capabilities": ["stdio", "http", "sse"],
               "system_info": {"os": "linux linux", "arch": "x64", "node_version": "v24.1.0", "memory_mb": 15923}}),
    );
    let registered: RegisterResponse = example(
        "register-response",
        json!({"success": true, "satellite": {"id": "k6hm1j7sy2radj8", "name": "dev-satellite-001",
               "satellite_type": "global", "team_id": null, "status": "inactive",
               "api_key": "deploystack_satellite_api_global_EACQ7NeRD4gNjFjPAiz90AR7NqL-LF9d"},
               "message": "Satellite registered successfully. Status set to 'inactive' - admin activation required."}),
    );
    assert_eq!(
        registered.satellite.api_key.expose(),
        "deploystack_satellite_api_global_EACQ7NeRD4gNjFjPAiz90AR7NqL-LF9d"
    );
    let refused: BackendError = example(
        "register-error",
        json!({"success": false, "error": "token_already_used", "message": "m", "instructions": "i"}),
    );
    assert_eq!(refused.registration_code(), RegisterErrorCode::TokenAlreadyUsed);

    // §3.2 with §3.3 and §3.5 in place of their placeholders; §3.4; §3.6
    let mcp_status = json!({
        "summary": {"total_instances": 3, "active_instances": 2, "dormant_instances": 5, "total_tools": 42,
                    "online_servers": 4, "offline_servers": 1, "error_servers": 0},
        "instances": [{"installation_id": "U3hCfHenbK5kH2_8ehSGx",
                       "installation_name": "github-acme-plhdo1j4kuit0et-U3hCfHenbK5kH2_8ehSGx",
                       "instance_id": "inst_8f2k…", "user_id": "plhdo1j4kuit0et", "team_id": "4vj7igb2fcwzmko",
                       "status": "running", "transport_type": "stdio", "uptime_seconds": 412, "message_count": 17,
                       "error_count": 0, "health_status": "unknown", "pid": 48211}],
        "tool_names": [{"namespaced_name": "github:create_issue", "server_slug": "github", "transport": "stdio"}],
        "server_status_counts": {"online": 4, "offline": 1, "error": 0, "requires_reauth": 0}
    });
    let normalized = json!({
        "timestamp": "…",
        "satellite_info": {"satellite_id": "…", "version": "…", "uptime_ms": 3600000},
        "summary": {"total_teams": 1, "total_servers": 3, "total_tools": 12, "running_servers": 2, "healthy_servers": 2},
        "teams": {"<team_slug>_<team_id>": {"team_id": "…", "team_slug": "…", "server_ids": ["<process_id>"]}},
        "servers": {"<process_id>": {"installation_name": "…", "installation_id": "…", "server_slug": "…",
                    "transport_type": "stdio|http", "status": "running|configured|…", "health_status": "healthy|unhealthy|unknown",
                    "tool_ids": ["slug:tool"], "uptime_ms": 1, "message_count": 1, "error_count": 0, "pid": 1}},
        "tools": {"slug:tool": {"namespaced_name": "slug:tool", "original_name": "tool", "transport": "stdio|http", "description": "…"}}
    });
    let beat: HeartbeatRequest = example(
        "heartbeat-request",
        json!({
            "status": "active",
            "system_metrics": {"cpu_usage_percent": 0, "memory_usage_mb": 87, "disk_usage_percent": 0, "uptime_seconds": 3600},
            "processes": [],
            "processes_by_team": {"4vj7igb2fcwzmko": [{"installation_id": "U3hCfHenbK5kH2_8ehSGx",
                "installation_name": "github-acme-plhdo1j4kuit0et-U3hCfHenbK5kH2_8ehSGx", "status": "running",
                "pid": 48211, "uptime_seconds": 412, "message_count": 17, "error_count": 0,
                "health_status": "unknown", "last_activity": "2025-01-15T10:29:58.120Z"}]},
            "mcp_status": mcp_status,
            "normalized_data": normalized,
            "error_count": 0, "version": "0.1.0", "satellite_url": "https://satellite.example.com"
        }),
    );
    assert_eq!(beat.mcp_status.map(|s| s.summary.total_tools), Some(42));
    let verification: HeartbeatRequest = example(
        "heartbeat-request",
        json!({"status": "active", "system_metrics": {"cpu_usage_percent": 0, "memory_usage_mb": 64,
               "disk_usage_percent": 0, "uptime_seconds": 2}, "processes": [], "error_count": 0, "version": "1.0.0"}),
    );
    assert_eq!(
        serde_json::to_value(&verification).unwrap(),
        serde_json::to_value(HeartbeatRequest::verification("1.0.0", 64, 2)).unwrap()
    );
    let _: Ack = example(
        "ack-response",
        json!({"success": true, "message": "Heartbeat recorded for satellite k6hm1j7sy2radj8"}),
    );

    // §4.2, with each payload example of §6 as a command
    let payloads = [
        (
            "configure",
            json!({"event": "mcp_installation_created", "installation_id": "U3hCfHenbK5kH2_8ehSGx",
                             "team_id": "4vj7igb2fcwzmko", "user_id": "plhdo1j4kuit0et"}),
        ),
        (
            "configure",
            json!({"event": "mcp_installation_deleted", "installation_id": "U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko"}),
        ),
        (
            "configure",
            json!({"event": "team_member_removed", "team_id": "4vj7igb2fcwzmko", "user_id": "plhdo1j4kuit0et"}),
        ),
        (
            "configure",
            json!({"action": "update_tool_status", "installation_id": "U3hCfHenbK5kH2_8ehSGx", "tool_name": "delete_repo",
                             "is_disabled": true, "team_id": "4vj7igb2fcwzmko", "server_slug": "github"}),
        ),
        (
            "configure",
            json!({"event": "mcp_recovery", "installation_id": "U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko"}),
        ),
        (
            "configure",
            json!({"event": "mcp_redeploy", "installation_id": "wDhLsJlAryOnfcK9qX5CE", "team_id": "4vj7igb2fcwzmko",
                             "user_id": "plhdo1j4kuit0et", "commit_sha": "abc123def456…", "branch": "main"}),
        ),
        (
            "health_check",
            json!({"check_type": "credential_validation", "installation_id": "inst_123", "team_id": "team_xyz"}),
        ),
        ("health_check", json!({})),
        ("kill", json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx"})),
        ("restart", json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx", "reason": "error_recovery"})),
        ("spawn", json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx"})),
        ("invalidate_user_token_cache", json!({"user_id": "plhdo1j4kuit0et", "user_email": "alice@example.com"})),
    ];
    let commands: Vec<Value> = payloads
        .iter()
        .enumerate()
        .map(|(i, (kind, payload))| {
            json!({"id": format!("cmd_{i}"), "command_type": kind, "priority": "immediate", "payload": payload,
                   "correlation_id": "corr_91x…"})
        })
        .collect();
    let poll: CommandsResponse = example(
        "commands-response",
        json!({"commands": commands, "polling_mode": "immediate", "next_poll_interval": 2}),
    );
    let intents: Vec<_> = poll
        .commands
        .iter()
        .filter_map(|c| match &c.kind {
            CommandKind::Configure(p) => Some(p.intent()),
            _ => None,
        })
        .collect();
    use ConfigureIntent::*;
    assert_eq!(intents, [Refresh, Refresh, Refresh, UpdateToolStatus, Recovery, Redeploy]);
    assert!(poll
        .commands
        .iter()
        .all(|c| !matches!(c.kind, CommandKind::Unknown { .. } | CommandKind::Malformed { .. })));

    // §5
    let _: CommandResult = example(
        "command-result-request",
        json!({"command_id": "cmd_7Jb2…", "status": "completed", "result": {"configuration_applied": true,
               "total_servers": 12, "enabled_servers": 12, "startup_time_ms": 0}}),
    );
    let _: CommandResult = example(
        "command-result-request",
        json!({"command_id": "cmd_7Jb2…", "status": "failed", "error_message": "MCP server configuration not found: github-acme-…"}),
    );
    let _: BackendError =
        example("error", json!({"success": false, "error": "Command not found or does not belong to this satellite"}));

    // §7.2
    let config: ConfigResponse = example(
        "config-response",
        json!({"mcp_servers": {
            "notion-acme-plhdo1j4kuit0et-Q2cXbq1x8LdYp0aZ9aBcD": {
                "installation_id": "Q2cXbq1x8LdYp0aZ9aBcD", "team_id": "4vj7igb2fcwzmko", "team_slug": "acme",
                "server_name": "Notion", "server_slug": "notion", "installation_name": "Notion", "transport_type": "http",
                "url": "https://mcp.notion.com/mcp?workspace=acme", "headers": {"X-Api-Key": "team_secret"},
                "timeout": 45000, "enabled": true, "user_id": "plhdo1j4kuit0et", "user_slug": "plhdo1j4kuit0et",
                "requires_oauth": true, "secret_metadata": {"headers": ["X-Api-Key"], "query_params": ["workspace"]}}},
            "satellite_config": {
                "polling_intervals": {"normal": 30, "immediate": 2, "error_backoff_max": 300},
                "resource_limits": {"max_processes": 100, "max_memory_per_process": "1GB", "max_cpu_percent": 80},
                "team_settings": {"allowed_servers": ["*"], "security_policies": [], "isolation_level": "process"},
                "logging": {"level": "info", "enable_audit": true, "retention_days": 30},
                "network": {"timeout_seconds": 30, "retry_attempts": 3}}}),
    );
    assert_eq!(config.desired_state().instances.len(), 1);
    assert_eq!(config.satellite_config.and_then(|c| c.polling_intervals).and_then(|p| p.normal), Some(30));

    // §8.1, §8.2
    let batch: EventsRequest = example(
        "events-request",
        json!({"events": [{"type": "mcp.server.status_changed", "timestamp": TS, "data": {
            "installation_id": "U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko", "user_id": "plhdo1j4kuit0et",
            "status": "online", "status_message": "MCP server is online and ready", "timestamp": TS}}]}),
    );
    conforms("event.mcp.server.status_changed", &Value::Object(batch.events[0].data.clone()));
    let answer: EventsResponse = example(
        "events-response",
        json!({"success": true, "processed": 43, "failed": 2, "event_ids": ["evt_1736512345_abc123def"],
               "failures": [{"index": 5, "type": "mcp.unknown.event", "error": "Unknown event type: mcp.unknown.event"},
                            {"index": 12, "type": "mcp.tools.discovered",
                             "error": "Validation failed: /tools/0 must have required property 'token_count'"}]}),
    );
    assert_eq!(answer.failures.len(), 2);

    // §8.5 examples
    conforms(
        "event.mcp.server.logs",
        &json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko", "user_id": "plhdo1j4kuit0et",
                "logs": [{"level": "error", "message": "Connection refused to http://localhost:3568/sse",
                          "metadata": {"error_code": "ECONNREFUSED"}, "timestamp": TS},
                         {"level": "info", "message": "MCP Server started successfully", "timestamp": "2025-01-15T10:30:02.000Z"}]}),
    );
    conforms(
        "event.mcp.request.logs",
        &json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko",
                "requests": [{"user_id": "plhdo1j4kuit0et", "tool_name": "github:list_repos", "tool_params": {"owner": "deploystackio"},
                              "tool_response": {"content": [{"type": "text", "text": "…"}]}, "response_time_ms": 234,
                              "success": true, "timestamp": TS},
                             {"user_id": "plhdo1j4kuit0et", "tool_name": "slack:send_message", "tool_params": {"channel": "#general"},
                              "response_time_ms": 456, "success": false, "error_message": "Channel not found",
                              "timestamp": "2025-01-15T10:30:05.000Z"}]}),
    );
    conforms(
        "event.mcp.tools.discovered",
        &json!({"installation_id": "U3hCfHenbK5kH2_8ehSGx",
                "installation_name": "github-acme-plhdo1j4kuit0et-U3hCfHenbK5kH2_8ehSGx", "team_id": "4vj7igb2fcwzmko",
                "server_slug": "github", "tool_count": 2, "total_tokens": 301,
                "tools": [{"tool_name": "create_issue", "description": "Create a new issue in a repository",
                           "input_schema": {"type": "object", "properties": {"repo": {"type": "string"}, "title": {"type": "string"}},
                                            "required": ["repo", "title"]}, "token_count": 142},
                          {"tool_name": "list_repos", "description": "List repositories for an owner",
                           "input_schema": {"type": "object", "properties": {"owner": {"type": "string"}}}, "token_count": 159}],
                "discovered_at": TS}),
    );
    conforms(
        "event.mcp.client.activity",
        &json!({"user_id": "plhdo1j4kuit0et", "team_id": "4vj7igb2fcwzmko", "oauth_client_id": "dyn_1757880447836_uvze3d0yc",
                "auth_type": "oauth", "auth_identifier": "dyn_1757880447836_uvze3d0yc", "client_name": "VS Code",
                "user_agent": "undici", "ip_address": "203.0.113.7", "session_id": "550e8400-e29b-41d4-a716-446655440000",
                "request_count": 12, "tool_call_count": 3, "last_activity_at": TS}),
    );

    // §10
    let _: IntrospectRequest = example("introspect-request", json!({"token": "<client bearer token>"}));
    let active: IntrospectResponse = example(
        "introspect-response",
        json!({"active": true, "sub": "plhdo1j4kuit0et", "username": "alice", "client_id": "dyn_1757880447836_uvze3d0yc",
               "scope": "mcp:read mcp:tools:execute offline_access", "aud": ["https://satellite.example.com/mcp"],
               "iss": "https://cloud.deploystack.io", "exp": 1737000000, "iat": 1736990000, "team_id": "4vj7igb2fcwzmko",
               "team_name": "acme", "team_role": "team_admin", "team_permissions": ["mcp.servers.use"]}),
    );
    assert_eq!(active.audiences(), ["https://satellite.example.com/mcp"]);
    assert_eq!(active.scopes().len(), 3);
    let inactive: IntrospectResponse = example(
        "introspect-response",
        json!({"active": false, "error": "invalid_token", "error_description": "Token has expired"}),
    );
    assert!(!inactive.active);

    // §11
    let _: OAuthTokenRequest = example(
        "oauth-token-request",
        json!({"installation_id": "Q2cXbq1x8LdYp0aZ9aBcD", "user_id": "plhdo1j4kuit0et", "team_id": "4vj7igb2fcwzmko"}),
    );
    let _: OAuthTokenStatus = example(
        "oauth-token-status-response",
        json!({"exists": true, "expired": false, "expires_at": "2025-12-22T12:00:00Z", "can_refresh": true}),
    );
    let token: OAuthToken = example(
        "oauth-token-retrieve-response",
        json!({"access_token": "ya29.a0AfB_byABC123…", "refresh_token": "1//0gABC123…", "token_type": "Bearer",
               "expires_at": "2025-12-22T12:00:00Z", "scope": "read write"}),
    );
    assert!(!format!("{token:?}").contains("ya29"), "tokens never show in Debug");
    let _: BackendError = example(
        "error",
        json!({"success": false, "error": "OAuth tokens not found for this installation - user needs to authorize"}),
    );
    let _: HealthResponse = example("health-response", json!({"status": "ok"}));
}

#[test]
fn every_event_constructor_produces_data_its_schema_accepts() {
    let config = ConfigResponse::from_entries([("github-acme-u1-i1", entry("u1"))]);
    let spec = config.desired_state().instances.into_values().next().unwrap();
    let at = chrono::Utc::now();
    let crash = CrashReport {
        pid: Some(42),
        exit_code: None,
        signal: Some(9),
        uptime_seconds: 3,
        crash_count: 4,
        will_restart: false,
    };
    let mut events = vec![
        Event::started(&spec, Some(42), 120),
        Event::started(&spec, None, 0),
        Event::crashed(&spec, &crash),
        Event::crashed(&spec, &CrashReport { exit_code: Some(-1), signal: None, ..crash.clone() }),
        Event::restarted(&spec, Some(42), Some(43), 1),
        Event::permanently_failed(&spec, &crash),
        Event::dormant(&spec, Some(42), 180, at),
        Event::respawned(&spec, Some(44), 0, 35),
        Event::log_rate_limited(&spec, 17, 60, 100),
        Event::status_changed(&spec, InstanceStatus::Online, None, at),
    ];
    for status in InstanceStatus::ALL {
        events.push(Event::status_changed(&spec, status, Some("why"), at));
    }
    let tool = satellite::model::ToolDef::listing([
        json!({"name": "search", "description": "Search", "inputSchema": {"type": "object"}}),
    ]);
    events.push(Event::tools_discovered(&spec, &tool, &[12]));
    events.push(Event::tools_discovered(&spec, &[], &[]));
    let added = satellite::model::catalog_diff(
        &[],
        &[satellite::model::ToolDef::from_listing(&json!({"name": "search"})).unwrap()],
    );
    events.push(Event::tools_updated(&spec, &added, &[], 1));
    events.push(Event::server_logs(
        "i1",
        "t1",
        "u1",
        vec![ServerLogEntry { level: "info".into(), message: "up".into(), timestamp: TS.into() }],
    ));
    let call = RequestLogEntry {
        user_id: "u1".into(),
        tool_name: "github:search".into(),
        tool_params: Some(serde_json::value::to_raw_value(&json!({"q": "x"})).unwrap()),
        response_time_ms: 12,
        success: true,
        timestamp: TS.into(),
        tool_response: Some(serde_json::value::to_raw_value(&json!({"content": []})).unwrap()),
        error_message: None,
    };
    let failed = RequestLogEntry {
        success: false,
        tool_params: None,
        tool_response: None,
        error_message: Some("no".into()),
        ..call.clone()
    };
    events.push(Event::request_logs("i1", "t1", vec![call, failed]));
    let activity = ClientActivity {
        user_id: "u1".into(),
        team_id: "t1".into(),
        oauth_client_id: "c1".into(),
        auth_type: "oauth".into(),
        auth_identifier: "c1".into(),
        client_name: "Cursor".into(),
        user_agent: "Cursor/1".into(),
        ip_address: "203.0.113.7".into(),
        request_count: 3,
        tool_call_count: 1,
        last_activity_at: TS.into(),
        session_id: None,
    };
    events.push(Event::client_activity(&activity));
    events.push(Event::client_activity(&ClientActivity { session_id: Some("s1".into()), ..activity }));
    events.push(Event::client_connected(&ClientConnected {
        session_id: "s1".into(),
        client_type: "claude",
        user_agent: "claude-ai".into(),
        team_id: "t1".into(),
        transport: "sse",
        ip_address: "unknown".into(),
    }));
    events.push(Event::client_disconnected(&ClientDisconnected {
        session_id: "s1".into(),
        team_id: "t1".into(),
        connection_duration_seconds: 5,
        tool_execution_count: 2,
        disconnect_reason: "client_close",
    }));
    events.push(Event::config_error(ConfigErrorKind::Auth, "401", Some(401), 60));
    events.push(Event::config_error(ConfigErrorKind::Network, "refused", None, 60));
    let envelopes: Vec<EventEnvelope> = events.iter().map(|e| EventEnvelope::of(e).unwrap()).collect();
    let mut seen = std::collections::BTreeSet::new();
    for chunk in envelopes.chunks(MAX_EVENT_BATCH) {
        let batch = serde_json::to_value(EventsRequest::batch(chunk.to_vec()).unwrap()).unwrap();
        conforms("events-request", &batch);
    }
    for envelope in &envelopes {
        conforms(&format!("event.{}", envelope.kind), &Value::Object(envelope.data.clone()));
        seen.insert(envelope.kind);
    }
    assert_eq!(seen.len(), 16, "every constructor of events: {seen:?}");
}

#[test]
fn every_registry_type_has_a_payload_schema() {
    for event_type in EventKind::ALL {
        let validator = proto_validator(&format!("event.{event_type}"));
        assert!(!validator.is_valid(&json!({})), "event.{event_type} requires something");
        assert!(!validator.is_valid(&json!([])), "event.{event_type} wants an object");
    }
}

#[test]
fn broken_bodies_are_rejected() {
    let status_changed =
        json!({"installation_id": "i", "team_id": "t", "user_id": "u", "status": "online", "timestamp": TS});
    conforms("event.mcp.server.status_changed", &status_changed);
    let mut no_user = status_changed.clone();
    no_user.as_object_mut().unwrap().remove("user_id");
    rejected("event.mcp.server.status_changed", &no_user);
    let mut bad_status = status_changed.clone();
    bad_status["status"] = json!("sleeping");
    rejected("event.mcp.server.status_changed", &bad_status);
    let mut bad_time = status_changed.clone();
    bad_time["timestamp"] = json!("yesterday");
    rejected("event.mcp.server.status_changed", &bad_time);
    let mut extra = status_changed.clone();
    extra["extra"] = json!(1);
    conforms("event.mcp.server.status_changed", &extra); // handler schemas allow additional properties

    let one = json!({"type": "mcp.server.status_changed", "timestamp": TS, "data": status_changed});
    conforms("events-request", &json!({"events": [one]}));
    rejected("events-request", &json!({"events": []}));
    rejected("events-request", &json!({"events": vec![one.clone(); 101]}));
    rejected("events-request", &json!({"events": [one], "satellite_id": "x"}));
    let mut extra_field = one.clone();
    extra_field["id"] = json!("evt_1");
    rejected("events-request", &json!({"events": [extra_field]}));
    let mut no_data = one;
    no_data.as_object_mut().unwrap().remove("data");
    rejected("events-request", &json!({"events": [no_data]}));

    let discovered = json!({"installation_id": "i", "installation_name": "p", "team_id": "t", "server_slug": "s",
                            "tool_count": 1, "total_tokens": 1, "discovered_at": TS,
                            "tools": [{"tool_name": "x", "description": "", "input_schema": {}}]});
    rejected("event.mcp.tools.discovered", &discovered);

    rejected("register-request", &json!({"name": "short"}));
    rejected("register-request", &json!({"name": "Upper-Case-Name"}));
    rejected("register-request", &json!({"capabilities": ["stdio"]}));
    rejected("heartbeat-request", &json!({"status": "active"}));
    rejected(
        "heartbeat-request",
        &json!({"status": "sleepy", "system_metrics": {"cpu_usage_percent": 0, "memory_usage_mb": 1}}),
    );
    rejected(
        "heartbeat-request",
        &json!({"status": "active", "system_metrics": {"cpu_usage_percent": 101, "memory_usage_mb": 1}}),
    );
    rejected("command-result-request", &json!({"command_id": "c1"}));
    rejected("command-result-request", &json!({"command_id": "c1", "status": "done"}));
    rejected("introspect-response", &json!({"active": true, "team_id": "t"}));
    rejected("oauth-token-request", &json!({"installation_id": "i", "user_id": "u"}));
    rejected(
        "commands-response",
        &json!({"commands": [{"id": "c", "command_type": "configure", "priority": "immediate",
                              "payload": {"action": "update_tool_status", "installation_id": "i"}}],
                "polling_mode": "immediate", "next_poll_interval": 2}),
    );
    rejected(
        "commands-response",
        &json!({"commands": [{"id": "c", "command_type": "invalidate_user_token_cache", "priority": "normal", "payload": {}}],
                "polling_mode": "normal", "next_poll_interval": 30}),
    );
}
