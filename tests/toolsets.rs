//! Toolsets (issue 17): a session selects one with `?toolset=`, or a user's default applies; discover finds and
//! execute runs only its tools; the instructions name it; an unknown or empty toolset is an error, never an empty
//! or a silently full world. Toolsets come from the config file and from `/api/toolsets` (stored in SQLite,
//! per user or per team, surviving a restart, never seen by another team). Real demo-server processes.

use std::time::Duration;

use reqwest::StatusCode;
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const MEMBER: &str = "toolsets-member-token-0123";
const ADMIN: &str = "toolsets-admin-token-0123";
const STRANGER: &str = "toolsets-stranger-token-0123";
const READ_ONLY: &str = "toolsets-read-only-token-0123";

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let sha = satellite::config::sha256_hex;
    let server = |slug: &str, team: &str| {
        format!(
            "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
             [[installations]]\nid = \"{slug}-{team}\"\nteam = \"{team}\"\nserver = \"{slug}\"\n"
        )
    };
    [
        format!(
            "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n[[teams]]\nid = \"other\"\n\
             [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
             [[users]]\nid = \"v\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\nrole = \"admin\"\ndefault_toolset = \"math\"\n\
             [[users]]\nid = \"w\"\nteams = [\"other\"]\ntoken_sha256 = [\"{}\"]\n\
             [[users]]\nid = \"r\"\nteams = [\"other\"]\n[[users.tokens]]\nsha256 = \"{}\"\nscopes = [\"mcp:read\"]\n\
             [[toolsets]]\nname = \"math\"\ndescription = \"Arithmetic only\"\nteam = \"t\"\ntools = [\"alpha:add\", \"beta:ad?\"]\n\
             [[toolsets]]\nname = \"ghost\"\nteam = \"t\"\ntools = [\"nowhere\"]\n",
            sha(MEMBER),
            sha(ADMIN),
            sha(STRANGER),
            sha(READ_ONLY)
        ),
        server("alpha", "t"),
        server("beta", "t"),
        "[[servers]]\nslug = \"gamma\"\ntransport = \"stdio\"\ncommand = ".to_owned()
            + &exe
            + "\nargs = [\"demo-server\"]\n[[installations]]\nid = \"gamma-other\"\nteam = \"other\"\nserver = \"gamma\"\n",
    ]
    .concat()
}

async fn online(sat: &TestSatellite) {
    for id in
        ["alpha-t-u-alpha-t", "beta-t-u-beta-t", "alpha-t-v-alpha-t", "beta-t-v-beta-t", "gamma-other-w-gamma-other"]
    {
        let id = ProcessId::from(id);
        wait_until(DEADLINE, &format!("{id} online"), || {
            let now = sat.satellite.manager().get(&id).map(|i| i.status().status);
            async move { (now == Some(InstanceStatus::Online)).then_some(()) }
        })
        .await;
    }
}

/// The tool paths a discover found, or the JSON-RPC error message.
async fn found(caller: &Caller, query: &str) -> Result<Vec<String>, String> {
    let reply = caller.tool("discover_mcp_tools", json!({"query": query, "limit": 50})).await;
    if let Some(message) = reply.pointer("/error/message").and_then(Value::as_str) {
        return Err(message.to_owned());
    }
    let text = reply.pointer("/result/content/0/text").and_then(Value::as_str).unwrap_or_default();
    let document: Value = serde_json::from_str(text).map_err(|err| format!("{err}: {reply}"))?;
    let mut paths: Vec<String> = document["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["tool_path"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    paths.sort();
    Ok(paths)
}

/// A request to `/api/toolsets…` as `token`; every answer is checked against proto/toolsets.openapi.json.
async fn api(
    sat: &TestSatellite,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request =
        reqwest::Client::new().request(method.clone(), format!("{}{path}", sat.base_url())).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("api request");
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    conforms(&method, path, status, &body);
    (status, body)
}

/// The answer matches the contract's schema for its route, method and status.
fn conforms(method: &reqwest::Method, path: &str, status: StatusCode, body: &Value) {
    let openapi: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_path("proto/toolsets.openapi.json")).expect("contract"))
            .expect("contract JSON");
    let path = path.split('?').next().unwrap_or_default();
    let template = match path {
        "/api/toolsets" | "/api/toolsets/default" => path.to_owned(),
        _ => "/api/toolsets/{name}".to_owned(),
    };
    let method = method.as_str().to_ascii_lowercase();
    let mut schema = openapi["paths"][&template][&method]["responses"][status.as_str()]["content"]["application/json"]
        ["schema"]
        .clone();
    assert!(!schema.is_null(), "proto/toolsets.openapi.json has no {status} for {method} {template}");
    schema["components"] = openapi["components"].clone();
    let validator = jsonschema::validator_for(&schema).expect("valid schema");
    let errors = crate::common::fake_backend::schema_errors(&validator, body);
    assert!(errors.is_empty(), "{method} {path} {status} does not match the contract: {errors:?}\n{body}");
}

async fn session(sat: &TestSatellite, query: &str, token: &str) -> (Caller, Value) {
    let mut caller = Caller::new(sat, &format!("/mcp{query}"), Some(token));
    let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    let (_, headers, reply) = caller.post_raw(body.to_string(), &[]).await;
    caller.session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (caller, reply)
}

#[tokio::test]
async fn a_session_reaches_only_its_toolset_and_an_unknown_or_empty_one_is_a_clear_error() {
    let sat = TestSatellite::start(&config()).await;
    online(&sat).await;

    let (math, init) = session(&sat, "?toolset=math", MEMBER).await;
    let instructions = init.pointer("/result/instructions").and_then(Value::as_str).unwrap_or_default();
    assert!(instructions.contains("toolset 'math' (Arithmetic only)"), "{init}");
    assert_eq!(found(&math, "add two numbers sum").await, Ok(vec!["alpha:add".into(), "beta:add".into()]));
    assert_eq!(found(&math, "echo the text back").await, Ok(vec![]), "echo is outside the toolset");
    assert_eq!(found(&math, "*").await, Ok(vec!["alpha:add".into(), "beta:add".into()]));
    let refused = math.execute("alpha:echo", json!({"text": "x"})).await;
    let message = refused.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains("not in the toolset 'math'"), "{refused}");
    let added = math.execute("beta:add", json!({"a": 2, "b": 3})).await;
    assert_eq!(added.pointer("/result/structuredContent/sum"), Some(&json!(5.0)), "{added}");

    // Without a toolset every tool is there; `all` is every tool too.
    for query in ["", "?toolset=all"] {
        let (everything, _) = session(&sat, query, MEMBER).await;
        let paths = found(&everything, "echo the text back").await.expect("discover");
        assert!(paths.contains(&"alpha:echo".to_owned()) && paths.contains(&"beta:echo".to_owned()), "{paths:?}");
    }

    // An unknown toolset fails the handshake with the reason and what exists; no session is made.
    let (unknown, init) = session(&sat, "?toolset=nope", MEMBER).await;
    let message = init.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains("Unknown toolset 'nope'") && message.contains("ghost, math"), "{init}");
    assert!(unknown.session.is_none(), "a refused toolset made a session");
    // Another team's toolset does not exist for this caller.
    let (_, init) = session(&sat, "?toolset=math", STRANGER).await;
    assert!(init
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .contains("Unknown toolset 'math'"));

    // The legacy SSE transport refuses to open a stream for an unknown toolset, with the reason.
    let refused = reqwest::Client::new()
        .get(format!("{}/sse?toolset=nope", sat.base_url()))
        .bearer_auth(MEMBER)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("sse");
    assert!(!refused.status().is_success(), "{}", refused.status());
    let body = refused.text().await.unwrap_or_default();
    assert!(body.contains("Unknown toolset 'nope'"), "{body}");

    // A toolset that matches none of the caller's tools says so instead of finding nothing.
    let (ghost, _) = session(&sat, "?toolset=ghost", MEMBER).await;
    let empty = found(&ghost, "echo").await.expect_err("an empty toolset is an error");
    assert!(empty.contains("Toolset 'ghost' has no tools") && empty.contains("nowhere"), "{empty}");

    // The config file's default applies when a session selects nothing; `all` overrides it.
    let (defaulted, init) = session(&sat, "", ADMIN).await;
    assert!(init.pointer("/result/instructions").and_then(Value::as_str).unwrap_or_default().contains("'math'"));
    assert_eq!(found(&defaulted, "echo the text back").await, Ok(vec![]));
    let (all, _) = session(&sat, "?toolset=all", ADMIN).await;
    assert!(!found(&all, "echo the text back").await.expect("discover").is_empty());
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn toolsets_made_through_the_api_are_checked_stored_per_user_and_team_and_survive_a_restart() {
    use reqwest::Method;
    let sat = TestSatellite::start(&config()).await;
    online(&sat).await;

    let echoes = json!({"tools": ["*:echo"], "description": "Echo anything"});
    let (status, made) = api(&sat, Method::PUT, "/api/toolsets/echoes", MEMBER, Some(echoes.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["matched_tools"], json!(["alpha:echo", "beta:echo"]), "the preview shows what it takes");
    assert_eq!(api(&sat, Method::PUT, "/api/toolsets/echoes", MEMBER, Some(echoes)).await.0, StatusCode::OK);

    // Refused, each with its reason.
    for (path, token, body, expected, needle) in [
        ("/api/toolsets/bad", MEMBER, json!({"tools": ["a:[b"]}), StatusCode::BAD_REQUEST, "not valid"),
        ("/api/toolsets/empty", MEMBER, json!({"tools": []}), StatusCode::BAD_REQUEST, "at least one pattern"),
        ("/api/toolsets/all", MEMBER, json!({"tools": ["alpha"]}), StatusCode::BAD_REQUEST, "reserved"),
        ("/api/toolsets/math", MEMBER, json!({"tools": ["alpha"]}), StatusCode::CONFLICT, "config file"),
        (
            "/api/toolsets/shared",
            MEMBER,
            json!({"tools": ["alpha"], "scope": "team"}),
            StatusCode::FORBIDDEN,
            "team admin",
        ),
        ("/api/toolsets/x", MEMBER, json!({"tool": ["alpha"]}), StatusCode::BAD_REQUEST, "unknown field"),
        ("/api/toolsets/x", "wrong-token", json!({"tools": ["alpha"]}), StatusCode::UNAUTHORIZED, ""),
        ("/api/toolsets/x", READ_ONLY, json!({"tools": ["gamma"]}), StatusCode::FORBIDDEN, "mcp:tools:execute"),
    ] {
        let (status, body) = api(&sat, Method::PUT, path, token, Some(body)).await;
        assert_eq!(status, expected, "{path}: {body}");
        assert!(body["message"].as_str().unwrap_or_default().contains(needle), "{path}: {body}");
    }
    // A team admin writes the team's toolsets; every member sees them.
    let shared = json!({"tools": ["beta"], "scope": "team"});
    assert_eq!(api(&sat, Method::PUT, "/api/toolsets/shared", ADMIN, Some(shared)).await.0, StatusCode::CREATED);
    let (_, listing) = api(&sat, Method::GET, "/api/toolsets", MEMBER, None).await;
    let names: Vec<&str> =
        listing["toolsets"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["echoes", "shared", "math", "ghost"], "{listing}");
    // Another team sees none of them and cannot select them.
    let (_, theirs) = api(&sat, Method::GET, "/api/toolsets", STRANGER, None).await;
    assert_eq!(theirs["toolsets"], json!([]), "{theirs}");
    let (_, init) = session(&sat, "?toolset=echoes", STRANGER).await;
    assert!(init.to_string().contains("Unknown toolset 'echoes'"), "{init}");

    // A user default applies to sessions that select nothing.
    let (status, body) = api(&sat, Method::PUT, "/api/toolsets/default", MEMBER, Some(json!({"name": "echoes"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = api(&sat, Method::PUT, "/api/toolsets/default", MEMBER, Some(json!({"name": "nope"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a default must name a toolset the user has");
    let (member, _) = session(&sat, "", MEMBER).await;
    assert_eq!(found(&member, "add numbers echo").await, Ok(vec!["alpha:echo".into(), "beta:echo".into()]));

    // Stored: a restart on the same data keeps the toolset and the default.
    let TestSatellite { satellite, dir, .. } = sat;
    assert!(satellite.shutdown().await);
    let sat = TestSatellite::start_in(dir, &config()).await;
    online(&sat).await;
    let (member, init) = session(&sat, "", MEMBER).await;
    assert!(init.to_string().contains("toolset 'echoes' (Echo anything)"), "{init}");
    assert_eq!(found(&member, "add numbers echo").await, Ok(vec!["alpha:echo".into(), "beta:echo".into()]));

    // Deleting the toolset clears the default that named it: the user is back to every tool, not locked out.
    let (status, body) = api(&sat, Method::DELETE, "/api/toolsets/echoes", MEMBER, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(api(&sat, Method::DELETE, "/api/toolsets/echoes", MEMBER, None).await.0, StatusCode::NOT_FOUND);
    let (_, listing) = api(&sat, Method::GET, "/api/toolsets", MEMBER, None).await;
    assert_eq!(listing["default"], Value::Null, "{listing}");
    let (member, _) = session(&sat, "", MEMBER).await;
    assert!(found(&member, "add numbers").await.expect("discover").contains(&"alpha:add".to_owned()));
    // The team toolset is deleted by its scope, by an admin only.
    let (status, _) = api(&sat, Method::DELETE, "/api/toolsets/shared?scope=team", MEMBER, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api(&sat, Method::DELETE, "/api/toolsets/shared?scope=team", ADMIN, None).await;
    assert_eq!(status, StatusCode::OK);

    // What a member can make the satellite keep is bounded.
    for i in 0..satellite::toolsets::MAX_PER_USER {
        let (status, body) =
            api(&sat, Method::PUT, &format!("/api/toolsets/t{i}"), MEMBER, Some(json!({"tools": ["alpha"]}))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) =
        api(&sat, Method::PUT, "/api/toolsets/one-more", MEMBER, Some(json!({"tools": ["alpha"]}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("at most 100"), "{body}");
    let (status, _) = api(&sat, Method::PUT, "/api/toolsets/t0", MEMBER, Some(json!({"tools": ["beta"]}))).await;
    assert_eq!(status, StatusCode::OK, "replacing one is still allowed");
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn an_edited_toolset_applies_to_open_sessions_and_a_config_reload_replaces_the_files_toolsets() {
    let sat = TestSatellite::start(&config()).await;
    online(&sat).await;
    let (math, _) = session(&sat, "?toolset=math", MEMBER).await;
    assert_eq!(found(&math, "echo the text back").await, Ok(vec![]));
    sat.rewrite_config(
        &config().replace("tools = [\"alpha:add\", \"beta:ad?\"]", "tools = [\"alpha:add\", \"alpha:echo\"]"),
    );
    let paths = wait_until(DEADLINE, "the edited toolset", || {
        let math = &math;
        async move { found(math, "echo the text back").await.ok().filter(|p| !p.is_empty()) }
    })
    .await;
    assert_eq!(paths, ["alpha:echo"]);
    assert!(sat.satellite.shutdown().await);
}
