//! The stdio upstream client against real servers: the demo server in each
//! protocol era, npm servers, and servers that misbehave on purpose.

use std::time::Duration;

use satellite::discovery::{self, DiscoveryError};
use satellite::mcp::client::{ClientOptions, Era, McpClient};
use satellite::mcp::transport::{ExitInfo, StdioTransport, Transport, UpstreamError};
use serde_json::{json, Value};

use crate::common::*;

const CALL: Duration = Duration::from_secs(10);

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

async fn misbehaving(mode: &str, options: ClientOptions) -> Result<McpClient, UpstreamError> {
    let script = fixture("misbehaving_server.py");
    let launch = stdio_launch("python3", &[script.to_str().unwrap(), mode]);
    let transport = Transport::Stdio(StdioTransport::spawn(launch).expect("spawn"));
    McpClient::connect(transport, &options).await
}

#[tokio::test]
async fn demo_server_negotiates_each_protocol_era() {
    for (protocol, stateless) in [("legacy", false), ("modern", true), ("both", true)] {
        let client = connect_demo_stdio(protocol).await;
        match client.era() {
            Era::Stateless { version } => assert!(stateless, "{protocol}: unexpected stateless {version}"),
            Era::Handshake { version } => {
                assert!(!stateless, "{protocol}: unexpected handshake");
                assert_eq!(version, "2025-06-18");
            }
        }
        assert_eq!(client.server_info()["name"], "satellite-demo", "{protocol}");
        let catalog = discovery::discover(&client, CALL).await.expect("discover");
        let names: Vec<&str> = catalog.tools.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["echo", "add", "slow", "fail", "exit_process", "with_meta", "show_ui"], "{protocol}");
        assert_eq!(catalog.resources.len(), 2, "{protocol}");
        assert_eq!(catalog.templates[0].uri_template, "demo://items/{id}");
        let show_ui = catalog.tools.iter().find(|t| t.name() == "show_ui").unwrap();
        assert_eq!(show_ui.meta().as_ref().unwrap()["ui"]["resourceUri"], "ui://demo/app.html");

        let echoed = client
            .request("tools/call", Some(json!({"name": "echo", "arguments": {"text": "hi"}})), CALL)
            .await
            .unwrap();
        assert_eq!(text(&echoed), "hi");
        let failed = client.request("tools/call", Some(json!({"name": "fail"})), CALL).await.unwrap();
        assert_eq!(failed["isError"], true);
        let meta = client.request("tools/call", Some(json!({"name": "with_meta"})), CALL).await.unwrap();
        assert_eq!(meta["_meta"]["demo/trace"]["id"], "trace-1");
        let ui = client.request("resources/read", Some(json!({"uri": "ui://demo/app.html"})), CALL).await.unwrap();
        assert!(ui["contents"][0]["text"].as_str().unwrap().contains("Demo app"));
        let bad = client.request("tools/call", Some(json!({"name": "nope"})), CALL).await.unwrap_err();
        assert!(matches!(bad, UpstreamError::Rpc(ref e) if e.code == -32602), "{bad}");
        client.close().await;
    }
}

#[tokio::test]
async fn discovery_follows_pagination() {
    let exe = satellite_exe();
    let client = connect_stdio(stdio_launch(exe.to_string_lossy(), &["demo-server", "--page-size", "2"])).await;
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert_eq!(catalog.tools.len(), 7);
    client.close().await;
}

#[tokio::test]
async fn hundred_concurrent_calls_get_their_own_answers() {
    let client = connect_demo_stdio("legacy").await;
    let calls = (0..100).map(|i| {
        let client = &client;
        async move {
            // Every tenth call also waits, so answers come back out of order.
            let result = if i % 10 == 0 {
                client.request("tools/call", Some(json!({"name": "slow", "arguments": {"ms": 50}})), CALL).await
            } else {
                client
                    .request(
                        "tools/call",
                        Some(json!({"name": "echo", "arguments": {"text": format!("call-{i}")}})),
                        CALL,
                    )
                    .await
            };
            (i, result.expect("call answered"))
        }
    });
    let results = futures::future::join_all(calls).await;
    for (i, result) in results {
        let expected = if i % 10 == 0 { "slept 50 ms".to_owned() } else { format!("call-{i}") };
        assert_eq!(text(&result), expected);
    }
    client.close().await;
}

/// What is queued for stdin goes out in batches of up to 32 KiB: messages larger than a batch, and bursts that
/// cross its limit, still reach the server whole, once and in order, each answered to its own caller.
#[tokio::test]
async fn bursts_larger_than_one_write_reach_the_server_whole() {
    let client = connect_demo_stdio("both").await;
    let calls = (0..60).map(|i| {
        let client = &client;
        // Every seventh message is 100 KB (three batches' worth), the rest a few hundred bytes to 20 KB.
        let size = if i % 7 == 0 { 100_000 } else { 300 + (i * 331) % 20_000 };
        let payload: String = format!("call-{i}-").chars().cycle().take(size).collect();
        async move {
            let arguments = json!({"text": payload});
            let result =
                client.request("tools/call", Some(json!({"name": "echo", "arguments": arguments})), CALL).await;
            (payload, result.expect("call answered"))
        }
    });
    for (payload, result) in futures::future::join_all(calls).await {
        assert_eq!(text(&result).len(), payload.len());
        assert!(text(&result) == payload, "an answer that is not its call's echo");
    }
    client.close().await;
}

/// Calls made one at a time do not wake the runtime's other worker thread. The stdin writer lets the other ready
/// tasks queue their calls first (a yield) only when calls come together: a yielding task makes the scheduler
/// wake a parked worker to share its queue, and when every call yielded, a lone call's worker woke the other one
/// for nothing, a futex wake and a context switch per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_one_at_a_time_do_not_wake_the_other_worker() {
    const CALLS: u64 = 300;
    let client = std::sync::Arc::new(connect_demo_stdio("legacy").await);
    let echo = |text: String| Some(json!({"name": "echo", "arguments": {"text": text}}));
    let metrics = tokio::runtime::Handle::current().metrics();
    let parks = move || (0..metrics.num_workers()).map(|worker| metrics.worker_park_count(worker)).sum::<u64>();
    // On a worker, as a connection's task is: each call wakes the writer on the same worker.
    let caller = client.clone();
    let parked = tokio::spawn(async move {
        caller.request("tools/call", echo("warm".into()), CALL).await.expect("answered");
        let before = parks();
        for i in 0..CALLS {
            let result = caller.request("tools/call", echo(format!("call-{i}")), CALL).await.expect("answered");
            assert_eq!(text(&result), format!("call-{i}"));
        }
        parks() - before
    })
    .await
    .expect("the calls ran");
    // Each call parks the worker that waits for the server's answer once; a second worker woken and parked again
    // on every call made it two per call.
    assert!(parked < CALLS * 3 / 2, "{parked} parks for {CALLS} calls made one at a time");
    client.close().await;
}

/// A server that stops reading its stdin (hung, or busy forever) while large requests are queued for it: the
/// satellite's write to the full pipe must not keep it from stopping that server.
#[tokio::test]
async fn a_server_that_never_reads_stdin_can_still_be_stopped() {
    let launch = stdio_launch("python3", &["-c", "import time; time.sleep(600)"]);
    let transport = StdioTransport::spawn(launch).expect("spawn");
    // Three 100 KB requests: more than the pipe holds, so the write to stdin blocks.
    let big = "x".repeat(100_000);
    let calls = (0..3).map(|_| {
        transport.request("tools/call", Some(json!({"name": "echo", "arguments": {"text": big}})), CALL, None)
    });
    let calls = futures::future::join_all(calls);
    let outcome = tokio::time::timeout(Duration::from_millis(300), calls).await;
    assert!(outcome.is_err(), "nothing can answer: the server never reads");
    tokio::time::timeout(Duration::from_secs(10), transport.close())
        .await
        .expect("closing returns while a write to the server is stuck");
    assert!(!transport.is_alive());
}

/// A plain synchronous server answers one request at a time: it writes its whole answer before it reads on. When
/// it writes a long answer while a long request is being written to it, each side's pipe fills: the satellite must
/// go on reading the answer while its write waits, or the server waits on its stdout and the satellite on the
/// server's stdin, for ever, and every call after them times out.
#[tokio::test]
async fn a_long_answer_and_a_long_request_crossing_do_not_wait_on_each_other() {
    let server = r#"
import json, sys, time
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    params = message.get("params") or {}
    if params.get("name") == "big":
        time.sleep(0.3)  # the long request arrives meanwhile and fills stdin's pipe
        text = "y" * 1_000_000
    else:
        text = str(len(line))
    answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": text}]}}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"#;
    let launch = stdio_launch("python3", &["-c", server]);
    let transport = StdioTransport::spawn(launch).expect("spawn");
    let big = transport.request("tools/call", Some(json!({"name": "big"})), CALL, None);
    let long = "x".repeat(200_000);
    let echo = async {
        wait_until(Duration::from_secs(10), "the long answer's call in flight", || {
            let waiting = transport.in_flight() == 1;
            async move { waiting.then_some(()) }
        })
        .await;
        transport.request("tools/call", Some(json!({"name": "echo", "arguments": {"text": long}})), CALL, None).await
    };
    let (big, echo) = tokio::join!(big, echo);
    let big = big.expect("the long answer arrives").into_value_or_null();
    assert_eq!(text(&big).len(), 1_000_000);
    let echo = echo.expect("the long request is answered").into_value_or_null();
    assert!(text(&echo).parse::<usize>().is_ok_and(|n| n > 200_000), "{echo}");
    transport.close().await;
}

/// What a server writes that the satellite cannot take as a message does not stop it reading the server. Before,
/// tokio-util's line reader ended the stream at the first such line, and the satellite stopped reading stdout (or
/// stderr) for good: every later call waited out its timeout, and a server writing on hung on its full pipe.
/// - An answer over the 16 MiB a message may be fails its own call at once, saying why, not after the timeout.
/// - A line that is not UTF-8 is skipped like any line that is not JSON.
/// - A stderr line over its bound, followed by more stderr than a pipe holds, does not block the server.
/// - A request of the server's over the bound is refused with -32600, not left for the server to wait on.
#[tokio::test]
async fn what_cannot_be_read_fails_its_call_alone_and_reading_goes_on() {
    let server = r#"
import json, sys
out = sys.stdout.buffer
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    name = (message.get("params") or {}).get("name")
    text = "ok"
    if name == "huge":
        # The result first and the id last, as a JavaScript server writes it.
        text = "y" * (17 * 1024 * 1024)
        out.write(b'{"result":{"content":[{"type":"text","text":"' + text.encode() + b'"}]},"jsonrpc":"2.0","id":'
                  + str(message["id"]).encode() + b'}\n')
        out.flush()
        continue
    if name == "huge-ask":
        # A request of the server's over the bound: it must still get an answer.
        out.write(b'{"jsonrpc":"2.0","id":77,"method":"sampling/createMessage","params":{"text":"'
                  + b"y" * (17 * 1024 * 1024) + b'"}}\n')
        out.flush()
        while True:
            reply = json.loads(sys.stdin.readline())
            if reply.get("id") == 77:
                text = str(reply["error"]["code"])
                break
    if name == "latin1":
        out.write(b'caf\xe9 is not utf-8\n')
    if name == "stderr":
        sys.stderr.write("e" * 100_000 + "\n")
        for _ in range(300):
            sys.stderr.write("x" * 1000 + "\n")
        sys.stderr.flush()
    answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": text}]}}
    out.write(json.dumps(answer).encode() + b"\n")
    out.flush()
"#;
    let launch = stdio_launch("python3", &["-c", server]);
    let transport = StdioTransport::spawn(launch).expect("spawn");
    let patient = Duration::from_secs(120);
    let call = |name: &'static str| transport.request("tools/call", Some(json!({"name": name})), patient, None);
    let err = call("huge").await.expect_err("an answer over 16 MiB is not taken");
    assert!(matches!(err, UpstreamError::Protocol(_)), "fails at once with the reason, not a timeout: {err}");
    assert!(err.to_string().contains("17825") && err.to_string().contains("16777216"), "{err}");
    for name in ["after", "latin1", "stderr", "stderr", "huge-ask", "last"] {
        let answer = tokio::time::timeout(Duration::from_secs(30), call(name))
            .await
            .unwrap_or_else(|_| panic!("{name}: the server is still read"))
            .unwrap_or_else(|err| panic!("{name}: {err}"))
            .into_value_or_null();
        // The server's over-long request was refused (-32600) rather than left unanswered.
        let expected = if name == "huge-ask" { "-32600" } else { "ok" };
        assert_eq!(text(&answer), expected, "{name}");
    }
    transport.close().await;
}

/// A request made while a dead child's last output is still being read (here a grandchild of its, in a session
/// of its own, writes on for a while) fails with how the child ended, as every other waiter does. Before, it was
/// refused as "not running": the stdin queue had gone with the child's stdin.
#[tokio::test]
async fn a_request_made_while_a_dead_childs_output_is_drained_gets_its_exit() {
    let server = r#"
import json, os, sys, time
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if (message.get("params") or {}).get("name") == "die":
        ready, told = os.pipe()
        if os.fork() == 0:
            os.setsid()  # out of the child's process group, which goes with the child
            os.write(told, b"x")
            for i in range(150):
                note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "after %d" % i}}
                sys.stdout.write(json.dumps(note) + "\n")
                sys.stdout.flush()
                time.sleep(0.01)
            os._exit(0)
        os.read(ready, 1)
        os._exit(3)
    answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": "ok"}]}}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"#;
    let launch = stdio_launch("python3", &["-c", server]);
    let transport = StdioTransport::spawn(launch).expect("spawn");
    let mut heard = transport.subscribe();
    let die = transport.request("tools/call", Some(json!({"name": "die"})), CALL, None);
    let during = async {
        // The child exits at once; 0.3 s of the grandchild's lines later, the satellite is draining what is left.
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(message) = heard.recv().await {
                if message.to_string().contains("after 30\"") {
                    return;
                }
            }
            panic!("the announcements ended before the grandchild's lines");
        })
        .await
        .expect("the grandchild's lines");
        transport.request("tools/call", Some(json!({"name": "echo"})), CALL, None).await
    };
    let (die, during) = tokio::join!(die, during);
    for err in [die.expect_err("the child died"), during.expect_err("the child is dead")] {
        assert!(matches!(err, UpstreamError::Exited { exit: ExitInfo::Exited { code: Some(3), .. }, .. }), "{err}");
    }
    transport.close().await;
}

#[tokio::test]
async fn a_dying_server_fails_every_waiter_at_once() {
    let client = connect_demo_stdio("both").await;
    let slow = client.request(
        "tools/call",
        Some(json!({"name": "slow", "arguments": {"ms": 20000}})),
        Duration::from_secs(30),
    );
    let Transport::Stdio(stdio) = client.transport() else { unreachable!() };
    let exit = async {
        // Exit only once the slow call is waiting on the child.
        wait_until(Duration::from_secs(10), "the slow call in flight", || {
            let waiting = stdio.in_flight() == 1;
            async move { waiting.then_some(()) }
        })
        .await;
        client.request("tools/call", Some(json!({"name": "exit_process", "arguments": {"code": 7}})), CALL).await
    };
    let started = std::time::Instant::now();
    let (slow, exit) = tokio::join!(slow, exit);
    assert!(started.elapsed() < Duration::from_secs(10), "waiters were not failed promptly");
    for err in [slow.unwrap_err(), exit.unwrap_err()] {
        assert!(matches!(err, UpstreamError::Exited { exit: ExitInfo::Exited { code: Some(7), .. }, .. }), "{err}");
        assert!(err.to_string().contains("exit code 7"), "{err}");
    }
    assert!(!stdio.is_alive());
    let after = client.request("tools/list", None, CALL).await.unwrap_err();
    assert!(matches!(after, UpstreamError::Exited { .. }), "{after}");
    assert!(after.to_string().contains("not running"), "{after}");
}

/// A server that closes its stdout and goes on running can never answer again: its calls fail within a few
/// seconds, not at their timeout, and it is stopped, as a crash (the supervisor restarts it). Before, every call
/// waited out its timeout and the instance stayed online with its process alive.
#[tokio::test]
async fn a_server_that_closes_its_stdout_is_stopped_and_its_calls_fail() {
    let client = misbehaving("garbage", fast_options()).await.expect("connects");
    let err = client
        .request("tools/call", Some(json!({"name": "hangup", "arguments": {}})), Duration::from_secs(60))
        .await
        .expect_err("no answer can come");
    // The process ended it, not the call's timeout (which would be `UpstreamError::Timeout`).
    assert!(matches!(err, UpstreamError::Exited { exit: ExitInfo::Exited { .. }, .. }), "{err}");
    let Transport::Stdio(stdio) = client.transport() else { unreachable!() };
    assert!(!stdio.is_alive(), "the process is stopped");
}

#[tokio::test]
async fn garbage_on_stdout_is_skipped() {
    let client = misbehaving("garbage", fast_options()).await.expect("connects despite garbage");
    assert!(matches!(client.era(), Era::Handshake { .. }));
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert_eq!(catalog.tools[0].name(), "ok");
    let Transport::Stdio(stdio) = client.transport() else { unreachable!() };
    assert!(stdio.stderr_tail().iter().any(|l| l.contains("tools/list")), "stderr kept: {:?}", stdio.stderr_tail());
    client.close().await;
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let options = ClientOptions {
        handshake_timeout: Duration::from_secs(2),
        probe_timeout: Duration::from_millis(500),
        ..fast_options()
    };
    let err = misbehaving("silent", options).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Timeout { ref method, .. } if method == "initialize"), "{err}");
}

#[tokio::test]
async fn a_server_exiting_during_the_handshake_is_reported() {
    let err = misbehaving("exit-on-initialize", fast_options()).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Exited { exit: ExitInfo::Exited { code: Some(2), .. }, .. }), "{err}");
    assert!(err.to_string().contains("exit code 2"), "{err}");
}

/// The server answers none of its listings until all three have arrived: a client that lists tools, then
/// resources, then templates, one round trip each, times out on the first.
#[tokio::test]
async fn the_listings_of_a_discovery_go_out_together() {
    let client = misbehaving("listings-together", ClientOptions::default()).await.expect("connect");
    let catalog = discovery::discover(&client, Duration::from_secs(5)).await.expect("discover");
    assert_eq!(catalog.tools.iter().map(|t| t.name()).collect::<Vec<_>>(), ["ok"]);
    assert_eq!(catalog.resources.len(), 1, "{:?}", catalog.resources);
    assert_eq!(catalog.templates.len(), 1, "{:?}", catalog.templates);
    assert!(catalog.fallbacks.is_empty(), "{:?}", catalog.fallbacks);
}

/// A server that refuses its tool listing fails the discovery at once, though it never answers the resource
/// listings sent with it: they are optional, and not waited for (each would wait its whole timeout).
#[tokio::test]
async fn a_refused_tool_listing_fails_the_discovery_without_waiting_for_the_other_listings() {
    let client = misbehaving("tools-fail", ClientOptions::default()).await.expect("connect");
    let discovery = discovery::discover(&client, Duration::from_secs(600));
    let outcome = tokio::time::timeout(Duration::from_secs(30), discovery).await;
    let err = outcome.expect("the discovery ends with its tool listing").expect_err("no tools, no catalog");
    assert!(err.to_string().contains("tools unavailable"), "{err}");
}

#[tokio::test]
async fn endless_pagination_is_cut_off() {
    let client = misbehaving("endless-pages", fast_options()).await.unwrap();
    let err = discovery::discover(&client, CALL).await.unwrap_err();
    assert!(matches!(err, DiscoveryError::TooManyPages { method: "tools/list" }), "{err}");
    client.close().await;
}

#[tokio::test]
async fn requests_from_the_child_are_answered() {
    let client = misbehaving("asks-client", fast_options()).await.unwrap();
    let result = client.request("tools/call", Some(json!({"name": "ask"})), CALL).await.unwrap();
    let answers: Value = serde_json::from_str(text(&result)).unwrap();
    assert_eq!(answers["ping"], json!({}));
    assert_eq!(answers["roots/list"], json!({"roots": []}));
    assert_eq!(answers["sampling/createMessage"]["code"], -32601);
    client.close().await;
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let client = connect_stdio(stdio_launch(node_bin("mcp-server-everything").to_string_lossy(), &["stdio"])).await;
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert!(
        catalog.tools.iter().any(|t| t.name() == "echo"),
        "tools: {:?}",
        catalog.tools.iter().map(|t| t.name()).collect::<Vec<_>>()
    );
    assert!(!catalog.resources.is_empty());
    let echoed = client
        .request("tools/call", Some(json!({"name": "echo", "arguments": {"message": "from the satellite"}})), CALL)
        .await
        .unwrap();
    assert!(text(&echoed).contains("from the satellite"), "{echoed}");
    client.close().await;
}

#[tokio::test]
async fn server_memory_over_stdio() {
    let client = connect_stdio(stdio_launch(node_bin("mcp-server-memory").to_string_lossy(), &[])).await;
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert!(catalog.tools.iter().any(|t| t.name() == "create_entities"));
    client.close().await;
}
