//! Drop-in compatibility with every DeployStack backend (BP §0 "Tolerant reader", §10 audience): the same
//! managed scenario against a FakeBackend that words its answers minimally, as the real backend does, in full,
//! and with fields nobody knows yet. The satellite must behave the same way in all four.

use std::collections::BTreeSet;
use std::time::Duration;

use satellite::backend::wire::{
    Command, CommandKind, CommonPayload, ConfigResponse, ConfigurePayload, PollingMode, Priority, RestartPayload,
    ResultStatus,
};
use satellite::control::McpServerEntry;
use satellite::model::InstanceStatus;
use serde_json::{json, Value};

use crate::common::answer_style::AnswerStyle;
use crate::common::fake_backend::{FakeBackend, TokenInfo};
use crate::common::lifecycle::{wait_status, DEADLINE};

use crate::common::*;

const STDIO: &str = "plain-acme-alice-inst1";
const REMOTE: &str = "demo-acme-alice-inst2";
const ALICE_TOKEN: &str = "alice-oauth-token-0123456789";

fn config(remote: &HttpServer) -> ConfigResponse {
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    let stdio = McpServerEntry {
        installation_id: "inst1".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Plain".into(),
        server_slug: Some("plain".into()),
        installation_name: "Plain".into(),
        transport_type: Some("stdio".into()),
        command: Some("python3".into()),
        args: Some(vec![script, "plain".into()]),
        enabled: Some(true),
        user_id: "alice".into(),
        ..Default::default()
    };
    let remote = McpServerEntry {
        installation_id: "inst2".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Demo".into(),
        server_slug: Some("demo".into()),
        installation_name: "Demo".into(),
        transport_type: Some("http".into()),
        url: Some(remote.url("/mcp").to_string()),
        timeout: Some(45000.0),
        enabled: Some(true),
        user_id: "alice".into(),
        ..Default::default()
    };
    ConfigResponse::from_entries([(STDIO, stdio), (REMOTE, remote)])
}

fn fast(config: &mut satellite::config::Config) {
    config.activity_interval = Duration::from_millis(300);
    if let satellite::config::Mode::Managed(m) = &mut config.mode {
        m.heartbeat_interval = Duration::from_millis(200);
        m.event_interval = Duration::from_millis(100);
        // A minimal answer carries no poll hint: the idle interval applies.
        m.poll_idle = Duration::from_secs(1);
    }
}

/// What a user and the backend can observe of one run.
#[derive(Debug, PartialEq)]
struct Observed {
    tool_paths: BTreeSet<String>,
    stdio_answer: String,
    remote_answer: String,
    results: Vec<(String, ResultStatus)>,
    foreign_audience: (u16, i64),
    /// `aud: []`: present, naming nothing (OQ-14: refused).
    empty_audience: (u16, i64),
    no_audience_ok: bool,
}

async fn run(style: AnswerStyle) -> (Observed, BTreeSet<String>) {
    let remote = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_style(style);
    // Poll every 2 s even when idle, so pushed commands are picked up quickly (a minimal answer has no hint:
    // the 1 s idle interval of `fast` applies).
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    backend.set_config(&config(&remote));
    backend.add_token(ALICE_TOKEN, TokenInfo::new("alice", "acme"));
    backend.add_token("foreign-token-0123456789", TokenInfo::new("alice", "acme").with_aud(&["https://elsewhere/mcp"]));
    backend.add_token("no-aud-token-0123456789", TokenInfo::new("alice", "acme").without_aud());
    backend.add_token("empty-aud-token-0123456789", TokenInfo::new("alice", "acme").with_aud(&[]));
    let sat =
        TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempfile::tempdir().unwrap(), fast)
            .await
            .unwrap_or_else(|err| panic!("{style:?}: the managed satellite starts: {err}"));
    wait_status(&sat, STDIO, InstanceStatus::Online).await;
    wait_status(&sat, REMOTE, InstanceStatus::Online).await;

    // A client authenticated by introspection with the backend's audience finds and runs both servers' tools.
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE_TOKEN)).await;
    let listed = alice.tool("discover_mcp_tools", json!({"query": "*"})).await;
    let listed: Value = serde_json::from_str(listed["result"]["content"][0]["text"].as_str().unwrap_or("{}")).unwrap();
    let tool_paths: BTreeSet<String> = listed["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["tool_path"].as_str().map(str::to_owned))
        .collect();
    let text = |reply: &Value| reply["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    // The whole reply when it carries no text, so a failure shows why (seen in CI for both: an empty answer).
    let answer = |reply: Value| Some(text(&reply)).filter(|t| !t.is_empty()).unwrap_or_else(|| reply.to_string());
    let stdio_answer = answer(alice.execute("plain:ok", json!({})).await);
    let remote_answer = answer(alice.execute("demo:echo", json!({"text": "tolerant"})).await);

    // Commands of each kind reach their terminal result.
    let commands = [
        Command::new(
            "c-refresh",
            Priority::Immediate,
            CommandKind::Configure(ConfigurePayload {
                common: CommonPayload { event: Some("mcp_installation_updated".into()), ..Default::default() },
                ..Default::default()
            }),
        ),
        Command::new(
            "c-restart",
            Priority::Immediate,
            CommandKind::Restart(RestartPayload {
                common: CommonPayload { installation_id: Some("inst1".into()), ..Default::default() },
                ..Default::default()
            }),
        ),
        Command::new(
            "c-tool",
            Priority::High,
            CommandKind::Configure(ConfigurePayload {
                action: Some("update_tool_status".into()),
                common: CommonPayload { installation_id: Some("inst2".into()), ..Default::default() },
                tool_name: Some("add".into()),
                is_disabled: Some(true),
                ..Default::default()
            }),
        ),
        Command::new(
            "c-unknown",
            Priority::Normal,
            CommandKind::Unknown { command_type: "teleport".into(), payload: json!({}) },
        ),
    ];
    let mut results = Vec::new();
    for command in commands {
        let id = command.id.clone();
        backend.push_command(command);
        let result = wait_until(DEADLINE, &format!("{style:?}: a result for {id}"), || async {
            backend.results_for(&id).into_iter().next()
        })
        .await;
        results.push((id, result.status));
    }
    wait_status(&sat, STDIO, InstanceStatus::Online).await;

    // A token issued for another resource is refused (BP §10); one without any audience is accepted (OQ-14).
    let (status, reply) =
        Caller::new(&sat, "/mcp", Some("foreign-token-0123456789")).call("tools/list", json!({})).await;
    let foreign_audience = (status.as_u16(), reply["error"]["code"].as_i64().unwrap_or_default());
    let (status, reply) =
        Caller::new(&sat, "/mcp", Some("empty-aud-token-0123456789")).call("tools/list", json!({})).await;
    let empty_audience = (status.as_u16(), reply["error"]["code"].as_i64().unwrap_or_default());
    let mut no_audience = Caller::new(&sat, "/mcp", Some("no-aud-token-0123456789"));
    no_audience.initialize().await;
    let (status, _) = no_audience.call("ping", json!({})).await;
    let no_audience_ok = status.is_success();

    // What reached the backend: every body was valid, and these events arrived.
    // Each run causes every one of these; waiting for all of them keeps a late batch from looking like a difference.
    let expected = [
        "mcp.server.status_changed",
        "mcp.server.started",
        "mcp.tools.discovered",
        "mcp.tool.executed",
        "config.refreshed",
        "mcp.client.activity",
        "mcp.request.logs",
        "mcp.server.logs",
        "security.auth.failed",
    ];
    let kinds = wait_until(DEADLINE, &format!("{style:?}: the events delivered"), || async {
        let kinds: BTreeSet<String> = backend.events().iter().map(|e| e.kind.as_str().to_owned()).collect();
        expected.iter().all(|k| kinds.contains(*k)).then_some(kinds)
    })
    .await;
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
    let observed =
        Observed { tool_paths, stdio_answer, remote_answer, results, foreign_audience, empty_audience, no_audience_ok };
    (observed, kinds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_satellite_behaves_alike_against_minimal_real_full_and_extended_backends() {
    let (real, real_events) = run(AnswerStyle::Real).await;
    assert!(real.tool_paths.contains("plain:ok") && real.tool_paths.contains("demo:echo"), "{real:?}");
    assert_eq!(real.remote_answer, "tolerant");
    assert!(!real.stdio_answer.is_empty());
    assert_eq!(
        real.results,
        [
            ("c-refresh".to_owned(), ResultStatus::Completed),
            ("c-restart".to_owned(), ResultStatus::Completed),
            ("c-tool".to_owned(), ResultStatus::Completed),
            ("c-unknown".to_owned(), ResultStatus::Failed),
        ]
    );
    assert_eq!(real.foreign_audience, (401, -32002), "a foreign audience is an invalid token");
    assert_eq!(real.empty_audience, (401, -32002), "an audience naming nothing is not this satellite");
    assert!(real.no_audience_ok);
    for style in [AnswerStyle::Minimal, AnswerStyle::Full, AnswerStyle::Extra] {
        let (observed, events) = run(style).await;
        assert_eq!(observed, real, "{style:?} answers change what the satellite does");
        assert_eq!(events, real_events, "{style:?} answers change which events are sent");
    }
}

/// Every event type of the registry (BP §8.4) is emitted where it happens and reaches the backend, each payload
/// valid against its schema in proto/ (the fake checks each one and records a violation otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_type_reaches_the_backend() {
    use crate::common::fake_backend::Endpoint;
    use crate::common::lifecycle::{call, instance};
    use satellite::backend::wire::TargetPayload;
    use satellite::events::EventKind;

    const FLOOD: &str = "flood-acme-alice-inst3";
    const CRASHER: &str = "crash-acme-bob-inst4";
    let remote = HttpServer::demo(&[]).await;
    let remote_addr = remote.addr;
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    let stdio = |installation: &str, slug: &str, user: &str, mode: &str| McpServerEntry {
        installation_id: installation.into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: slug.into(),
        server_slug: Some(slug.into()),
        installation_name: slug.into(),
        transport_type: Some("stdio".into()),
        command: Some("python3".into()),
        args: Some(vec![script.clone(), mode.into()]),
        enabled: Some(true),
        user_id: user.into(),
        ..Default::default()
    };
    let mut entries = config(&remote);
    for (key, entry) in
        [(FLOOD, stdio("inst3", "flood", "alice", "flood-stderr")), (CRASHER, stdio("inst4", "crash", "bob", "plain"))]
    {
        entries.mcp_servers.insert(key.into(), serde_json::to_value(entry).unwrap());
    }
    backend.set_config(&entries);
    backend.add_token(ALICE_TOKEN, TokenInfo::new("alice", "acme"));
    let tweak = |config: &mut satellite::config::Config| {
        fast(config);
        let lifecycle = &mut config.upstream.lifecycle;
        lifecycle.restart_backoff = vec![Duration::ZERO];
        lifecycle.log_rate_limit = 20;
        lifecycle.log_rate_warning_interval = Duration::from_millis(200);
        lifecycle.max_calls_per_instance = 1;
        lifecycle.call_queue_timeout = Duration::from_millis(200);
        lifecycle.idle_timeout = Some(Duration::from_secs(2));
        lifecycle.spawn_grace = Duration::ZERO;
        lifecycle.idle_check_interval = Duration::from_millis(100);
    };
    let sat =
        TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempfile::tempdir().unwrap(), tweak)
            .await
            .expect("the managed satellite starts");
    wait_status(&sat, STDIO, InstanceStatus::Online).await;
    wait_status(&sat, REMOTE, InstanceStatus::Online).await;

    // A client: activity, tool calls (request logs, tool.executed); two at once on a one-slot instance: a limit.
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE_TOKEN)).await;
    alice.execute("plain:ok", json!({})).await;
    let (a, b) =
        tokio::join!(alice.execute("demo:slow", json!({"ms": 1500})), alice.execute("demo:slow", json!({"ms": 1500})));
    assert!([&a, &b].iter().any(|r| r.to_string().contains("busy")), "one call finds the slot taken: {a} {b}");
    // A stranger's token: security.auth.failed.
    let (status, _) = Caller::new(&sat, "/mcp", Some("not-a-token-0123456789")).call("ping", json!({})).await;
    assert_eq!(status.as_u16(), 401);
    // A legacy SSE client comes and goes: client.connected, client.disconnected.
    let stream = reqwest::Client::new()
        .get(format!("{}/sse", sat.base_url()))
        .bearer_auth(ALICE_TOKEN)
        .header("user-agent", "Cursor/1.0")
        .send()
        .await
        .expect("sse stream");
    assert!(stream.status().is_success());
    drop(stream);

    // Bob's server crashes: crashed, restarted; three more crashes in the window: permanently_failed.
    for crash in 1..=4 {
        wait_status(&sat, CRASHER, InstanceStatus::Online).await;
        let _ = call(&sat, CRASHER, "exit", json!({})).await;
        wait_until(DEADLINE, &format!("crash {crash} reported"), || async {
            let crashes = backend.events().iter().filter(|e| e.kind == EventKind::ServerCrashed).count();
            (crashes >= crash).then_some(())
        })
        .await;
    }
    wait_status(&sat, CRASHER, InstanceStatus::PermanentlyFailed).await;

    // Idle stdio servers go dormant and wake on the next call.
    wait_until(DEADLINE, "the plain server dormant", || async { instance(&sat, STDIO).is_dormant().then_some(()) })
        .await;
    alice.execute("plain:ok", json!({})).await;

    // The remote server changes its tools; a recovery re-discovers them: tools.updated.
    drop(remote);
    wait_until(DEADLINE, "the old demo server gone", || async {
        tokio::net::TcpStream::connect(remote_addr).await.is_err().then_some(())
    })
    .await;
    let _remote = HttpServer::demo_on(&remote_addr.to_string(), &["--without-tool", "add"]).await;
    let recovery = |id: &str| {
        Command::new(
            id,
            Priority::Immediate,
            CommandKind::Configure(ConfigurePayload {
                common: CommonPayload {
                    event: Some("mcp_recovery".into()),
                    installation_id: Some("inst2".into()),
                    ..Default::default()
                },
                ..Default::default()
            }),
        )
    };
    backend.push_command(recovery("c-recover"));
    // The satellite's own configure event: every running instance discovered again now.
    backend.push_command(Command::new(
        "c-tools-refresh",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload {
            common: CommonPayload { event: Some("mcp_tools_refresh".into()), ..Default::default() },
            ..Default::default()
        }),
    ));
    // A config fetch that fails: config.error; one that works: config.refreshed.
    backend.fail_next(Endpoint::Config, 500, 1);
    backend.push_command(Command::new(
        "c-refresh-fails",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload::default()),
    ));
    // A kill stops alice's plain server: mcp.server.stopped.
    backend.push_command(Command::new(
        "c-kill",
        Priority::Immediate,
        CommandKind::Kill(TargetPayload {
            common: CommonPayload { installation_id: Some("inst1".into()), ..Default::default() },
        }),
    ));
    for id in ["c-recover", "c-tools-refresh", "c-refresh-fails", "c-kill"] {
        wait_until(DEADLINE, &format!("a result for {id}"), || async { backend.results_for(id).into_iter().next() })
            .await;
    }
    let refreshed = backend.results_for("c-tools-refresh").remove(0);
    let answer = serde_json::to_value(&refreshed).unwrap_or_default();
    assert_eq!(answer["status"], "completed", "{answer}");
    assert!(answer["result"]["refreshed"].as_array().is_some_and(|r| !r.is_empty()), "{answer}");

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: BTreeSet<EventKind> = backend.events().iter().map(|e| e.kind).collect();
        let missing: Vec<EventKind> = EventKind::ALL.into_iter().filter(|k| !seen.contains(k)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never delivered: {missing:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // GET /api/status/backend: reachability, identity, what the loops last did, the outbox; never the key.
    let status: Value =
        reqwest::get(format!("{}/api/status/backend", sat.base_url())).await.unwrap().json().await.unwrap();
    assert_eq!(status["connection_status"], "connected", "{status}");
    assert_eq!(status["backend_url"], backend.url());
    assert!(status["satellite_id"].as_str().is_some_and(|id| !id.is_empty()), "{status}");
    for channel in ["heartbeat", "poll", "config", "events"] {
        assert!(status[channel]["successes"].as_u64() > Some(0), "{channel}: {status}");
        assert!(status[channel]["last_at"].is_string(), "{channel}: {status}");
    }
    assert_eq!(status["config"]["last_ok"], false, "the last config fetch was the scripted 500: {status}");
    assert!(status["config"]["last_error"].as_str().is_some_and(|e| e.contains("500")), "{status}");
    assert_eq!(status["config"]["consecutive_failures"], 1, "{status}");
    assert!(status["outbox"]["depth"].is_i64(), "{status}");
    let stored: Value = serde_json::from_str(
        &std::fs::read_to_string(sat.dir.path().join("persistent_data/backend.key.json")).unwrap(),
    )
    .unwrap();
    let key = stored["api_key"].as_str().unwrap();
    assert!(!status.to_string().contains(key), "the api key never shows");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}

/// The answers of the credential endpoints (BP §11 OAuth token status and retrieval, §12 GitHub installation
/// tokens) are read alike in every style: a remote server that needs the user's OAuth token comes online with
/// it, and a GitHub-deployed Python server is downloaded with the installation token and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_answers_are_read_alike_in_every_style() {
    use crate::common::fake_backend::Endpoint;
    use crate::common::lifecycle::{call, text_of};
    use satellite::backend::wire::{Credential, OAuthToken, OAuthTokenRequest, OAuthTokenStatus};

    const OAUTH: &str = "demo-acme-alice-oauth1";
    const GITHUB: &str = "ghpy-acme-alice-gh2";
    const SHA: &str = "1111111111111111111111111111111111111111";
    let remote = HttpServer::demo(&[]).await;
    let oauth_entry = McpServerEntry {
        installation_id: "oauth1".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "Demo".into(),
        server_slug: Some("demo".into()),
        installation_name: "Demo".into(),
        transport_type: Some("http".into()),
        url: Some(remote.url("/mcp").to_string()),
        enabled: Some(true),
        requires_oauth: Some(true),
        user_id: "alice".into(),
        ..Default::default()
    };
    let github_entry = McpServerEntry {
        installation_id: "gh2".into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: "ghpy".into(),
        server_slug: Some("ghpy".into()),
        installation_name: "ghpy".into(),
        transport_type: Some("stdio".into()),
        command: Some("npx".into()),
        args: Some(vec!["-y".into(), "github:acme/gh-py-echo".into()]),
        enabled: Some(true),
        user_id: "alice".into(),
        source: Some("github".into()),
        repository_url: Some("https://github.com/acme/gh-py-echo".into()),
        git_commit_sha: Some(SHA.into()),
        git_branch: Some("main".into()),
        runtime: Some("python".into()),
        ..Default::default()
    };
    let tarball =
        crate::github::tarball(&repo_path("tests/fixtures/github/python-server"), "acme-gh-py-echo-1111111", &[]);

    let mut seen = Vec::new();
    for style in [AnswerStyle::Real, AnswerStyle::Minimal, AnswerStyle::Full, AnswerStyle::Extra] {
        let backend = FakeBackend::start().await;
        backend.set_style(style);
        backend.set_poll_hint(Some((PollingMode::Normal, 2)));
        backend
            .set_config(&ConfigResponse::from_entries([(OAUTH, oauth_entry.clone()), (GITHUB, github_entry.clone())]));
        backend.add_oauth_token(
            OAuthTokenRequest { installation_id: "oauth1".into(), user_id: "alice".into(), team_id: "acme".into() },
            OAuthTokenStatus { exists: true, expired: Some(false), expires_at: None, can_refresh: Some(true) },
            Some(OAuthToken {
                access_token: Credential::new("ya29.alice"),
                refresh_token: None,
                token_type: Some("Bearer".into()),
                expires_at: None,
                scope: None,
            }),
        );
        backend.add_github_installation("gh2");
        backend.add_tarball("acme/gh-py-echo", SHA, tarball.clone());
        let tarballs = backend.tarball_base();
        let sat =
            TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, tempfile::tempdir().unwrap(), {
                move |c| {
                    fast(c);
                    c.upstream.discovery_timeout = Duration::from_secs(240);
                    if let satellite::config::Mode::Managed(m) = &mut c.mode {
                        m.github_tarball_base = url::Url::parse(&tarballs).unwrap();
                    }
                }
            })
            .await
            .unwrap_or_else(|err| panic!("{style:?}: the managed satellite starts: {err}"));
        wait_status(&sat, OAUTH, InstanceStatus::Online).await;
        let echoed = call(&sat, OAUTH, "echo", json!({"text": "with a token"})).await.expect("echo");
        let long = Duration::from_secs(120);
        wait_until(long, &format!("{style:?}: the github deployment online"), || async {
            let id = satellite::model::ProcessId::from(GITHUB);
            sat.satellite.manager().get(&id).is_some_and(|i| i.status().status == InstanceStatus::Online).then_some(())
        })
        .await;
        let version = call(&sat, GITHUB, "py_version", json!({})).await.expect("py_version");
        let asked = |endpoint| backend.calls(endpoint).len();
        assert!(asked(Endpoint::TokenStatus) >= 1 && asked(Endpoint::TokenRetrieve) >= 1, "{style:?}: OAuth asked");
        assert!(asked(Endpoint::GithubToken) >= 1, "{style:?}: the installation token was fetched");
        backend.assert_no_violations();
        assert!(sat.satellite.shutdown().await);
        seen.push((style, text_of(&echoed).to_owned(), text_of(&version).contains("in_venv true")));
    }
    for (style, echoed, in_venv) in &seen {
        assert_eq!(echoed, "with a token", "{style:?}");
        assert!(in_venv, "{style:?}: the deployment runs in its own environment");
    }
}
