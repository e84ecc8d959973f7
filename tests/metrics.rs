//! `GET /metrics` after a scripted workload: every family is there, with the values the workload implies.

use std::collections::BTreeMap;
use std::time::Duration;

use satellite::config::sha256_hex;
use satellite::model::InstanceStatus;
use serde_json::json;

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);

/// One sample of the text exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parse the text exposition strictly: every line is a comment or a well-formed sample.
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let labels = body
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, value) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line}"));
                        (key.to_owned(), value.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
        };
        samples.push(Sample { name, labels, value });
    }
    samples
}

/// The value of the one sample named `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .collect();
    match found.as_slice() {
        [] => None,
        many => Some(many.iter().map(|s| s.value).sum()),
    }
}

async fn scrape(base: &str, token: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("scrape");
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let text = response.text().await.unwrap_or_default();
    if status == 200 {
        assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    }
    (status, text)
}

fn token(user: &str) -> String {
    format!("{user}-metrics-token-0123")
}

#[tokio::test]
async fn metrics_after_a_workload_have_every_family_with_plausible_values() {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let config = format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"acme\"\n\
         [[users]]\nid = \"alice\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{}\"]\n\
         [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"d\"\nteam = \"acme\"\nserver = \"demo\"\n",
        sha256_hex(&token("alice"))
    );
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;
    wait_until(DEADLINE, "alice's demo instance online", || {
        let online = sat.satellite.manager().instances().iter().any(|i| i.status().status == InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;

    // The workload: a session, two discovers (one finds nothing), three calls (ok, tool error, ok), one refusal.
    let alice = Caller::connect(&sat, "/mcp", Some(&token("alice"))).await;
    let found = alice.tool("discover_mcp_tools", json!({"query": "echo"})).await;
    assert!(found.to_string().contains("demo:echo"), "{found}");
    alice.tool("discover_mcp_tools", json!({"query": "zzzqqqxxx"})).await;
    assert!(alice.execute("demo:echo", json!({"text": "one"})).await.to_string().contains("one"));
    assert_eq!(alice.execute("demo:fail", json!({})).await["result"]["isError"], true);
    alice.execute("demo:add", json!({"a": 1, "b": 2})).await;
    let stranger = Caller::new(&sat, "/mcp", Some("not-a-known-token-0000"));
    let (refused, _) = stranger.call("tools/list", json!({})).await;
    assert_eq!(refused.as_u16(), 401);

    let (status, text) = scrape(&sat.base_url(), None).await;
    assert_eq!(status, 200, "{text}");
    let samples = parse(&text);
    let get = |name: &str, labels: &[(&str, &str)]| value(&samples, name, labels);

    // HTTP: initialize + 2 discovers + 3 executes = at least 6 POSTs answered 200 on /mcp, one 401.
    let ok_posts = get("satellite_http_requests_total", &[("route", "/mcp"), ("method", "POST"), ("status", "200")]);
    assert!(ok_posts.is_some_and(|n| n >= 6.0), "{ok_posts:?}\n{text}");
    assert_eq!(get("satellite_http_requests_total", &[("route", "/mcp"), ("status", "401")]), Some(1.0));
    let timed = get("satellite_http_request_duration_seconds_count", &[("route", "/mcp"), ("method", "POST")]);
    assert!(timed >= ok_posts, "every request is timed: {timed:?}");
    let total_time = get("satellite_http_request_duration_seconds_sum", &[("route", "/mcp")]).unwrap_or(0.0);
    assert!(total_time > 0.0 && total_time < 60.0, "{total_time}");
    // Discover: one found something, one did not; this satellite's own registry counts exactly these.
    assert_eq!(get("satellite_discover_duration_seconds_count", &[("found", "true")]), Some(1.0));
    assert_eq!(get("satellite_discover_duration_seconds_count", &[("found", "false")]), Some(1.0));
    // Tool calls by server and outcome.
    assert_eq!(get("satellite_tool_calls_total", &[("server", "demo"), ("outcome", "ok")]), Some(2.0));
    assert_eq!(get("satellite_tool_calls_total", &[("server", "demo"), ("outcome", "tool_error")]), Some(1.0));
    assert_eq!(get("satellite_tool_call_duration_seconds_count", &[("server", "demo")]), Some(3.0));
    // Instances, connections, sessions, readiness.
    assert_eq!(get("satellite_instances", &[("status", "online")]), Some(1.0));
    assert_eq!(get("satellite_instances", &[("status", "error")]), Some(0.0));
    assert_eq!(get("satellite_instances_dormant", &[]), Some(0.0));
    assert_eq!(get("satellite_upstream_connections", &[("transport", "stdio")]), Some(1.0));
    assert_eq!(get("satellite_mcp_sessions", &[("kind", "hierarchical")]), Some(1.0));
    assert_eq!(get("satellite_ready", &[]), Some(1.0));
    assert_eq!(get("satellite_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), Some(1.0));
    // Process metrics.
    let rss = get("process_resident_memory_bytes", &[]).unwrap_or(0.0);
    assert!(rss > 1e6, "{rss}");
    assert!(get("process_open_fds", &[]).is_some_and(|n| n > 3.0));
    assert!(get("process_cpu_seconds_total", &[]).is_some());
    // Standalone has no backend: no outbox or backend families to alert on.
    assert!(get("satellite_outbox_events", &[]).is_none());
    assert!(get("satellite_backend_requests_total", &[]).is_none());
    // Nothing identifying in any label: no user, token or instance path.
    for secret in [token("alice").as_str(), "alice", "not-a-known-token"] {
        assert!(!text.contains(secret), "{secret} in /metrics");
    }
    // Labels stay bounded: a made-up path is "other", not a series of its own.
    reqwest::get(format!("{}/made/up/path-123", sat.base_url())).await.expect("request");
    let (_, text) = scrape(&sat.base_url(), None).await;
    assert!(!text.contains("path-123"), "raw paths never become labels");
    assert!(value(&parse(&text), "satellite_http_requests_total", &[("route", "other"), ("status", "404")]).is_some());
}

#[tokio::test]
async fn metrics_in_managed_mode_count_the_backend_loops_the_outbox_and_the_introspection_cache() {
    use crate::common::fake_backend::{FakeBackend, TokenInfo};
    use satellite::backend::wire::ConfigResponse;
    use satellite::control::McpServerEntry;

    let remote = HttpServer::demo(&[]).await;
    let backend = FakeBackend::start().await;
    backend.set_config(&ConfigResponse::from_entries([(
        "demo-acme-bob",
        McpServerEntry {
            installation_id: "demo-acme".into(),
            team_id: "acme".into(),
            team_slug: "acme".into(),
            server_name: "Demo".into(),
            server_slug: Some("demo".into()),
            installation_name: "Demo".into(),
            transport_type: Some("http".into()),
            url: Some(remote.url("/mcp").to_string()),
            enabled: Some(true),
            user_id: "bob".into(),
            ..Default::default()
        },
    )]));
    backend.add_token(&token("bob"), TokenInfo::new("bob", "acme"));
    let dir = tempfile::tempdir().expect("dir");
    let sat = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, dir, |config| {
        config.metrics_token = Some("scrape-secret-0123".to_owned().into());
    })
    .await
    .expect("managed satellite starts");
    wait_until(DEADLINE, "bob's remote instance online", || {
        let online = sat.satellite.manager().instances().iter().any(|i| i.status().status == InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;
    // The first request asks the backend (a miss); the next ones are answered from the cache (hits).
    let bob = Caller::connect(&sat, "/mcp", Some(&token("bob"))).await;
    bob.call("tools/list", json!({})).await;
    bob.execute("demo:echo", json!({"text": "managed"})).await;

    // The scrape token is required when set.
    assert_eq!(scrape(&sat.base_url(), None).await.0, 401);
    assert_eq!(scrape(&sat.base_url(), Some("wrong-token")).await.0, 401);
    let samples: Vec<Sample> = wait_until(DEADLINE, "a heartbeat counted", || {
        let base = sat.base_url();
        async move {
            let (status, text) = scrape(&base, Some("scrape-secret-0123")).await;
            let samples = parse(&text);
            let beats =
                value(&samples, "satellite_backend_requests_total", &[("operation", "heartbeat"), ("outcome", "ok")]);
            (status == 200 && beats.is_some_and(|n| n >= 1.0)).then_some(samples)
        }
    })
    .await;
    let get = |name: &str, labels: &[(&str, &str)]| value(&samples, name, labels);
    assert!(get("satellite_backend_requests_total", &[("operation", "config"), ("outcome", "ok")])
        .is_some_and(|n| n >= 1.0));
    assert!(get("satellite_backend_requests_total", &[("operation", "poll"), ("outcome", "failed")]).is_some());
    assert!(get("satellite_introspection_cache_total", &[("result", "miss")]).is_some_and(|n| n >= 1.0));
    assert!(get("satellite_introspection_cache_total", &[("result", "hit")]).is_some_and(|n| n >= 2.0));
    let depth = get("satellite_outbox_events", &[]).expect("outbox depth in managed mode");
    let age = get("satellite_outbox_oldest_age_seconds", &[]).expect("outbox age in managed mode");
    assert!(depth >= 0.0 && (0.0..3600.0).contains(&age), "{depth} {age}");
    assert_eq!(get("satellite_upstream_connections", &[("transport", "http")]), Some(1.0));
    assert_eq!(get("satellite_tool_calls_total", &[("server", "demo"), ("outcome", "ok")]), Some(1.0));
}
