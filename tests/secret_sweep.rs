//! The secret sweep: the satellite binary, run as operators run it (standalone, its own SQLite, logging at debug
//! level), is handed known secret values everywhere a secret can be: users' bearer tokens, a JWT and its signing
//! key, an instance token (in a header and in `?token=`), a stdio server's env value, `--api-key VALUE` and
//! `--token=VALUE` arguments, an HTTP upstream's header and query parameter, tokens strangers guess, and a server
//! that prints its own secrets (stderr, an invalid stdout line, its tool answers, its last words before a crash).
//! Every path that writes somewhere runs: listing, search, calls through both routers, a crash and its restart,
//! refused tokens, `check-config`, the status and debug routes, legacy SSE, shutdown. The session ids handed out
//! (Streamable HTTP and legacy SSE) are swept for as well: they are never stored or logged raw. Afterwards no log line of the satellite,
//! byte of its data directory (the database, its WAL, anything else), status or debug answer, or `check-config`
//! output contains any of them; only the MCP client that asked gets a server's answer, unchanged.

use std::process::Stdio;
use std::time::Duration;

use jsonwebtoken::{encode, EncodingKey, Header};
use satellite::config::sha256_hex;
use serde_json::{json, Value};
use tokio::process::Command;

use crate::common::lifecycle::DEADLINE;
use crate::common::*;

const USER_TOKEN: &str = "sweep-user-token-a1b2c3d4e5f6";
const JWT_KEY: &str = "sweep-jwt-signing-key-0123456789abcdef";
const INSTANCE_TOKEN: &str = "ds_inst_5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb5eeb";
const ENV_SECRET: &str = "sweep-env-7f6e5d4c3b2a";
const ARG_SECRET: &str = "sweep-arg-1029384756";
const EQ_SECRET: &str = "sweep-eq-5647382910";
const HEADER_SECRET: &str = "sweep-header-aabbccddeeff";
const QUERY_SECRET: &str = "sweep-query-ffeeddccbbaa";
/// A query secret that must be percent-encoded in a URL (`+`, `/`, `=`, as base64 keys are): a URL echoed in an
/// error names it encoded, as [`ENCODED_QUERY_SECRET_SENT`].
const ENCODED_QUERY_SECRET: &str = "sweep+query/b64==";
const ENCODED_QUERY_SECRET_SENT: &str = "sweep%2Bquery%2Fb64%3D%3D";
const GUESSED: &str = "sweep-guessed-token-99887766";

fn jwt() -> String {
    let exp = chrono::Utc::now().timestamp() + 600;
    let claims = json!({"sub": "alice", "team": "acme", "aud": "sweep-audience", "exp": exp});
    encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_KEY.as_bytes())).expect("a JWT")
}

/// An HTTP server that answers every request 500 with its request line in the body, as many servers' error pages
/// do: what the satellite sent in the URL comes back, percent-encoded as sent.
async fn echoing_errors() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let target = text.split_whitespace().nth(1).unwrap_or_default().to_owned();
                let body = format!("Internal error handling {target}");
                let answer = format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

fn config_text(upstream_url: &str, echoing: std::net::SocketAddr) -> String {
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    format!(
        r#"
[satellite]
debug_route = true
restart_backoff_ms = [10, 10, 10]
handshake_timeout_seconds = 20

[auth.jwt]
algorithm = "HS256"
secret = "{JWT_KEY}"
audience = "sweep-audience"

[[teams]]
id = "acme"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{user_hash}"]

[[servers]]
slug = "leaky"
transport = "stdio"
command = "python3"
args = [{script}, "leaky", "--api-key", "{ARG_SECRET}", "--token={EQ_SECRET}"]
env = {{ API_KEY = "{ENV_SECRET}" }}

[[servers]]
slug = "remote"
transport = "http"
url = "{upstream_url}?api_key={QUERY_SECRET}"
headers = {{ Authorization = "Bearer {HEADER_SECRET}" }}

[[installations]]
id = "i-leaky"
team = "acme"
server = "leaky"

[installations.users.alice]
instance_path = "alice-leaky"
instance_token_sha256 = "{instance_hash}"

[[installations]]
id = "i-remote"
team = "acme"
server = "remote"

# Failures whose error text would carry a secret into a status message, an event and a log line: a remote server
# nothing answers at (reqwest's error names the URL, query included), and one that refuses the handshake with
# an error echoing its key.
[[servers]]
slug = "gone"
transport = "http"
url = "http://127.0.0.1:9/mcp?api_key={QUERY_SECRET}"

[[servers]]
slug = "refusing"
transport = "stdio"
command = "python3"
args = [{script}, "leaky-refuses", "--api-key", "{ARG_SECRET}"]
env = {{ API_KEY = "{ENV_SECRET}" }}

# A server whose error page echoes the request line: the query secret comes back percent-encoded, as sent.
[[servers]]
slug = "echoing"
transport = "http"
url = "http://{echoing}/mcp?api_key={ENCODED_QUERY_SECRET_SENT}"

[[installations]]
id = "i-echoing"
team = "acme"
server = "echoing"

[[installations]]
id = "i-gone"
team = "acme"
server = "gone"

[[installations]]
id = "i-refusing"
team = "acme"
server = "refusing"
"#,
        user_hash = sha256_hex(USER_TOKEN),
        instance_hash = sha256_hex(INSTANCE_TOKEN),
        script = toml_str(&script),
    )
}

/// Every planted secret, and the parts of the JWT that are credentials on their own.
fn planted() -> Vec<String> {
    let jwt = jwt();
    let signature = jwt.rsplit('.').next().unwrap_or_default().to_owned();
    [
        USER_TOKEN,
        JWT_KEY,
        INSTANCE_TOKEN,
        ENV_SECRET,
        ARG_SECRET,
        EQ_SECRET,
        HEADER_SECRET,
        QUERY_SECRET,
        ENCODED_QUERY_SECRET,
        ENCODED_QUERY_SECRET_SENT,
        GUESSED,
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([jwt, signature])
    .collect()
}

async fn post(url: &str, bearer: &str, session: Option<&str>, body: Value) -> (Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(bearer)
        .header("Accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(session) = session {
        request = request.header("Mcp-Session-Id", session);
    }
    match request.send().await {
        Ok(answer) => {
            let session = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
            (session, answer.text().await.unwrap_or_default())
        }
        Err(err) => (None, err.to_string()),
    }
}

async fn session(url: &str, bearer: &str) -> Option<String> {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sweep","version":"1"}}});
    let (session, _) = post(url, bearer, None, init).await;
    let session = session?;
    post(url, bearer, Some(&session), json!({"jsonrpc":"2.0","method":"notifications/initialized"})).await;
    Some(session)
}

fn call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}})
}

/// Every file under `dir`, as bytes, with its path.
fn files_under(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

#[tokio::test]
async fn no_planted_secret_reaches_a_log_line_a_stored_byte_or_an_answer_about_the_satellite() {
    let upstream = HttpServer::demo(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("satellite.toml");
    std::fs::write(&config, config_text(upstream.url("/mcp").as_str(), echoing_errors().await)).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("satellite.log");
    let port = free_port();
    let mut child = Command::new(satellite_exe())
        .arg("serve")
        .current_dir(dir.path())
        .env("SATELLITE_CONFIG", &config)
        .env("SATELLITE_DATA_DIR", &data)
        .env("PORT", port.to_string())
        .env("LOG_LEVEL", "debug")
        .env("SATELLITE_LOG_FORMAT", "json")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(std::fs::File::create(dir.path().join("satellite.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let debug_url = format!("{base}/api/status/debug");
    wait_until(DEADLINE, "both instances online", || {
        let url = debug_url.clone();
        async move {
            let debug: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
            (debug["server_status"]["stats"]["online"] == 2).then_some(())
        }
    })
    .await;

    wait_until(DEADLINE, "the unreachable, the refusing and the echoing server failed with a message", || {
        let url = debug_url.clone();
        async move {
            let debug: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
            let failed = |slug: &str| {
                debug["servers_by_team"]["acme"].as_object().into_iter().flat_map(|t| t.values()).any(|list| {
                    list.as_array().into_iter().flatten().any(|s| {
                        s["server_slug"] == slug
                            && s["instance_status"] != "online"
                            && s["message"].as_str().is_some_and(|m| !m.is_empty())
                    })
                })
            };
            (failed("gone") && failed("refusing") && failed("echoing")).then_some(())
        }
    })
    .await;

    // What a client sees: the hierarchical router with a static token and with a JWT. Session ids are handles a
    // stranger could use: they are swept for too.
    let mcp = format!("{base}/mcp");
    let mut client_saw = String::new();
    let mut session_ids = Vec::new();
    for bearer in [USER_TOKEN.to_owned(), jwt()] {
        let session = session(&mcp, &bearer).await.expect("a session");
        session_ids.push(session.clone());
        let s = Some(session.as_str());
        for (id, body) in [
            (1, json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})),
            (2, call(2, "discover_mcp_tools", json!({"query": "ok"}))),
            (3, call(3, "execute_mcp_tool", json!({"tool_path": "leaky:ok", "arguments": {}}))),
            (4, call(4, "execute_mcp_tool", json!({"tool_path": "remote:echo", "arguments": {"text": "hi"}}))),
            (5, call(5, "list_mcp_resources", json!({}))),
            (6, call(6, "execute_mcp_tool", json!({"tool_path": "leaky:missing", "arguments": {}}))),
        ] {
            let _ = id;
            client_saw.push_str(&post(&mcp, &bearer, s, body).await.1);
        }
    }
    assert!(client_saw.contains(ENV_SECRET), "the client gets the server's own answer unchanged: {client_saw}");

    // A legacy SSE stream and one message on it.
    let legacy = reqwest::Client::new().get(format!("{base}/sse")).bearer_auth(USER_TOKEN).send().await.unwrap();
    let mut legacy_body = legacy.bytes_stream();
    let mut seen = String::new();
    let endpoint = tokio::time::timeout(DEADLINE, async {
        loop {
            let chunk = futures::StreamExt::next(&mut legacy_body).await.expect("stream open").expect("bytes");
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(line) = seen.lines().find(|l| l.starts_with("data:") && l.contains("/message?session")) {
                return line.trim_start_matches("data:").trim().to_owned();
            }
        }
    })
    .await
    .expect("the endpoint event");
    session_ids.push(endpoint.rsplit('=').next().unwrap_or_default().to_owned());
    post(&format!("{base}{endpoint}"), USER_TOKEN, None, json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})).await;
    drop(legacy_body);

    // The instance router, by header and by `?token=`, then a crash asked for directly.
    let instance = format!("{base}/i/alice-leaky/mcp");
    let session = session(&instance, INSTANCE_TOKEN).await.expect("an instance session");
    session_ids.push(session.clone());
    post(&instance, INSTANCE_TOKEN, Some(&session), call(7, "ok", json!({}))).await;
    let by_query = format!("{instance}?token={INSTANCE_TOKEN}");
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"q","version":"1"}}});
    let _ = reqwest::Client::new()
        .post(&by_query)
        .header("Accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await;
    post(&instance, INSTANCE_TOKEN, Some(&session), call(8, "exit", json!({}))).await;

    // Strangers: guessed tokens on every door.
    for url in [mcp.clone(), instance.clone(), format!("{base}/i/nope/mcp"), format!("{base}/message?session=x")] {
        post(&url, GUESSED, None, json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})).await;
    }
    let _ = reqwest::Client::new().get(format!("{base}/i/alice-leaky/mcp?token={GUESSED}")).send().await;

    // The crash is recorded and the server is back.
    wait_until(DEADLINE, "leaky restarted after its crash", || {
        let url = debug_url.clone();
        async move {
            let debug = reqwest::get(url).await.ok()?.text().await.ok()?;
            let value: Value = serde_json::from_str(&debug).ok()?;
            (value["server_status"]["stats"]["online"] == 2 && debug.contains("exit")).then_some(())
        }
    })
    .await;

    // Everything the satellite tells about itself.
    let mut answers = String::new();
    for route in ["/api/status/debug", "/api/status", "/health", "/api/status/backend"] {
        if let Ok(answer) = reqwest::get(format!("{base}{route}")).await {
            answers.push_str(&answer.text().await.unwrap_or_default());
        }
    }
    let check = Command::new(satellite_exe())
        .arg("check-config")
        .env("SATELLITE_CONFIG", &config)
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    answers.push_str(&String::from_utf8_lossy(&check.stdout));
    answers.push_str(&String::from_utf8_lossy(&check.stderr));
    assert!(answers.contains("leaky") && answers.contains("--api-key"), "the sinks were really read: {answers}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;

    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.lines().count() > 20, "the satellite logged at debug level: {logged}");
    assert!(logged.contains("invalid json line"), "the leaky server's bad line was logged (masked)");
    let stored = files_under(&data);
    assert!(stored.iter().any(|(path, _)| path.ends_with("satellite.db")), "the database was read");
    let mut leaks = Vec::new();
    assert!(session_ids.iter().all(|id| id.len() >= 16), "real session ids: {session_ids:?}");
    for secret in planted().into_iter().chain(session_ids) {
        for (sink, text) in
            [("the satellite's log", logged.as_bytes()), ("a status, debug or check-config answer", answers.as_bytes())]
        {
            if let Some(at) = find(text, secret.as_bytes()) {
                leaks.push(format!("{secret} in {sink}: …{}…", context(text, at)));
            }
        }
        for (path, bytes) in &stored {
            if let Some(at) = find(bytes, secret.as_bytes()) {
                leaks.push(format!("{secret} in {path}: …{}…", context(bytes, at)));
            }
        }
    }
    assert!(leaks.is_empty(), "planted secrets found:\n{}", leaks.join("\n"));
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn context(bytes: &[u8], at: usize) -> String {
    let start = at.saturating_sub(120);
    let end = (at + 120).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..end]).replace('\n', " ")
}
