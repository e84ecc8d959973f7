//! A client's own `progressToken` comes back on the server's progress as it was sent, whatever the upstream's
//! transport (a stdio child, Streamable HTTP, legacy SSE) and through both routers, in both protocol eras; a token
//! the specification does not allow is refused.

use std::time::Duration;

use reqwest::StatusCode;
use satellite::config::sha256_hex;
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::Value;

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-token-0123456789";
const TOOL: &str = "trigger-long-running-operation";

fn instance_token(path: &str) -> String {
    format!("ds_inst_{}", sha256_hex(path))
}

/// Tokens as a client writes them (JSON text): every string and every number the specification allows, the
/// unusual ones above all, and one shaped like the satellite's own tokens.
fn tokens() -> Vec<String> {
    let long = format!("\"{}\"", "long token ".repeat(1000));
    TOKENS.iter().map(|token| token.to_string()).chain([long]).chain(INEXACT.iter().map(|t| t.to_string())).collect()
}

/// The tokens written back as their very text: strings, integers that fit 64 bits, floats in shortest form.
const TOKENS: &[&str] = &[
    r#""""#,
    r#""ünïcødé ✓ 🚀 \u0000 \"quoted\"""#,
    r#""satellite-1""#,
    "0",
    "-1",
    "7",
    "1.5",
    "-0.25",
    "9007199254740993",
    "18446744073709551615",
    "-9223372036854775808",
];

/// Numbers a client may write that come back as the same value in another text: the nearest double, in shortest
/// form (1000.0 for 1e3), which is what every client that reads numbers as doubles (JavaScript) sent.
const INEXACT: &[&str] =
    &["1e3", "2.5E-7", "18446744073709551616", "-9223372036854775809", "123456789012345678901234567890"];

/// The three upstreams, each server-everything (from npm): over stdio, Streamable HTTP and legacy SSE; the
/// satellite with one instance of each for alice (`alice-<slug>`).
async fn with_everything() -> (TestSatellite, Vec<HttpServer>) {
    let (http, sse) = (HttpServer::everything("streamableHttp").await, HttpServer::everything("sse").await);
    let node = toml_str(&node_bin("mcp-server-everything").to_string_lossy());
    let mut config = format!(
        "[sandbox]\nallowed_commands = [{node}]\n[[teams]]\nid = \"acme\"\n\
         [[users]]\nid = \"alice\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{}\"]\n\
         [[servers]]\nslug = \"pipe\"\ntransport = \"stdio\"\ncommand = {node}\nargs = [\"stdio\"]\n\
         [[servers]]\nslug = \"web\"\ntransport = \"http\"\nurl = \"{}\"\n\
         [[servers]]\nslug = \"old\"\ntransport = \"sse\"\nurl = \"{}\"\n",
        sha256_hex(ALICE),
        http.url("/mcp"),
        sse.url("/sse"),
    );
    for slug in ["pipe", "web", "old"] {
        config += &format!(
            "[[installations]]\nid = \"i-{slug}\"\nteam = \"acme\"\nserver = \"{slug}\"\n\
             [installations.users.alice]\ninstance_path = \"alice-{slug}\"\ninstance_token_sha256 = \"{}\"\n",
            sha256_hex(&instance_token(&format!("alice-{slug}")))
        );
    }
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;
    for slug in ["pipe", "web", "old"] {
        let pid = ProcessId::from(format!("{slug}-acme-alice-i-{slug}").as_str());
        wait_until(DEADLINE, &format!("{slug} online"), || {
            let online = sat.satellite.manager().get(&pid).is_some_and(|i| i.status().status == InstanceStatus::Online);
            async move { online.then_some(()) }
        })
        .await;
    }
    (sat, vec![http, sse])
}

/// The 2026-07-28 envelope keys, as `_meta` text to go before the progress token.
const MODERN_META: &str =
    r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"#;

/// The body of a `tools/call` of the long-running tool (one step, at once) carrying `token` (JSON text) as its
/// progress token: on `/mcp` through `execute_mcp_tool` when `slug` is given, else on the instance's own endpoint.
fn call_body(slug: Option<&str>, token: &str, modern: bool) -> String {
    let meta = format!(r#"{{{}"progressToken":{token}}}"#, if modern { MODERN_META } else { "" });
    let arguments = r#"{"duration":0,"steps":1}"#;
    let params = match slug {
        Some(slug) => format!(
            r#"{{"name":"execute_mcp_tool","arguments":{{"tool_path":"{slug}:{TOOL}","arguments":{arguments}}},"_meta":{meta}}}"#
        ),
        None => format!(r#"{{"name":"{TOOL}","arguments":{arguments},"_meta":{meta}}}"#),
    };
    format!(r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{params}}}"#)
}

/// The JSON-RPC messages of an answer (a JSON body, or the `data:` lines of an SSE stream), each as its text.
fn message_texts(answer: &str) -> Vec<String> {
    if answer.trim_start().starts_with('{') {
        return vec![answer.trim().to_owned()];
    }
    answer.lines().filter_map(|line| line.strip_prefix("data:")).map(|data| data.trim().to_owned()).collect()
}

/// The progress token a progress notification carries, as the satellite wrote it (serde_json writes a value
/// back in one way: the same text for the same parsed value).
fn token_text(message: &str) -> Option<String> {
    let value: Value = serde_json::from_str(message).ok()?;
    serde_json::to_string(value.pointer("/params/progressToken")?).ok()
}

/// Call the long-running tool with `token` and what came back: the progress tokens heard (as the satellite wrote
/// them) and the answer.
async fn progress_heard(caller: &Caller, body: String, modern: bool) -> (Vec<String>, Value) {
    let headers = if modern { modern_headers(&serde_json::from_str(&body).expect("a JSON body")) } else { Vec::new() };
    let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let response = caller.send(body, &extra).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap_or_default();
    let messages = message_texts(&text);
    let heard =
        messages.iter().filter(|m| m.contains(r#""notifications/progress""#)).filter_map(|m| token_text(m)).collect();
    let answer = messages
        .iter()
        .filter_map(|m| serde_json::from_str::<Value>(m).ok())
        .find(|m| m["id"] == 11)
        .unwrap_or_else(|| panic!("no answer: {text}"));
    (heard, answer)
}

/// How a number a client sent is written back: as it was, when the satellite's JSON keeps its text (an integer
/// that fits 64 bits, a float in shortest form); otherwise the same value, the nearest double, in shortest form.
fn written_back(token: &str) -> String {
    let value: Value = serde_json::from_str(token).expect("a JSON token");
    serde_json::to_string(&value).expect("written")
}

/// Every string and every number a client may send as its progress token comes back on the server's progress as
/// it was sent: the same JSON type and value, and for a string, an integer that fits 64 bits or a float in shortest
/// form the very text. Through a stdio child, a Streamable HTTP and a legacy SSE server, on an instance's endpoint
/// and through `execute_mcp_tool` on `/mcp`, from a handshake-era session and a 2026-07-28 request. Before, the
/// client's token went to a Streamable HTTP server as it was: server-everything (the reference SDK) refused a
/// float or an integer past 2^53 (400, told the client as the server's error), and wrote 1e3 (1000.0 to it) back
/// as 1000, another type.
#[tokio::test]
async fn a_clients_own_progress_token_comes_back_as_it_was_sent() {
    let tokens = tokens();
    // Written back as sent, text and all: every token but the numbers that neither a 64-bit integer nor a double
    // in shortest form writes as they came (the workspace's serde_json keeps those as the nearest double).
    let inexact: Vec<&str> = tokens.iter().map(String::as_str).filter(|token| written_back(token) != *token).collect();
    assert_eq!(inexact, INEXACT, "the tokens not written back as their very text");
    let (sat, _servers) = with_everything().await;
    let mcp = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let mcp_modern = Caller::new(&sat, "/mcp", Some(ALICE));
    let mut failures = Vec::new();
    for slug in ["pipe", "web", "old"] {
        let path = format!("/i/alice-{slug}/mcp?token={}", instance_token(&format!("alice-{slug}")));
        let direct = Caller::connect(&sat, &path, None).await;
        let direct_modern = Caller::new(&sat, &path, None);
        let routes: [(&str, &Caller, Option<&str>, bool); 4] = [
            ("instance", &direct, None, false),
            ("instance 2026", &direct_modern, None, true),
            ("/mcp", &mcp, Some(slug), false),
            ("/mcp 2026", &mcp_modern, Some(slug), true),
        ];
        for (route, caller, on_mcp, modern) in routes {
            for token in &tokens {
                let (heard, answer) = progress_heard(caller, call_body(on_mcp, token, modern), modern).await;
                let ok = answer["result"]["content"][0]["text"].as_str().is_some_and(|t| t.contains("completed"));
                let expected = written_back(token);
                if !ok || heard != [expected.clone()] {
                    failures.push(format!("{slug} {route} {token}: heard {heard:?}, answer {answer}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(sat.satellite.shutdown().await);
}

/// A progress token that is neither a string nor a number (null, a boolean, an array, an object) is refused with
/// -32602 and a reason, on both routers, in both eras, whatever the upstream: the specification allows none, and
/// the reference server refuses such a request too. Before, a stdio or legacy SSE server ran the call and the
/// client got its odd token back; a Streamable HTTP server refused it with an error that blamed the server.
#[tokio::test]
async fn a_progress_token_that_is_neither_string_nor_number_is_refused() {
    let (sat, _servers) = with_everything().await;
    let mcp = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let mcp_modern = Caller::new(&sat, "/mcp", Some(ALICE));
    let mut failures = Vec::new();
    for slug in ["pipe", "web", "old"] {
        let path = format!("/i/alice-{slug}/mcp?token={}", instance_token(&format!("alice-{slug}")));
        let direct = Caller::connect(&sat, &path, None).await;
        let direct_modern = Caller::new(&sat, &path, None);
        let routes: [(&str, &Caller, Option<&str>, bool); 4] = [
            ("instance", &direct, None, false),
            ("instance 2026", &direct_modern, None, true),
            ("/mcp", &mcp, Some(slug), false),
            ("/mcp 2026", &mcp_modern, Some(slug), true),
        ];
        for (route, caller, on_mcp, modern) in routes {
            for token in ["null", "true", "[1]", r#"{"a":1}"#] {
                let body = call_body(on_mcp, token, modern);
                let headers = if modern { modern_headers(&serde_json::from_str(&body).unwrap()) } else { Vec::new() };
                let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let text = caller.send(body, &extra).await.text().await.unwrap_or_default();
                let messages = message_texts(&text);
                let heard = messages.iter().any(|m| m.contains("notifications/progress"));
                let answer =
                    messages.iter().filter_map(|m| serde_json::from_str::<Value>(m).ok()).find(|m| m["id"] == 11);
                let refused = answer.as_ref().is_some_and(|a| {
                    a["error"]["code"] == -32602
                        && a["error"]["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("progressToken must be a string or a number"))
                });
                if heard || !refused {
                    failures.push(format!("{slug} {route} {token}: {text}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(sat.satellite.shutdown().await);
}
