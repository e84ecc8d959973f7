//! Issue 75, item 3: the cache hints (`ttlMs`, `cacheScope`) a 2026-07-28 client gets say what the satellite can
//! vouch for: private wherever the answer is the caller's own, kept long only where the client would hear of a
//! change, as long as a re-discovery period where that is how the satellite finds changes, and not at all otherwise.

use satellite::config::sha256_hex;
use serde_json::{json, Value};

use crate::common::*;

const ALICE: &str = "cache-hints-alice-token-0123456789";
const HOUR_MS: u64 = 60 * 60 * 1000;

/// Three demo servers for alice: a 2026-07-28 one that announces tool changes, a handshake-era one the satellite
/// re-discovers every 7 s, and a 2026-07-28 one that announces nothing.
fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let server = |slug: &str, args: &str, extra: &str| {
        format!(
            "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\", {args}]\n{extra}\
             [[installations]]\nid = \"i-{slug}\"\nteam = \"acme\"\nserver = \"{slug}\"\n\
             [installations.users.alice]\ninstance_path = \"alice-{slug}\"\ninstance_token_sha256 = \"{}\"\n",
            sha256_hex(&instance_token(slug))
        )
    };
    format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"acme\"\n[[users]]\nid = \"alice\"\nteams = [\"acme\"]\n\
         token_sha256 = [\"{}\"]\n{}{}{}",
        sha256_hex(ALICE),
        server("watched", "\"--protocol\", \"modern\", \"--mutable-tools\"", ""),
        server("polled", "\"--protocol\", \"legacy\"", "rediscover_seconds = 7\n"),
        server("plain", "\"--protocol\", \"modern\"", ""),
    )
}

/// The cache hints of a 2026-07-28 request's result on `path`.
async fn hints(sat: &TestSatellite, path: &str, token: Option<&str>, method: &str, params: Value) -> (Value, Value) {
    let mut params = params;
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let (status, _, reply) = Caller::new(sat, path, token).post_modern(&body).await;
    assert!(status.is_success(), "{method} on {path}: {status} {reply}");
    let result = &reply["result"];
    assert_eq!(result["resultType"], "complete", "{method} on {path}: {reply}");
    (result["ttlMs"].clone(), result["cacheScope"].clone())
}

fn instance_token(slug: &str) -> String {
    format!("ds_inst_cache_hints_{slug}_0123456789abcdef0123456789abcdef")
}

fn instance(slug: &str) -> String {
    format!("/i/alice-{slug}/mcp?token={}", instance_token(slug))
}

#[tokio::test]
async fn cache_hints_say_what_the_satellite_can_vouch_for() {
    let sat = TestSatellite::start(&config()).await;
    sat.wait_ready().await;
    for slug in ["watched", "polled", "plain"] {
        wait_instance_online(&sat, format!("{slug}-acme-alice-i-{slug}").as_str()).await;
    }
    let private = json!("private");
    // The server announces tool changes (and says an hour itself): kept an hour, for this caller only, although
    // the server's answer would be the same for anyone with its credentials.
    assert_eq!(
        hints(&sat, &instance("watched"), None, "tools/list", json!({})).await,
        (json!(HOUR_MS), private.clone())
    );
    // Its resources: the server says an hour, but declares no resource list changes and, being 2026-07-28, is
    // not re-discovered for the client's listen: not kept.
    assert_eq!(hints(&sat, &instance("watched"), None, "resources/list", json!({})).await, (json!(0), private.clone()));
    // A handshake-era server that announces nothing, re-discovered every 7 s: its tools are kept 7 s, its prompts
    // (never re-discovered) not at all.
    assert_eq!(hints(&sat, &instance("polled"), None, "tools/list", json!({})).await, (json!(7_000), private.clone()));
    assert_eq!(hints(&sat, &instance("polled"), None, "prompts/list", json!({})).await, (json!(0), private.clone()));
    // Announces nothing, not re-discovered: not kept, whatever it says itself.
    assert_eq!(hints(&sat, &instance("plain"), None, "tools/list", json!({})).await, (json!(0), private.clone()));
    // A read keeps the server's own time.
    let read = hints(&sat, &instance("plain"), None, "resources/read", json!({"uri": "demo://readme"})).await;
    assert_eq!(read, (json!(HOUR_MS), private.clone()));
    // /mcp: the four meta-tools are the same for everyone and change only with the satellite; the rest is the
    // caller's own, and /mcp has no listen to announce changes on.
    assert_eq!(hints(&sat, "/mcp", Some(ALICE), "tools/list", json!({})).await, (json!(HOUR_MS), json!("public")));
    assert_eq!(hints(&sat, "/mcp", Some(ALICE), "resources/list", json!({})).await, (json!(0), private.clone()));
    assert_eq!(hints(&sat, "/mcp", Some(ALICE), "prompts/list", json!({})).await, (json!(0), private));
    assert!(sat.satellite.shutdown().await);
}
