//! Credentials are unambiguous (issue 73, item 7): an instance token names one instance of one user, a request
//! carries one `Authorization` header, and a JWT names a user of the directory in one of that user's teams. Each
//! is refused where it is first seen: the file by `check-config`, `serve` and the config watch, the request by
//! the HTTP stack, the JWT before any session is made.

use std::time::Duration;

use jsonwebtoken::{encode, EncodingKey, Header};
use reqwest::StatusCode;
use satellite::config::sha256_hex;
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const JWT_SECRET: &str = "credentials-jwt-secret-0123456789abcdef";

fn instance_token(path: &str) -> String {
    format!("ds_inst_{}", sha256_hex(path))
}

/// Alice and Bob in `acme` with an instance each of the demo server, whose instance token hashes are written as
/// given; Carol in `globex`; JWTs signed with `JWT_SECRET`.
fn config(alice_instance: &str, bob_instance: &str) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        r#"
[sandbox]
allowed_commands = [{exe}]

[auth.jwt]
algorithm = "HS256"
secret = "{JWT_SECRET}"

[[teams]]
id = "acme"
[[teams]]
id = "globex"
[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{alice}"]
[[users]]
id = "bob"
teams = ["acme"]
token_sha256 = ["{bob}"]
[[users]]
id = "carol"
teams = ["globex"]
[[servers]]
slug = "demo"
transport = "stdio"
command = {exe}
args = ["demo-server"]
[[installations]]
id = "d-acme"
team = "acme"
server = "demo"
[installations.users.alice]
instance_path = "alice-demo"
instance_token_sha256 = "{alice_instance}"
[installations.users.bob]
instance_path = "bob-demo"
instance_token_sha256 = "{bob_instance}"
"#,
        alice = sha256_hex(ALICE),
        bob = sha256_hex(BOB),
    )
}

/// The file with a token of each instance's own.
fn distinct() -> String {
    config(&sha256_hex(&instance_token("alice-demo")), &sha256_hex(&instance_token("bob-demo")))
}

/// Run the satellite binary with a clean environment; returns (code, stdout, stderr).
async fn run(args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(satellite_exe())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .expect("run satellite");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// The 1-based line of the first occurrence of `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text[..text.find(needle).expect("in the text")].matches('\n').count() + 1
}

/// One instance token hash on two members' instances (in two letter cases), and one equal to a user's own token
/// hash: `check-config` and `serve` exit 64 with one line naming the file, the line and both owners, never the
/// hash. Before, both files were accepted and the one `ds_inst_` token opened both instances.
#[tokio::test]
async fn check_config_and_serve_refuse_an_instance_token_of_two_owners() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = sha256_hex(&instance_token("shared"));
    let alice_user = sha256_hex(ALICE);
    let cases = [
        (config(&shared, &shared.to_uppercase()), shared.to_uppercase(), "bob", "the instance token of user \"alice\""),
        (
            config(&alice_user, &sha256_hex("bob-own")),
            alice_user.clone(),
            "alice",
            "a token of users[0] (user \"alice\")",
        ),
    ];
    for (i, (text, written, refused, first)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("shared{i}.toml"));
        std::fs::write(&path, text).expect("write config");
        let place =
            format!("{} line {}", path.display(), line_of(text, &format!("instance_token_sha256 = \"{written}")));
        for command in ["check-config", "serve"] {
            let (code, out, err) = run(&[command, "--config", path.to_str().expect("utf-8 path")]).await;
            assert_eq!((code, out.as_str()), (64, ""), "{command}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            let key = format!("installations[0].users.{refused}.instance_token_sha256: {place}: ");
            assert!(err.contains(&key), "{command} should name {key}: {err}");
            assert!(err.contains(&format!("the instance token of user \"{refused}\" in installation \"d-acme\"")));
            assert!(err.contains(first), "{command} should name {first}: {err}");
            assert!(!err.to_ascii_lowercase().contains(&written[..16].to_ascii_lowercase()), "a hash shown: {err}");
        }
    }
}

/// An edit that gives Bob's instance Alice's instance token is refused by the config watch, and the last good
/// config stays: Alice's token still opens her instance only.
#[tokio::test]
async fn a_reload_sharing_an_instance_token_is_refused_and_the_last_good_config_stays() {
    let sat = TestSatellite::start(&distinct()).await;
    let alice_hash = sha256_hex(&instance_token("alice-demo"));
    sat.rewrite_config(&config(&alice_hash, &alice_hash));
    wait_until(DEADLINE, "the edit to be refused", || {
        let refused = sat.satellite.config_refusals() == 1;
        async move { refused.then_some(()) }
    })
    .await;
    let bob_hash = sha256_hex(&instance_token("bob-demo"));
    wait_until(DEADLINE, "bob's instance with its own token", || {
        let kept = sat.satellite.manager().desired().iter().any(|spec| {
            spec.instance_path.as_deref() == Some("bob-demo") && spec.instance_token_hash.as_deref() == Some(&bob_hash)
        });
        async move { kept.then_some(()) }
    })
    .await;
    let alice_token = instance_token("alice-demo");
    let on_bobs = Caller::new(&sat, "/i/bob-demo/mcp", Some(&alice_token));
    let (status, _, body) = on_bobs.post_raw(json!({"jsonrpc":"2.0","id":1,"method":"ping"}).to_string(), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(sat.satellite.shutdown().await);
}

/// Two `Authorization` headers (a valid one first, or second) get 400 with the reason on every authenticated
/// route, in the route's own error shape, and neither token comes back. Before, the first header was served.
#[tokio::test]
async fn two_authorization_headers_are_refused_on_every_authenticated_route() {
    let sat = TestSatellite::start(&distinct()).await;
    let alice_instance = instance_token("alice-demo");
    let routes: [(reqwest::Method, &str, &str, bool); 6] = [
        (reqwest::Method::POST, "/mcp", ALICE, true),
        (reqwest::Method::POST, "/i/alice-demo/mcp", alice_instance.as_str(), true),
        (reqwest::Method::GET, "/sse", ALICE, true),
        (reqwest::Method::POST, "/message?session=0123", ALICE, true),
        (reqwest::Method::GET, "/api/analytics/summary", ALICE, false),
        (reqwest::Method::GET, "/api/toolsets", ALICE, false),
    ];
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
        "capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    for (method, path, valid, json_rpc) in routes {
        for pair in [[valid, BOB], [BOB, valid]] {
            let mut request = http
                .request(method.clone(), format!("{}{path}", sat.base_url()))
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(initialize.to_string());
            for token in pair {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let response = request.send().await.expect("request");
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{method} {path}");
            let text = response.text().await.expect("body");
            assert!(!text.contains(valid) && !text.contains(BOB), "a token in the answer: {text}");
            let body: Value = serde_json::from_str(&text).expect("a JSON body");
            let message = if json_rpc { &body["error"]["message"] } else { &body["message"] };
            let message = message.as_str().unwrap_or_default();
            assert!(message.contains("more than one Authorization header"), "{method} {path}: {body}");
            if json_rpc {
                assert_eq!((body["jsonrpc"].as_str(), body["error"]["code"].as_i64()), (Some("2.0"), Some(-32600)));
            } else {
                assert_eq!(body["error"], "bad_request", "{path}: {body}");
            }
        }
    }
    // One header is served as before.
    Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    assert!(sat.satellite.shutdown().await);
}

fn jwt(sub: &str, team: &str) -> String {
    let claims = json!({"sub": sub, "team": team, "exp": chrono::Utc::now().timestamp() + 600});
    encode(&Header::default(), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes())).expect("a JWT")
}

/// Open hierarchical sessions, as `/metrics` counts them.
async fn open_sessions(sat: &TestSatellite) -> u64 {
    let text = reqwest::get(format!("{}/metrics", sat.base_url())).await.expect("scrape").text().await.expect("text");
    let line = text.lines().find(|l| l.starts_with("satellite_mcp_sessions{kind=\"hierarchical\"}"));
    line.and_then(|l| l.rsplit(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// A JWT of the trusted issuer naming a user the file does not know is 401 `invalid_token`; one naming a team its
/// user is not in is 403; neither makes a session. Before, both got one.
#[tokio::test]
async fn a_jwt_for_an_unknown_user_or_another_team_makes_no_session() {
    let sat = TestSatellite::start(&distinct()).await;
    let initialize = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
        "capabilities":{},"clientInfo":{"name":"t","version":"0"}}})
    .to_string();
    let cases = [
        (jwt("mallory", "acme"), StatusCode::UNAUTHORIZED, "invalid_token", "unknown user"),
        (jwt("alice", "globex"), StatusCode::FORBIDDEN, "insufficient_scope", "not a member"),
    ];
    for (token, status, oauth_error, why) in &cases {
        let caller = Caller::new(&sat, "/mcp", Some(token));
        let (got, headers, body) = caller.post_raw(initialize.clone(), &[]).await;
        assert_eq!(got, *status, "{why}: {body}");
        let challenge = headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(challenge.contains(&format!("error=\"{oauth_error}\"")), "{why}: {challenge}");
        assert!(body["error"]["data"]["message"].as_str().unwrap_or_default().contains(why), "{body}");
        assert!(headers.get("mcp-session-id").is_none(), "{why}: a session was made");
    }
    assert_eq!(open_sessions(&sat).await, 0);
    // Alice's JWT for her own team opens a session, as before.
    let alice = jwt("alice", "acme");
    Caller::connect(&sat, "/mcp", Some(&alice)).await;
    wait_until(DEADLINE, "alice's session to be counted", || async { (open_sessions(&sat).await == 1).then_some(()) })
        .await;
    assert!(sat.satellite.shutdown().await);
}
