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

/// A TCP pass-through to `target` that keeps every byte clients send (to read the request heads upstream).
async fn recording_proxy(
    target: std::net::SocketAddr,
) -> (std::net::SocketAddr, std::sync::Arc<parking_lot::Mutex<Vec<u8>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let seen = recorded.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else { return };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let upstream = async move {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = client_read.read(&mut buf).await {
                        if n == 0 || server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        seen.lock().extend_from_slice(&buf[..n]);
                    }
                };
                let downstream = tokio::io::copy(&mut server_read, &mut client_write);
                let _ = tokio::join!(upstream, downstream);
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn traces_go_to_the_otlp_endpoint_with_a_span_per_request_and_upstream_call_and_reach_http_upstreams() {
    use std::process::Stdio;
    use warp::Filter;
    // The collector: what the satellite posts to /v1/traces.
    let batches = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<(String, Vec<u8>)>::new()));
    let kept = batches.clone();
    let collector = warp::path!("v1" / "traces")
        .and(warp::post())
        .and(warp::header::optional::<String>("content-type"))
        .and(warp::body::bytes())
        .map(move |content_type: Option<String>, body: bytes::Bytes| {
            kept.lock().push((content_type.unwrap_or_default(), body.to_vec()));
            warp::reply()
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let collector_addr = listener.local_addr().expect("addr");
    tokio::spawn(warp::serve(collector).incoming(listener).run());
    // A remote MCP server behind a proxy that records what the satellite sends it.
    let remote = HttpServer::demo(&[]).await;
    let (proxy, upstream_bytes) = recording_proxy(remote.addr).await;

    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let path = dir.path().join("satellite.toml");
    std::fs::write(
        &path,
        format!(
            "[satellite]\nport = {port}\n[[teams]]\nid = \"t\"\n\
             [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
             [[servers]]\nslug = \"remote\"\ntransport = \"http\"\nurl = \"http://{proxy}/mcp\"\n\
             [[installations]]\nid = \"r\"\nteam = \"t\"\nserver = \"remote\"\n",
            sha256_hex(&token("u"))
        ),
    )
    .expect("config");
    let mut child = tokio::process::Command::new(satellite_exe())
        .args(["serve", "--config", path.to_str().expect("utf-8")])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector_addr}"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let base = format!("http://127.0.0.1:{port}");
    wait_until(DEADLINE, "the remote instance online", || {
        let url = format!("{base}/metrics");
        async move {
            let text = reqwest::get(url).await.ok()?.text().await.ok()?;
            text.contains("satellite_instances{status=\"online\"} 1").then_some(())
        }
    })
    .await;
    upstream_bytes.lock().clear();
    let mut caller = Caller::for_url(format!("{base}/mcp"), Some(&token("u")));
    caller.initialize().await;
    let echoed = caller.execute("remote:echo", json!({"text": "traced"})).await;
    assert!(echoed.to_string().contains("traced"), "{echoed}");

    // The call reached the upstream with a W3C traceparent.
    let sent = String::from_utf8_lossy(&upstream_bytes.lock()).to_ascii_lowercase();
    let traceparent = sent
        .lines()
        .find_map(|line| line.strip_prefix("traceparent: "))
        .unwrap_or_else(|| panic!("no traceparent reached the upstream:\n{sent}"))
        .trim()
        .to_owned();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert!(parts.len() == 4 && parts[1].len() == 32 && parts[2].len() == 16, "{traceparent}");
    let trace_id = parts[1].to_owned();

    // The spans reach the collector as OTLP/protobuf: the request's, and the upstream call's as its child, in the
    // trace the upstream saw (the call runs in a task of its own: it must carry the request's span).
    let trace_bytes: Vec<u8> =
        (0..16).map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).expect("hex")).collect();
    let (request, upstream) = wait_until(DEADLINE, "spans of the call exported", || {
        let spans = exported_spans(&batches.lock());
        let in_trace = |name: &str| spans.iter().find(|s| s.name == name && s.trace_id == trace_bytes).cloned();
        let found = in_trace("http").zip(in_trace("mcp.upstream"));
        async move { found }
    })
    .await;
    assert_eq!(upstream.parent_span_id, request.span_id, "the upstream call is a child of its request's span");
    assert!(request.attributes.iter().any(|a| a.key == "path"), "{:?}", request.attributes);
    let body: Vec<u8> = batches.lock().iter().flat_map(|(_, body)| body.clone()).collect();
    assert!(batches.lock().iter().all(|(content_type, _)| content_type == "application/x-protobuf"));
    assert!(contains(&body, b"satellite"), "service.name is satellite");
    assert!(!contains(&body, b"traced"), "arguments are never span attributes");
    assert!(!contains(&body, token("u").as_bytes()), "tokens are never span attributes");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().expect("pid") as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let status = tokio::time::timeout(DEADLINE, child.wait()).await.expect("exits in time").expect("status");
    assert_eq!(status.code(), Some(0));
}

/// Every span of the OTLP/protobuf export requests `batches` holds.
fn exported_spans(batches: &[(String, Vec<u8>)]) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;
    batches
        .iter()
        .map(|(_, body)| ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP export request"))
        .flat_map(|request| request.resource_spans)
        .flat_map(|resource| resource.scope_spans)
        .flat_map(|scope| scope.spans)
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}
