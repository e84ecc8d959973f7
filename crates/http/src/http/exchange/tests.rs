use std::time::Duration;

use serde_json::json;
use warp::reply::Response;

use super::*;
use crate::mcp::protocol::codes;
use crate::mcp::transport::Inbound;

#[tokio::test]
async fn answers_reach_the_request_that_asked_and_only_in_its_session() {
    let exchange = Exchange::default();
    let (reply, answer) = oneshot::channel();
    let asker = RequestId::Number(1);
    let (withdrawn, _) = Withdrawn::channel();
    let (out, _) = exchange
        .outbound(
            "s1",
            &asker,
            Inbound::Request { method: "sampling/createMessage".into(), params: None, reply, ours: true },
            &withdrawn,
        )
        .expect("a request to send");
    let id = RequestId::String(out["id"].as_str().unwrap().to_owned());
    assert_eq!(out["method"], "sampling/createMessage");
    assert!(!exchange.deliver("s2", &id, Ok(json!({}))), "another session cannot answer");
    assert!(exchange.deliver("s1", &id, Ok(json!({"ok": true}))));
    assert_eq!(answer.await.unwrap().unwrap()["ok"], true);
    assert!(!exchange.deliver("s1", &id, Ok(json!({}))), "answered once");
}

/// A server request whose asker stops waiting before the client answers (the server withdrew it, or gave up) is
/// taken out of the table, and the client's stream is told, under the id the client knows, that it need not
/// answer; an answer that comes anyway reaches nobody. Before, the client was never told: its user was still
/// asked, and the late answer dropped.
#[tokio::test]
async fn a_request_the_asker_gives_up_on_is_withdrawn_from_the_client() {
    let exchange = Exchange::default();
    let (reply, answer) = oneshot::channel();
    let (withdrawn, mut withdrawals) = Withdrawn::channel();
    let request = Inbound::Request { method: "elicitation/create".into(), params: None, reply, ours: true };
    let (out, asked) = exchange.outbound("s1", &RequestId::Number(1), request, &withdrawn).expect("a request");
    let asked = asked.expect("a request is remembered");
    assert!(exchange.waits(&asked));
    drop(answer);
    let note = tokio::time::timeout(Duration::from_secs(5), withdrawals.recv()).await.expect("told").expect("a note");
    assert_eq!(note["method"], "notifications/cancelled", "{note}");
    assert_eq!(note["params"]["requestId"], out["id"], "{note}");
    assert!(!exchange.waits(&asked));
    let id = RequestId::String(out["id"].as_str().unwrap().to_owned());
    assert!(!exchange.deliver("s1", &id, Ok(json!({}))), "nothing waits for a late answer");
    assert!(exchange.withdraw(&asked).is_none(), "told once");
}

/// A request whose asker is gone before it reaches the client is not sent at all; one that may be about another
/// call (stdio and legacy SSE route a server's request to the newest call) is not withdrawn when this call ends,
/// only once its own asker stops waiting.
#[tokio::test]
async fn only_requests_surely_of_a_call_end_with_it() {
    let exchange = Exchange::default();
    let (withdrawn, _) = Withdrawn::channel();
    let (reply, answer) = oneshot::channel();
    drop(answer);
    let gone = Inbound::Request { method: "roots/list".into(), params: None, reply, ours: true };
    assert!(exchange.outbound("s1", &RequestId::Number(1), gone, &withdrawn).is_none());
    let (reply, _answer) = oneshot::channel();
    let shared = Inbound::Request { method: "roots/list".into(), params: None, reply, ours: false };
    let (out, asked) = exchange.outbound("s1", &RequestId::Number(1), shared, &withdrawn).expect("a request");
    assert!(asked.is_none(), "not withdrawn with the call: {out}");
}

/// A request answered in time is not withdrawn: the client hears nothing more of it.
#[tokio::test]
async fn an_answered_request_is_not_withdrawn() {
    let exchange = Exchange::default();
    let (reply, answer) = oneshot::channel();
    let (withdrawn, mut withdrawals) = Withdrawn::channel();
    let request = Inbound::Request { method: "roots/list".into(), params: None, reply, ours: true };
    let (out, asked) = exchange.outbound("s1", &RequestId::Number(1), request, &withdrawn).expect("a request");
    let id = RequestId::String(out["id"].as_str().unwrap().to_owned());
    assert!(exchange.deliver("s1", &id, Ok(json!({"roots": []}))));
    assert_eq!(answer.await.unwrap().unwrap(), json!({"roots": []}));
    assert!(exchange.withdraw(&asked.unwrap()).is_none());
    drop(withdrawn);
    assert!(withdrawals.recv().await.is_none(), "no word of a withdrawal");
}

/// A call that ends while the server's request to the client is unanswered (here the call gives up on it) ends
/// its stream with word that the request is withdrawn, before the call's answer.
#[tokio::test]
async fn a_stream_tells_its_client_of_a_request_left_unanswered_before_the_answer() {
    let exchange = Arc::new(Exchange::default());
    let (go, go_rx) = oneshot::channel::<()>();
    let gives_up = move |relay: Relay| async move {
        tokio::select! {
            _ = relay.ask("elicitation/create", None, Duration::from_secs(60)) => {}
            _ = go_rx => {}
        }
        Ok::<_, RouteError>(json!({"ok": true}).into())
    };
    let caps = Mode::Handshake { capabilities: std::sync::Arc::new(json!({"elicitation": {}})) };
    let answer = exchange.respond("s".into(), RequestId::Number(3), caps, gives_up, echo_finish).await;
    let Answer::Streamed(response) = answer else { panic!("the server spoke first") };
    let _ = go.send(());
    let messages = sse_messages(response).await;
    let [request, note, last] = &messages[..] else { panic!("three messages: {messages:?}") };
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(note["method"], "notifications/cancelled", "{messages:?}");
    assert_eq!(note["params"]["requestId"], request["id"], "{messages:?}");
    assert_eq!(last["result"]["ok"], true, "{messages:?}");
}

fn stateless(capabilities: Value, owner: &str) -> Mode {
    stateless_with(capabilities, owner, None)
}

/// A 2026-07-28 request whose `_meta` carries `progress_token`.
fn stateless_with(capabilities: Value, owner: &str, progress_token: Option<Value>) -> Mode {
    let params = progress_token.map(|token| json!({"_meta": {"progressToken": token}}));
    let progress = ProgressTokens::of(params.as_ref());
    Mode::Stateless { capabilities, owner: owner.to_owned(), long_lived: None, log_level: None, progress }
}

fn done(answer: Answer) -> Result<Value, RouteError> {
    match answer {
        Answer::Done(outcome) => outcome.map(Payload::into_value_or_null),
        Answer::Streamed(_) => panic!("expected a plain answer"),
    }
}

/// A call parked on its server's question and resumed by the client's retry (a new request, MRTR) tells the progress
/// its server sends afterwards under the retry's progress token, or not at all when the retry asks for none.
/// Before, it went out under the first request's token, which the client no longer listened for.
#[tokio::test]
async fn a_resumed_calls_progress_carries_the_retrys_token() {
    for retry_token in [Some(json!("second")), None] {
        let exchange = Arc::new(Exchange::default());
        let caps = json!({"sampling": {}});
        let asks_then_progresses = |relay: Relay| async move {
            let answer = relay.ask("sampling/createMessage", None, Duration::from_secs(5)).await;
            // The transport gives the progress the token of the request that started the call.
            relay.notify("notifications/progress", Some(json!({"progressToken": "first", "progress": 1})));
            Ok(json!({"asked": answer.is_ok()}).into())
        };
        let first = stateless_with(caps.clone(), "alice", Some(json!("first")));
        let parked =
            done(exchange.respond("a".into(), RequestId::Number(1), first, asks_then_progresses, echo_finish).await)
                .unwrap();
        let (key, _) = parked["inputRequests"].as_object().unwrap().iter().next().unwrap();
        let state = parked["requestState"].as_str().unwrap().to_owned();
        let responses = json!({key.clone(): {"role": "assistant", "content": {"type": "text", "text": "hi"}}});
        let retry = stateless_with(caps.clone(), "alice", retry_token.clone());
        let answer =
            exchange.resume("b".into(), RequestId::Number(2), retry, &state, Some(&responses), echo_finish).await;
        let messages = match answer {
            Answer::Streamed(response) => sse_messages(response).await,
            Answer::Done(outcome) => vec![response_message(RequestId::Number(0), outcome)],
        };
        let progress: Vec<&Value> = messages.iter().filter(|m| m["method"] == "notifications/progress").collect();
        match &retry_token {
            Some(token) => {
                assert_eq!(progress.len(), 1, "{messages:?}");
                assert_eq!(&progress[0]["params"]["progressToken"], token, "{messages:?}");
            }
            None => assert!(progress.is_empty(), "no progress for a retry that asked for none: {messages:?}"),
        }
        assert_eq!(messages.last().unwrap()["result"]["asked"], true, "{messages:?}");
    }
}

/// A server that asks its client and returns the answer.
async fn asks(relay: Relay) -> Result<Payload, RouteError> {
    let answer = relay.ask("sampling/createMessage", Some(json!({"maxTokens": 5})), Duration::from_secs(5)).await;
    Ok(json!({"answer": answer.map_err(|e| e.message).unwrap_or_else(|e| json!(e))}).into())
}

fn echo_finish(outcome: Result<Payload, RouteError>) -> Value {
    response_message(RequestId::Number(0), outcome)
}

#[tokio::test]
async fn a_2026_client_answers_through_input_required_and_only_its_owner_can_resume() {
    let exchange = Arc::new(Exchange::default());
    let caps = json!({"sampling": {}});
    let first = done(
        exchange.respond("a".into(), RequestId::Number(1), stateless(caps.clone(), "alice"), asks, echo_finish).await,
    )
    .unwrap();
    assert_eq!(first["resultType"], "input_required");
    let (key, request) = first["inputRequests"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["maxTokens"], 5);
    let state = first["requestState"].as_str().unwrap().to_owned();
    assert!(is_parked_state(Some(&json!(state))));

    let mallory = exchange
        .resume("b".into(), RequestId::Number(2), stateless(caps.clone(), "mallory"), &state, None, echo_finish)
        .await;
    let refused = done(mallory).unwrap_err();
    assert!(matches!(refused, RouteError::Rpc(ref e) if e.code == codes::INVALID_PARAMS));

    // A retry without the answer is asked again, under a new state.
    let again = done(
        exchange
            .resume("c".into(), RequestId::Number(3), stateless(caps.clone(), "alice"), &state, None, echo_finish)
            .await,
    )
    .unwrap();
    assert_eq!(again["resultType"], "input_required");
    let (key2, _) = again["inputRequests"].as_object().unwrap().iter().next().unwrap();
    let state2 = again["requestState"].as_str().unwrap().to_owned();
    assert_ne!(state, state2);
    let _ = key;

    let responses = json!({key2.clone(): {"role": "assistant", "content": {"type": "text", "text": "hi"}}});
    let result = done(
        exchange
            .resume("d".into(), RequestId::Number(4), stateless(caps, "alice"), &state2, Some(&responses), echo_finish)
            .await,
    )
    .unwrap();
    assert_eq!(result["answer"]["content"]["text"], "hi");
    let reused = exchange
        .resume("e".into(), RequestId::Number(5), stateless(json!({}), "alice"), &state2, None, echo_finish)
        .await;
    assert!(done(reused).is_err(), "a state is good for one retry");
}

#[tokio::test]
async fn a_2026_client_without_the_capability_is_not_asked() {
    let exchange = Arc::new(Exchange::default());
    let result = done(
        exchange.respond("a".into(), RequestId::Number(1), stateless(json!({}), "alice"), asks, echo_finish).await,
    )
    .unwrap();
    assert!(result["answer"].as_str().unwrap().contains("cannot take sampling/createMessage"), "{result}");
}

/// The JSON messages of an SSE answer, read to its end (at most 5 s).
async fn sse_messages(response: Response) -> Vec<Value> {
    use http_body_util::BodyExt;
    let body = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect()).await;
    let text = match body {
        Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        other => panic!("the stream did not end whole: {:?}", other.err()),
    };
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect()
}

/// A call that answers at once, holding its relay as a route does.
async fn holds_relay(relay: Relay) -> Result<Payload, RouteError> {
    let _relay = relay;
    Ok(json!({"ok": true}).into())
}

fn handshake() -> Mode {
    Mode::Handshake { capabilities: std::sync::Arc::new(json!({})) }
}

/// Signals when dropped: a call's future was let go (finished or stopped).
struct Dropped(Option<oneshot::Sender<()>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

type CallFuture = std::pin::Pin<Box<dyn Future<Output = Result<Payload, RouteError>> + Send>>;

/// What a test holds of a call made by [`waiting_call`].
struct Ends {
    /// Held while the call should wait: dropping it lets the call finish.
    _go: oneshot::Sender<()>,
    /// Fires when the call finished.
    finished: oneshot::Receiver<()>,
    /// Fires when the call's future went, finished or stopped.
    dropped: oneshot::Receiver<()>,
}

/// A call that waits for `go`, then reports `finished`; `dropped` fires when its future goes, either way.
fn waiting_call() -> (Ends, impl FnOnce(Relay) -> CallFuture) {
    let (go, go_rx) = oneshot::channel();
    let (finished_tx, finished) = oneshot::channel();
    let (dropped_tx, dropped) = oneshot::channel();
    (Ends { _go: go, finished, dropped }, waits_for(go_rx, finished_tx, dropped_tx))
}

/// Waits (at most 5 s) for `signal`, which must fire.
async fn fires(signal: oneshot::Receiver<()>, what: &str) {
    let fired = tokio::time::timeout(Duration::from_secs(5), signal).await;
    assert!(matches!(fired, Ok(Ok(()))), "{what}: {fired:?}");
}

fn waits_for(
    go: oneshot::Receiver<()>,
    finished: oneshot::Sender<()>,
    dropped: oneshot::Sender<()>,
) -> impl FnOnce(Relay) -> CallFuture {
    move |relay| {
        // Made before the first poll: a call stopped before it ever ran is dropped too.
        let dropped = Dropped(Some(dropped));
        Box::pin(async move {
            // Held, as a route holds them, until the call ends.
            let (_relay, _dropped) = (relay, dropped);
            let _ = go.await;
            let _ = finished.send(());
            Ok(json!({"done": true}).into())
        })
    }
}

/// Polls `respond` until it is waiting on its call, then drops it, as hyper does when the client goes away.
async fn respond_then_disconnect(exchange: &Arc<Exchange>, mode: Mode, run: impl FnOnce(Relay) -> CallFuture) {
    let answer = exchange.respond("s".into(), RequestId::Number(7), mode, run, echo_finish);
    tokio::pin!(answer);
    assert!(futures::poll!(answer.as_mut()).is_pending(), "the call is still running");
}

#[tokio::test]
async fn a_call_cancelled_while_the_client_waits_is_answered_as_cancelled() {
    let exchange = Arc::new(Exchange::default());
    let (ends, call) = waiting_call();
    let answer = exchange.respond("s".into(), RequestId::String("slow".into()), handshake(), call, echo_finish);
    let cancel = async {
        // Repeated until the call is tracked: the cancellation may come before the call.
        loop {
            exchange.cancel("s", Some(&json!({"requestId": "slow"})));
            tokio::task::yield_now().await;
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! { answer = answer => answer, () = cancel => unreachable!() }
    })
    .await
    .expect("the cancelled call is answered");
    let err = done(answer).unwrap_err();
    assert!(matches!(err, RouteError::Rpc(ref e) if e.message == "request cancelled"), "{err:?}");
    fires(ends.dropped, "the call stopped").await;
}

#[tokio::test]
async fn a_handshake_call_stops_with_its_client() {
    // The answer has nowhere else to go (no answer is resumed on another stream): the call is cancelled and its
    // slot freed, as for a 2026-07-28 client (issue 73, item 8).
    let exchange = Arc::new(Exchange::default());
    let (ends, call) = waiting_call();
    respond_then_disconnect(&exchange, handshake(), call).await;
    fires(ends.dropped, "the call stopped").await;
    assert!(ends.finished.await.is_err(), "it never finished");
    // A late `notifications/cancelled` for it is harmless.
    exchange.cancel("s", Some(&json!({"requestId": 7})));
}

#[tokio::test]
async fn a_2026_call_stops_with_its_client() {
    let exchange = Arc::new(Exchange::default());
    let (ends, call) = waiting_call();
    respond_then_disconnect(&exchange, stateless(json!({}), "alice"), call).await;
    fires(ends.dropped, "the call stopped").await;
    assert!(ends.finished.await.is_err(), "it never finished");
}

#[tokio::test]
async fn a_call_that_panics_is_an_internal_error_and_the_exchange_goes_on() {
    let exchange = Arc::new(Exchange::default());
    let panics = |relay: Relay| async move {
        let _relay = relay;
        if std::hint::black_box(true) {
            panic!("a bug in a route");
        }
        Ok(json!({}).into())
    };
    // The relay goes first as the call unwinds, so the error may come as plain JSON or end an event stream.
    let error = match exchange.respond("s".into(), RequestId::Number(1), handshake(), panics, echo_finish).await {
        Answer::Done(outcome) => response_message(RequestId::Number(0), outcome),
        Answer::Streamed(response) => sse_messages(response).await.pop().expect("the stream ends with the answer"),
    };
    assert_eq!(error["error"]["code"], codes::INTERNAL_ERROR, "{error}");
    let answer = exchange.respond("s".into(), RequestId::Number(2), handshake(), holds_relay, echo_finish).await;
    assert_eq!(done(answer).unwrap()["ok"], true);
}

/// Finished calls leave the cancellable table in sweeps (not a walk of the table per call), so it holds at most
/// about twice the live calls: it does not keep every call it ever saw.
#[tokio::test]
async fn the_cancellable_calls_table_stays_bounded() {
    let exchange = Exchange::default();
    let live: Vec<_> = (0..100).map(|_| tokio::spawn(std::future::pending::<()>())).collect();
    for (n, call) in live.iter().enumerate() {
        exchange.track("s", &RequestId::Number(n as i64), call.abort_handle());
    }
    for n in 0..2_000 {
        let done = tokio::spawn(async {});
        let handle = done.abort_handle();
        done.await.unwrap();
        exchange.track("s", &RequestId::Number(1_000 + n), handle);
        let held = exchange.calls.lock().running.len();
        assert!(held <= 2 * 100 + 1, "the table held {held} calls with 100 running");
    }
    // A live call is never swept: each can still be cancelled.
    for n in 0..100 {
        exchange.cancel("s", Some(&json!({ "requestId": n })));
    }
    for call in live {
        assert!(call.await.unwrap_err().is_cancelled());
    }
}

/// A call answered before the server says anything leaves the cancellable table at once: after a burst the next
/// sweep may be far off, and each entry keeps its finished task.
#[tokio::test]
async fn a_call_answered_at_once_leaves_the_cancellable_table() {
    let exchange = Arc::new(Exchange::default());
    for n in 0..3 {
        let answer = exchange.respond("s".into(), RequestId::Number(n), handshake(), holds_relay, echo_finish).await;
        assert_eq!(done(answer).unwrap()["ok"], true);
    }
    assert!(exchange.calls.lock().running.is_empty(), "{:?}", exchange.calls.lock().running.keys());
}

/// A server that says something and answers at once, as a tool that logs a line before its result does.
async fn says_then_answers(relay: Relay) -> Result<Payload, RouteError> {
    relay.notify("notifications/message", Some(json!({"level": "info", "data": "said first"})));
    Ok(json!({"ok": true}).into())
}

#[tokio::test]
async fn what_the_server_said_just_before_a_fast_answer_still_goes_first() {
    // A 2026-07-28 request hears log messages when it asks for them.
    let listening = Mode::Stateless {
        capabilities: json!({}),
        owner: "alice".into(),
        long_lived: None,
        log_level: Some("info".into()),
        progress: ProgressTokens::default(),
    };
    for mode in [handshake(), listening] {
        let exchange = Arc::new(Exchange::default());
        let answer = exchange.respond("a".into(), RequestId::Number(7), mode, says_then_answers, echo_finish).await;
        let Answer::Streamed(response) = answer else { panic!("the notification was dropped with a plain answer") };
        let messages = sse_messages(response).await;
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert_eq!(messages[0]["method"], "notifications/message");
        assert_eq!(messages[0]["params"]["data"], "said first");
        assert_eq!(messages[1]["result"]["ok"], true);
    }
}

/// What watches a listen's credential stops once the request is gone, however it ended: the token it waits on is
/// cancelled when the last copy of the request's mode goes (before, only a stream that had started cancelled it,
/// and a listen answered at once left its watcher running for good).
#[test]
fn a_long_lived_requests_end_token_is_cancelled_with_its_last_copy() {
    let long_lived = LongLived::new();
    let ends = long_lived.ends();
    let copy = long_lived.clone();
    drop(long_lived);
    assert!(!ends.is_cancelled(), "a copy is still held");
    drop(copy);
    assert!(ends.is_cancelled());
}

/// A cancel names its call by the id as the client wrote it: `7` and `"7"` are different ids. Before, both were
/// keyed by their text, so a cancel for the number stopped the call whose id was the string.
#[tokio::test]
async fn a_cancel_stops_only_the_call_whose_id_is_of_its_kind() {
    let exchange = Exchange::default();
    let text_id = tokio::spawn(std::future::pending::<()>());
    let number_id = tokio::spawn(std::future::pending::<()>());
    exchange.track("s", &RequestId::String("7".into()), text_id.abort_handle());
    exchange.track("s", &RequestId::Number(8), number_id.abort_handle());
    exchange.cancel("s", Some(&json!({"requestId": 7})));
    exchange.cancel("s", Some(&json!({"requestId": "8"})));
    tokio::task::yield_now().await;
    assert!(!text_id.is_finished() && !number_id.is_finished(), "neither id was the one named");
    exchange.cancel("s", Some(&json!({"requestId": "7"})));
    exchange.cancel("s", Some(&json!({"requestId": 8})));
    assert!(matches!(text_id.await, Err(stopped) if stopped.is_cancelled()));
    assert!(matches!(number_id.await, Err(stopped) if stopped.is_cancelled()));
}
