use std::time::Duration;

use super::*;

#[tokio::test]
async fn answers_reach_the_request_that_asked_and_only_in_its_session() {
    let exchange = Exchange::default();
    let (reply, answer) = oneshot::channel();
    let asker = RequestId::Number(1);
    let out = exchange.outbound(
        "s1",
        &asker,
        Inbound::Request { method: "sampling/createMessage".into(), params: None, reply },
    );
    let id = RequestId::String(out["id"].as_str().unwrap().to_owned());
    assert_eq!(out["method"], "sampling/createMessage");
    assert!(!exchange.deliver("s2", &id, Ok(json!({}))), "another session cannot answer");
    assert!(exchange.deliver("s1", &id, Ok(json!({"ok": true}))));
    assert_eq!(answer.await.unwrap().unwrap()["ok"], true);
    assert!(!exchange.deliver("s1", &id, Ok(json!({}))), "answered once");
}

fn stateless(capabilities: Value, owner: &str) -> Mode {
    Mode::Stateless { capabilities, owner: owner.to_owned(), long_lived: false }
}

fn done(answer: Answer) -> Result<Value, RouteError> {
    match answer {
        Answer::Done(outcome) => outcome,
        Answer::Streamed(_) => panic!("expected a plain answer"),
    }
}

/// A server that asks its client and returns the answer.
async fn asks(relay: Relay) -> Result<Value, RouteError> {
    let answer = relay.ask("sampling/createMessage", Some(json!({"maxTokens": 5})), Duration::from_secs(5)).await;
    Ok(json!({"answer": answer.map_err(|e| e.message).unwrap_or_else(|e| json!(e))}))
}

fn echo_finish(outcome: Result<Value, RouteError>) -> Value {
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
