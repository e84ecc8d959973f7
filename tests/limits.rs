//! Issue 76, item 1: rate limits and quotas on tool calls, counted on the resolved server and tool whichever way the
//! call came (`execute_mcp_tool` on `/mcp`, `tools/call` on `/i/{path}/mcp`), refused with the rule and when to
//! retry, quotas kept across a restart (SQLite here; PostgreSQL shares the same rows between replicas).

use std::time::{Duration, Instant};

use futures::StreamExt;
use satellite::config::sha256_hex;
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const RATE_LIMITED: i64 = -32029;

fn token(user: &str) -> String {
    format!("limits-{user}-token-0123456789abcdef")
}

fn instance_token(user: &str) -> String {
    format!("ds_inst_limits_{user}_0123456789abcdef0123456789abcdef")
}

/// Alice and Bob of acme, each with the demo server, and `limits` as the file's `[[limits]]`.
fn config(limits: &str) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let mut config = format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"acme\"\n[[servers]]\nslug = \"demo\"\n\
         transport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n[[installations]]\nid = \"d\"\n\
         team = \"acme\"\nserver = \"demo\"\n"
    );
    for user in ["alice", "bob"] {
        config += &format!(
            "[installations.users.{user}]\ninstance_path = \"{user}-demo\"\ninstance_token_sha256 = \"{}\"\n",
            sha256_hex(&instance_token(user))
        );
    }
    for user in ["alice", "bob"] {
        config += &format!(
            "[[users]]\nid = \"{user}\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&token(user))
        );
    }
    config + limits
}

async fn started(dir: tempfile::TempDir, config: &str) -> TestSatellite {
    let sat = TestSatellite::start_in(dir, config).await;
    sat.wait_ready().await;
    for user in ["alice", "bob"] {
        wait_instance_online(&sat, format!("demo-acme-{user}-d").as_str()).await;
    }
    sat
}

async fn instance(sat: &TestSatellite, user: &str) -> Caller {
    Caller::connect(sat, &format!("/i/{user}-demo/mcp?token={}", instance_token(user)), None).await
}

/// A refusal's `data`, when `reply` is one, checked readable: the rule, what it allows, when to retry.
fn refusal(reply: &Value) -> Option<&Value> {
    (reply["error"]["code"] == RATE_LIMITED).then(|| {
        let data = &reply["error"]["data"];
        assert!(data["retryAfterSeconds"].as_u64().is_some_and(|s| s >= 1), "{reply}");
        assert!(data["rule"].is_string() && data["limit"].is_string(), "{reply}");
        assert!(reply["error"]["message"].as_str().is_some_and(|m| m.contains("retry in")), "{reply}");
        data
    })
}

/// 1,000 calls against 10 a second (bursts of 10), 20 at a time, half on each router: no more get through than the
/// bucket holds plus what it refilled while they ran, at least the burst does, every refusal says when to retry,
/// and a tool the rule does not name is not counted.
#[tokio::test]
async fn a_burst_against_a_rate_gets_through_only_what_the_rate_allows() {
    let limits = "[[limits]]\nname = \"echo-rate\"\nuser = \"alice\"\ntools = [\"demo:echo\"]\n\
                  rate = { calls = 10, per_seconds = 1, burst = 10 }\n";
    let sat = started(tempfile::tempdir().expect("dir"), &config(limits)).await;
    let (direct, mcp) = (instance(&sat, "alice").await, Caller::connect(&sat, "/mcp", Some(&token("alice"))).await);
    let started_at = Instant::now();
    let replies: Vec<Value> = futures::stream::iter(0..1000)
        .map(|i| {
            let (direct, mcp) = (&direct, &mcp);
            async move {
                if i % 2 == 0 {
                    direct.call("tools/call", json!({"name": "echo", "arguments": {"text": "x"}})).await.1
                } else {
                    mcp.execute("demo:echo", json!({"text": "x"})).await
                }
            }
        })
        .buffer_unordered(20)
        .collect()
        .await;
    let took = started_at.elapsed().as_secs_f64();
    let refused = replies.iter().filter(|r| refusal(r).is_some()).count();
    let passed = replies.iter().filter(|r| r["result"].is_object()).count();
    assert_eq!(passed + refused, 1000, "every call either ran or was refused by the rule");
    let bound = 10 + (10.0 * took).ceil() as usize;
    assert!((10..=bound).contains(&passed), "{passed} got through in {took:.2}s, the rule allows 10 to {bound}");
    assert!(refusal(replies.iter().find(|r| refusal(r).is_some()).expect("a refusal"))
        .is_some_and(|d| d["rule"] == "echo-rate"));
    // Operators see it: the refusals counted under the rule's name, and one resource.limit.exceeded (at most one a
    // minute per instance) that says whose calls and which cap.
    let metrics =
        reqwest::get(format!("{}/metrics", sat.base_url())).await.expect("scrape").text().await.expect("text");
    let counted = format!("satellite_limit_refusals_total{{rule=\"echo-rate\"}} {refused}");
    assert!(metrics.contains(&counted), "{counted} in /metrics");
    let store = sat.satellite.store();
    let events = wait_until(DEADLINE, "a resource.limit.exceeded", || async {
        let events = store.outbox().events(Some("resource.limit.exceeded"), 0, 100).await.ok()?;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events.len(), 1, "one a minute: {events:?}");
    let data = &events[0].data;
    assert_eq!(
        (data["resource_type"].as_str(), data["user_id"].as_str()),
        (Some("tool_calls"), Some("alice")),
        "{data}"
    );
    assert!(data["message"].as_str().is_some_and(|m| m.contains("echo-rate")), "{data}");
    // Another tool, and another user's echo, are not counted under it.
    let add = direct.call("tools/call", json!({"name": "add", "arguments": {"a": 1, "b": 2}})).await.1;
    assert!(add["result"].is_object(), "{add}");
    let bob =
        instance(&sat, "bob").await.call("tools/call", json!({"name": "echo", "arguments": {"text": "x"}})).await.1;
    assert!(bob["result"].is_object(), "{bob}");
    assert!(sat.satellite.shutdown().await);
}

/// A quota of 3 calls a day, each user's own: calls on both routers count against it; the fourth is refused until
/// the next day, also after a restart; Bob's own quota is untouched. A team-wide quota is one for everyone.
#[tokio::test]
async fn a_quota_counts_calls_on_both_routers_and_survives_a_restart() {
    let limits = "[[limits]]\nname = \"add-daily\"\ntools = [\"demo:add\"]\nquota = { calls = 3, per = \"day\" }\n\
                  [[limits]]\nname = \"team-echo\"\nscope = \"team\"\ntools = [\"demo:echo\"]\nquota = { calls = 2, per = \"month\" }\n";
    let config = config(limits);
    let sat = started(tempfile::tempdir().expect("dir"), &config).await;
    let add = json!({"a": 1, "b": 2});
    let mcp = Caller::connect(&sat, "/mcp", Some(&token("alice"))).await;
    let direct = instance(&sat, "alice").await;
    for reply in [
        mcp.execute("demo:add", add.clone()).await,
        direct.call("tools/call", json!({"name": "add", "arguments": add})).await.1,
        mcp.execute("demo:add", add.clone()).await,
    ] {
        assert!(reply["result"].is_object(), "{reply}");
    }
    let fourth = direct.call("tools/call", json!({"name": "add", "arguments": add})).await.1;
    let data = refusal(&fourth).unwrap_or_else(|| panic!("refused: {fourth}"));
    assert_eq!(data["rule"], "add-daily");
    assert!(data["retryAfterSeconds"].as_u64().is_some_and(|s| s <= 86_400), "{fourth}");
    // The team's echo quota: alice takes one, bob the other, then neither gets one.
    let echo = |caller: &Caller| {
        let caller = Caller {
            http: caller.http.clone(),
            url: caller.url.clone(),
            token: caller.token.clone(),
            session: caller.session.clone(),
        };
        async move { caller.call("tools/call", json!({"name": "echo", "arguments": {"text": "x"}})).await.1 }
    };
    let bob = instance(&sat, "bob").await;
    assert!(echo(&direct).await["result"].is_object() && echo(&bob).await["result"].is_object());
    assert!(refusal(&echo(&direct).await).is_some() && refusal(&echo(&bob).await).is_some());

    let TestSatellite { satellite, dir, .. } = sat;
    assert!(satellite.shutdown().await);
    let sat = started(dir, &config).await;
    let again = mcp_after(&sat).await.execute("demo:add", json!({"a": 1, "b": 2})).await;
    assert_eq!(refusal(&again).map(|d| d["rule"].clone()), Some(json!("add-daily")), "after a restart: {again}");
    let bobs =
        instance(&sat, "bob").await.call("tools/call", json!({"name": "add", "arguments": {"a": 1, "b": 2}})).await.1;
    assert!(bobs["result"].is_object(), "bob's own quota: {bobs}");
    assert!(sat.satellite.shutdown().await);
}

async fn mcp_after(sat: &TestSatellite) -> Caller {
    Caller::connect(sat, "/mcp", Some(&token("alice"))).await
}

#[tokio::test]
async fn a_rule_that_cannot_be_counted_is_refused_at_load() {
    let base = config("");
    for (rule, says) in [
        ("[[limits]]\nuser = \"mallory\"\nrate = { calls = 1, per_seconds = 1 }\n", "no user"),
        ("[[limits]]\nrate = { calls = 0, per_seconds = 1 }\n", "at least 1"),
        ("[[limits]]\nquota = { calls = 5, per = \"week\" }\n", "not a period"),
        ("[[limits]]\nteam = \"acme\"\n", "limits nothing"),
        ("[[limits]]\nscope = \"org\"\nrate = { calls = 1, per_seconds = 1 }\n", "not a scope"),
        ("[[limits]]\ntools = [\":x\"]\nrate = { calls = 1, per_seconds = 1 }\n", "not valid"),
    ] {
        let (passed, said) = check_config(&format!("{base}{rule}"));
        assert!(!passed && said.contains("limits[0]") && said.contains(says), "{rule}: {said}");
    }
}

/// A quota large enough to be taken from the database three calls at a time (a hundredth of it): 301 calls, ten at
/// a time, half on each router, get exactly 300 through, never more.
#[tokio::test]
async fn a_quota_taken_ahead_is_never_exceeded_under_concurrent_calls() {
    let limits = "[[limits]]\nname = \"meta-daily\"\nuser = \"alice\"\ntools = [\"demo:with_meta\"]\n\
                  quota = { calls = 300, per = \"day\" }\n";
    let sat = started(tempfile::tempdir().expect("dir"), &config(limits)).await;
    let (direct, mcp) = (instance(&sat, "alice").await, Caller::connect(&sat, "/mcp", Some(&token("alice"))).await);
    let replies: Vec<Value> = futures::stream::iter(0..301)
        .map(|i| {
            let (direct, mcp) = (&direct, &mcp);
            async move {
                if i % 2 == 0 {
                    direct.call("tools/call", json!({"name": "with_meta", "arguments": {}})).await.1
                } else {
                    mcp.execute("demo:with_meta", json!({})).await
                }
            }
        })
        .buffer_unordered(10)
        .collect()
        .await;
    let refused = replies.iter().filter(|r| refusal(r).is_some()).count();
    let passed = replies.iter().filter(|r| r["result"].is_object()).count();
    assert_eq!((passed, refused), (300, 1), "exactly the quota");
    assert!(sat.satellite.shutdown().await);
}
