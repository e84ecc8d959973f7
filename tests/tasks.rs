//! Issue 75, item 4: the Tasks extension (`io.modelcontextprotocol/tasks`) through both routers. The server is
//! `tests/conformance/tasks-server.mjs`, one remote server every user's instance reaches alike (it knows no users:
//! any task id it made is good for anyone who names it). Through the satellite a task is reached only by the user
//! whose instance made it: the id a client gets is sealed to that instance, and neither another user's id nor the
//! server's own raw id gets through.

use std::time::Duration;

use reqwest::StatusCode;
use satellite::config::sha256_hex;
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "tasks-alice-token-0123456789abcdef";
const BOB: &str = "tasks-bob-token-0123456789abcdef";
const EXTENSION: &str = "io.modelcontextprotocol/tasks";

fn instance_token(user: &str) -> String {
    format!("ds_inst_tasks_{user}_0123456789abcdef0123456789abcdef")
}

/// Alice and Bob, one team each, each with an instance of the one tasks server.
fn config(url: &url::Url) -> String {
    let mut config = String::new();
    for (user, token) in [("alice", ALICE), ("bob", BOB)] {
        config += &format!(
            "[[teams]]\nid = \"t-{user}\"\n[[users]]\nid = \"{user}\"\nteams = [\"t-{user}\"]\ntoken_sha256 = [\"{}\"]\n\
             [[installations]]\nid = \"i-{user}\"\nteam = \"t-{user}\"\nserver = \"tasks\"\n\
             [installations.users.{user}]\ninstance_path = \"{user}-tasks\"\ninstance_token_sha256 = \"{}\"\n",
            sha256_hex(token),
            sha256_hex(&instance_token(user)),
        );
    }
    config + &format!("[[servers]]\nslug = \"tasks\"\ntransport = \"http\"\nurl = \"{url}\"\n")
}

/// A 2026-07-28 request declaring the extension (or not), posted with the headers a conforming client sends.
async fn post(caller: &Caller, method: &str, params: Value, declared: bool) -> (StatusCode, Value) {
    let extensions = if declared { json!({EXTENSION: {}}) } else { json!({}) };
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let (status, _, reply) = caller.post_modern(&body).await;
    (status, reply)
}

/// Poll `tasks/get` until the task is completed; its last answer.
async fn completed(caller: &Caller, id: &str) -> Value {
    wait_until(DEADLINE, "the task completes", || async move {
        let (_, got) = post(caller, "tasks/get", json!({"taskId": id}), true).await;
        (got["result"]["status"] == "completed").then_some(got)
    })
    .await
}

fn unknown_task(reply: &Value) -> bool {
    reply["error"]["code"] == -32602 && reply["error"]["message"].as_str().is_some_and(|m| m.contains("Unknown taskId"))
}

#[tokio::test]
async fn a_task_is_reached_only_through_the_instance_that_made_it() {
    let server = HttpServer::node_script("tests/conformance/tasks-server.mjs").await;
    let sat = TestSatellite::start(&config(&server.url("/mcp"))).await;
    sat.wait_ready().await;
    for user in ["alice", "bob"] {
        let id = satellite::model::ProcessId::from(format!("tasks-t-{user}-{user}-i-{user}").as_str());
        wait_until(DEADLINE, user, || {
            let online = sat.satellite.manager().get(&id).is_some_and(|i| i.client().is_some());
            async move { online.then_some(()) }
        })
        .await;
    }
    let alice = Caller::new(&sat, &format!("/i/alice-tasks/mcp?token={}", instance_token("alice")), None);
    let bob = Caller::new(&sat, &format!("/i/bob-tasks/mcp?token={}", instance_token("bob")), None);

    // The server makes a task of the call; the client's id is the satellite's, not the server's.
    let call = json!({"name": "slow_compute", "arguments": {"seconds": 0, "label": "alice's"}});
    let (status, created) = post(&alice, "tools/call", call.clone(), true).await;
    assert_eq!((status, created["result"]["resultType"].clone()), (StatusCode::OK, json!("task")), "{created}");
    let id = created["result"]["taskId"].as_str().expect("a task id").to_owned();
    let (_, server_id) = satellite::mcp::task_ids::open(&id).expect("sealed by the satellite");
    assert_ne!(id, server_id);

    // Alice follows it to its end, under the id she was given.
    let done = completed(&alice, &id).await;
    assert_eq!(done["result"]["taskId"], id.as_str(), "{done}");
    assert!(done["result"]["result"]["content"].is_array(), "{done}");

    // Bob, on his own instance of the same server, reaches it neither by her id nor by the server's own.
    for named in [id.as_str(), server_id.as_str()] {
        for method in ["tasks/get", "tasks/cancel"] {
            let (_, refused) = post(&bob, method, json!({"taskId": named}), true).await;
            assert!(unknown_task(&refused), "bob's {method} of {named}: {refused}");
        }
    }
    // A client that did not declare the extension is refused as the server refuses it, before the id is judged.
    let (status, undeclared) = post(&alice, "tasks/get", json!({"taskId": id}), false).await;
    assert_eq!((status, undeclared["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!(-32021)), "{undeclared}");

    // /mcp offers the extension to a client that declares it (and only then), since it passes tasks on.
    let alice_mcp = Caller::new(&sat, "/mcp", Some(ALICE));
    for declared in [true, false] {
        let (_, discovered) = post(&alice_mcp, "server/discover", json!({}), declared).await;
        let offered = discovered["result"]["capabilities"]["extensions"].get(EXTENSION).is_some();
        assert_eq!(offered, declared, "{discovered}");
    }
    // execute_mcp_tool starts a task on the caller's instance; tasks/get and tasks/cancel follow it there.
    let execute = json!({"name": "execute_mcp_tool", "arguments": {"tool_path": "tasks:slow_compute",
        "arguments": {"seconds": 30, "label": "long"}}});
    let (_, started) = post(&alice_mcp, "tools/call", execute, true).await;
    assert_eq!(started["result"]["resultType"], "task", "{started}");
    let long = started["result"]["taskId"].as_str().expect("a task id").to_owned();
    let (_, got) = post(&alice_mcp, "tasks/get", json!({"taskId": long}), true).await;
    assert_eq!(
        (got["result"]["taskId"].as_str(), got["result"]["status"].as_str()),
        (Some(long.as_str()), Some("working"))
    );
    let bob_mcp = Caller::new(&sat, "/mcp", Some(BOB));
    let (_, refused) = post(&bob_mcp, "tasks/cancel", json!({"taskId": long}), true).await;
    assert!(unknown_task(&refused), "{refused}");
    // Alice's own task id on her /i/ endpoint is hers too: the instance is the same.
    let (_, cancelled) = post(&alice, "tasks/cancel", json!({"taskId": long}), true).await;
    assert_eq!(cancelled["result"]["resultType"], "complete", "{cancelled}");
    let (_, after) = post(&alice_mcp, "tasks/get", json!({"taskId": long}), true).await;
    assert_eq!(after["result"]["status"], "cancelled", "{after}");
    assert!(sat.satellite.shutdown().await);
}

/// Status notifications of a task reach a `subscriptions/listen` that asked for them by the id the client was
/// given, and carry that id; an id of another user's task in the same filter is dropped, so nothing of it is heard.
#[tokio::test]
async fn task_status_is_heard_by_the_id_the_client_was_given() {
    use futures::StreamExt;
    let server = HttpServer::node_script("tests/conformance/tasks-server.mjs").await;
    let sat = TestSatellite::start(&config(&server.url("/mcp"))).await;
    sat.wait_ready().await;
    let path = |user: &str| format!("/i/{user}-tasks/mcp?token={}", instance_token(user));
    let (alice, bob) = (Caller::new(&sat, &path("alice"), None), Caller::new(&sat, &path("bob"), None));
    let start = |caller: &Caller, label: &str| {
        let call = json!({"name": "slow_compute", "arguments": {"seconds": 2, "label": label}});
        let caller = Caller::for_url(caller.url.clone(), None);
        async move {
            let (_, created) = wait_until(DEADLINE, "a task", || {
                let (caller, call) = (&caller, call.clone());
                async move { Some(post(caller, "tools/call", call, true).await).filter(|(s, _)| s.is_success()) }
            })
            .await;
            created["result"]["taskId"].as_str().expect("a task id").to_owned()
        }
    };
    let (mine, theirs) = (start(&alice, "alice's").await, start(&bob, "bob's").await);
    let listen = json!({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}},
        "notifications": {"tasksStatus": [mine, theirs]}}});
    let mut stream = alice.send_modern(&listen).await.bytes_stream();
    let mut heard = String::new();
    let done = |heard: &str| heard.contains("\"completed\"");
    tokio::time::timeout(DEADLINE, async {
        while let Some(Ok(chunk)) = stream.next().await {
            heard.push_str(&String::from_utf8_lossy(&chunk));
            if done(&heard) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no completion of alice's task on the listen: {heard}"));
    assert!(heard.contains("notifications/tasks/status") && heard.contains(&mine), "{heard}");
    let (_, server_id) = satellite::mcp::task_ids::open(&mine).expect("sealed");
    assert!(!heard.contains(&format!("\"{server_id}\"")), "the server's own id leaked: {heard}");
    let (_, bobs_id) = satellite::mcp::task_ids::open(&theirs).expect("sealed");
    assert!(!heard.contains(&theirs) && !heard.contains(&bobs_id), "bob's task was heard: {heard}");
    drop(stream);
    assert!(sat.satellite.shutdown().await);
}
