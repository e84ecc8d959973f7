use super::*;
use crate::store::{NewEvent, Store};
use futures::FutureExt;
use parking_lot::Mutex;
use serde_json::{json, Value};

fn row(i: usize, process_id: &str) -> NewEvent<'_> {
    NewEvent {
        event_type: "mcp.server.status_changed",
        emitted_at: crate::model::iso(chrono::Utc::now()),
        data: json!({"n": i}).to_string().into(),
        process_id: Some(process_id),
        held: None,
    }
}

/// The uploader over `store`'s outbox, its own events emitted there too.
fn uploader(store: &Store, send: SendBatch, batch: usize, quota: i64) -> Uploader {
    Uploader::new(store.outbox(), Emitter::new(store.outbox(), store.statuses()), send, batch, quota)
}

async fn store_with(n: usize) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).await.unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("p{}", i % 3)).collect();
    let events: Vec<NewEvent<'_>> = (0..n).map(|i| row(i, &ids[i])).collect();
    store.outbox().append_events(&events).await.unwrap();
    (dir, store)
}

/// A backend answering from a script (then `Accepted`), recording what it received.
fn scripted(script: Vec<BatchOutcome>) -> (SendBatch, Arc<Mutex<Vec<Vec<Value>>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(script.into_iter().collect::<std::collections::VecDeque<_>>()));
    let seen = received.clone();
    let send: SendBatch = Arc::new(move |batch, _timeout| {
        seen.lock().push(batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect());
        let outcome = script.lock().pop_front().unwrap_or(BatchOutcome::Accepted { failures: vec![] });
        async move { outcome }.boxed()
    });
    (send, received)
}

fn numbers(batches: &[Vec<Value>]) -> Vec<i64> {
    batches.iter().flatten().map(|e| e["data"]["n"].as_i64().unwrap()).collect()
}

#[tokio::test]
async fn batches_of_at_most_100_in_order_deleting_only_what_was_accepted() {
    let (_dir, store) = store_with(250).await;
    let (send, received) = scripted(vec![]);
    let mut up = uploader(&store, send, 500, 10_000);
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(100), "a batch never exceeds 100");
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(100));
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(50));
    assert_eq!(up.tick().await.unwrap(), Tick::Idle, "no empty batch is sent");
    let got = received.lock().clone();
    assert_eq!(got.len(), 3);
    assert_eq!(numbers(&got), (0..250).collect::<Vec<_>>(), "oldest first, nothing twice");
    assert_eq!(got[0][0]["type"], "mcp.server.status_changed");
    assert!(got[0][0]["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(store.outbox().event_count().await.unwrap(), 0);
}

#[tokio::test]
async fn failures_keep_the_batch_and_429_backs_off_doubling_to_48s() {
    let (_dir, store) = store_with(10).await;
    let script = vec![
        BatchOutcome::Failed("500".into()),
        BatchOutcome::Unauthorized,
        BatchOutcome::RateLimited(None),
        BatchOutcome::RateLimited(None),
        BatchOutcome::RateLimited(None),
        BatchOutcome::RateLimited(None),
        BatchOutcome::RateLimited(None),
        BatchOutcome::RateLimited(None),
    ];
    let (send, received) = scripted(script);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 10, wait: None });
    assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 10, wait: None });
    let waits: Vec<u64> = {
        let mut waits = Vec::new();
        for _ in 0..6 {
            if let Tick::Kept { wait: Some(w), .. } = up.tick().await.unwrap() {
                waits.push(w.as_secs());
            }
        }
        waits
    };
    assert_eq!(waits, [3, 6, 12, 24, 48, 48]);
    assert_eq!(store.outbox().event_count().await.unwrap(), 10, "nothing lost while the backend refuses");
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(10));
    assert_eq!(up.backoff(), None, "success resets the backoff");
    // The same ten events went each time, in the same order.
    assert!(received.lock().iter().all(|b| numbers(std::slice::from_ref(b)) == (0..10).collect::<Vec<_>>()));
}

/// A 429 or 503 with `Retry-After`: the events are kept and the next batch waits as long as asked, never less than
/// the own backoff, never past the cap; waited out, the wait asked is forgotten.
#[tokio::test]
async fn a_retry_after_is_waited_out_within_the_own_backoff_and_the_cap() {
    let (_dir, store) = store_with(10).await;
    let busy = |reason: &str, secs: u64| BatchOutcome::Unavailable {
        reason: reason.into(),
        retry_after: Duration::from_secs(secs),
    };
    let script = vec![
        BatchOutcome::RateLimited(Some(Duration::from_secs(20))),
        BatchOutcome::RateLimited(Some(Duration::from_secs(1))),
        BatchOutcome::RateLimited(Some(Duration::MAX)),
        busy("503", 7),
        busy("503", u64::MAX),
    ];
    let (send, _) = scripted(script);
    let mut up = uploader(&store, send, 100, 10_000);
    let mut waits = Vec::new();
    for _ in 0..5 {
        let Tick::Kept { events: 10, wait: Some(wait) } = up.tick().await.unwrap() else { panic!("kept, with a wait") };
        waits.push((wait.as_secs(), up.backoff().map(|b| b.as_secs())));
    }
    // asked 20 (own 3); asked 1 (own 6); asked for ever (own 12): the cap; a 503 asking 7 (the own 12 still stands);
    // a 503 asking for ever.
    assert_eq!(waits, [(20, Some(20)), (6, Some(6)), (300, Some(300)), (12, Some(12)), (300, Some(300))]);
    assert_eq!(store.outbox().event_count().await.unwrap(), 10, "nothing lost while the backend is busy");
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(10));
    assert_eq!(up.backoff(), None, "a batch accepted: no wait left");
}

#[tokio::test]
async fn a_backend_refusing_every_event_is_not_drained_at_full_speed() {
    let (_dir, store) = store_with(50).await;
    let send: SendBatch = Arc::new(|_, _| async { BatchOutcome::Invalid("400: validation failed".into()) }.boxed());
    let mut up = uploader(&store, send, 100, 10_000);
    let mut held = 0;
    let waited = loop {
        match up.tick().await.unwrap() {
            Tick::Held(n) => held += n,
            Tick::Shrunk { .. } => {}
            Tick::Kept { wait, .. } => break wait,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(held, INVALID_BEFORE_BACKOFF as usize, "a few held at once");
    assert_eq!(waited, Some(BACKOFF_FIRST), "then each waits a backoff");
    assert_eq!(store.outbox().event_count().await.unwrap(), 50, "every event kept (held or waiting)");
}

/// A proxy before the backend answered 400 to everything for a while: the events it refused one at a time were
/// held. Once a batch goes through again, they are offered again and sent, none lost.
#[tokio::test]
async fn events_refused_while_everything_was_refused_are_sent_once_the_backend_accepts() {
    let (_dir, store) = store_with(50).await;
    let refusing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let received = Arc::new(Mutex::new(Vec::new()));
    let (gate, seen) = (refusing.clone(), received.clone());
    let send: SendBatch = Arc::new(move |batch, _timeout| {
        let outcome = if gate.load(std::sync::atomic::Ordering::SeqCst) {
            BatchOutcome::Invalid("400: bad request".into())
        } else {
            seen.lock().push(batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect::<Vec<Value>>());
            BatchOutcome::Accepted { failures: vec![] }
        };
        async move { outcome }.boxed()
    });
    let mut up = uploader(&store, send, 100, 10_000);
    let mut backoffs = 0;
    while backoffs < 3 {
        if let Tick::Kept { wait: Some(_), .. } = up.tick().await.unwrap() {
            backoffs += 1;
        }
    }
    let held = up.stats().held_invalid;
    assert!(held > INVALID_BEFORE_BACKOFF as u64, "several events held during the outage: {held}");
    refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..50 {
        if up.tick().await.unwrap() == Tick::Idle {
            break;
        }
    }
    let mut sent = numbers(&received.lock());
    sent.sort_unstable();
    assert_eq!(sent, (0..50).collect::<Vec<_>>(), "every event sent once, the held ones included");
    assert_eq!(store.outbox().event_count().await.unwrap(), 0, "nothing left held in the outbox");
}

/// Two bad events next to each other look like a short streak of refusals: they are offered once more, held
/// again, and then never offered again, so the uploader comes to rest.
#[tokio::test]
async fn bad_events_offered_again_after_a_streak_are_held_for_good() {
    let (_dir, store) = store_with(300).await;
    let offers = Arc::new(Mutex::new(std::collections::HashMap::<i64, u32>::new()));
    let seen = offers.clone();
    let send: SendBatch = Arc::new(move |batch, _timeout| {
        let batch: Vec<Value> = batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
        let bad: Vec<i64> =
            batch.iter().filter_map(|e| e["data"]["n"].as_i64()).filter(|n| (37..=38).contains(n)).collect();
        if batch.len() == 1 {
            for n in &bad {
                *seen.lock().entry(*n).or_default() += 1;
            }
        }
        let outcome = match bad.is_empty() {
            true => BatchOutcome::Accepted { failures: vec![] },
            false => BatchOutcome::Invalid("400: validation failed".into()),
        };
        async move { outcome }.boxed()
    });
    let mut up = uploader(&store, send, 100, 10_000);
    let mut rested = false;
    for _ in 0..500 {
        if up.tick().await.unwrap() == Tick::Idle {
            rested = true;
            break;
        }
    }
    assert!(rested, "the uploader comes to rest");
    assert_eq!(*offers.lock(), [(37, 2), (38, 2)].into_iter().collect(), "each bad event alone twice, no more");
    let kept = store.outbox().events(None, 0, 10).await.unwrap();
    assert_eq!(kept.iter().map(|e| e.data["n"].as_i64().unwrap()).collect::<Vec<_>>(), [37, 38]);
    assert!(kept.iter().all(|e| e.held.is_some()), "both held");
}

#[tokio::test]
async fn an_invalid_event_is_found_and_held_and_the_rest_are_sent() {
    let (_dir, store) = store_with(1000).await;
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = received.clone();
    // A backend that refuses any batch holding event 37 (before, the whole batch of 100 went with it).
    let send: SendBatch = Arc::new(move |batch, _timeout| {
        let batch: Vec<Value> = batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
        let poisoned = batch.iter().any(|e| e["data"]["n"] == 37);
        if !poisoned {
            seen.lock().push(batch);
        }
        let outcome = if poisoned {
            BatchOutcome::Invalid("400: validation failed".into())
        } else {
            BatchOutcome::Accepted { failures: vec![] }
        };
        async move { outcome }.boxed()
    });
    let mut up = uploader(&store, send, 100, 10_000);
    for _ in 0..200 {
        if up.tick().await.unwrap() == Tick::Idle {
            break;
        }
    }
    let mut sent = numbers(&received.lock());
    sent.sort_unstable();
    assert_eq!(sent, (0..1000).filter(|n| *n != 37).collect::<Vec<_>>(), "every other event sent, once");
    assert_eq!(up.stats().held_invalid, 1);
    let kept = store.outbox().events(None, 0, 10).await.unwrap();
    assert_eq!(kept.len(), 1, "the refused event stays in the outbox");
    assert!(kept[0].held.as_deref().unwrap().contains("validation failed"), "{:?}", kept[0].held);
    assert_eq!(kept[0].data["n"], 37);
}

/// A stored event that makes no envelope is held with its reason and logged, never sent and never deleted;
/// the events around it go as usual.
#[tokio::test]
async fn an_event_that_makes_no_envelope_is_held_not_dropped() {
    let (_dir, store) = store_with(2).await;
    let mut bad = row(2, "p2");
    bad.event_type = "mcp.from.a.newer.version";
    let mut not_object = row(3, "p3");
    not_object.data = json!([1, 2]).to_string().into();
    store.outbox().append_events(&[bad, not_object, row(4, "p4")]).await.unwrap();
    let (send, received) = scripted(vec![]);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(3));
    assert_eq!(numbers(&received.lock()), [0, 1, 4]);
    assert_eq!(up.stats().held, 2);
    let kept = store.outbox().events(None, 0, 10).await.unwrap();
    assert_eq!(kept.len(), 2, "the held events stay in the outbox");
    assert!(kept[0].held.as_deref().unwrap().contains("unknown event type"));
    assert!(kept[1].held.as_deref().unwrap().contains("not a JSON object"));
    assert_eq!(up.tick().await.unwrap(), Tick::Idle, "held events are not offered again");
}

#[tokio::test]
async fn over_the_quota_the_oldest_are_dropped_and_counted() {
    let (_dir, store) = store_with(30).await;
    let (send, received) = scripted(vec![BatchOutcome::Failed("down".into())]);
    let mut up = uploader(&store, send, 100, 20);
    up.tick().await.unwrap();
    assert_eq!(up.stats().dropped_over_quota, 10);
    let batch = received.lock()[0].clone();
    let (status, limits): (Vec<Value>, Vec<Value>) =
        batch.into_iter().partition(|e| e["type"] == "mcp.server.status_changed");
    assert_eq!(numbers(&[status]), (10..30).collect::<Vec<_>>(), "the newest 20 are kept");
    assert_eq!(limits.len(), 1, "the overflow is reported once");
    assert_eq!(limits[0]["type"], "resource.limit.exceeded");
    assert_eq!(limits[0]["data"]["resource_type"], "event_outbox");
    assert_eq!(limits[0]["data"]["current_value"], 30);
    assert_eq!(limits[0]["data"]["limit_value"], 20);
}

/// Gaps in the outbox's sequence numbers (events sent out of order, by other replicas) are not events: the
/// cheap span check only decides whether to count, and the count decides.
#[tokio::test]
async fn gaps_in_the_sequence_are_not_counted_as_events() {
    let (_dir, store) = store_with(30).await;
    let middle: Vec<i64> = store.outbox().events(None, 0, 100).await.unwrap()[5..20].iter().map(|e| e.seq).collect();
    store.outbox().delete_events_for_tests(&middle).await.unwrap();
    assert_eq!((store.outbox().event_seq_span().await.unwrap(), store.outbox().event_count().await.unwrap()), (30, 15));
    let (send, _received) = scripted(vec![BatchOutcome::Failed("down".into())]);
    let mut up = uploader(&store, send, 100, 20);
    up.tick().await.unwrap();
    assert_eq!(up.stats().dropped_over_quota, 0, "15 events are within a quota of 20");
    assert_eq!(store.outbox().event_count().await.unwrap(), 15);
}

/// Of replicas sharing one outbox, only the one the gate names (the leader) holds it to its quotas; the
/// others hold it within twice them, in case none leads for long. When the gate opens, the outbox is pruned
/// at once.
#[tokio::test]
async fn only_the_replica_the_gate_names_prunes_the_outbox() {
    let (_dir, store) = store_with(50).await;
    let leads = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = leads.clone();
    let (send, _received) = scripted(vec![BatchOutcome::Failed("down".into()); 2]);
    let mut up = uploader(&store, send, 100, 20)
        .with_prune_gate(Arc::new(move || gate.load(std::sync::atomic::Ordering::SeqCst)));
    up.tick().await.unwrap();
    assert_eq!(
        (up.stats().dropped_over_quota, store.outbox().event_count().await.unwrap()),
        (10, 41),
        "a follower: 40"
    );
    leads.store(true, std::sync::atomic::Ordering::SeqCst);
    up.tick().await.unwrap();
    assert_eq!(up.stats().dropped_over_quota, 31, "the leader: 20");
}

/// A backend away while big request logs pile up: the outbox is held to its bytes on disk, the oldest going,
/// and the overflow is reported with the bytes.
#[tokio::test]
async fn over_the_byte_quota_the_oldest_are_dropped_and_reported() {
    const MAX: u64 = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).await.unwrap();
    let pad = "y".repeat(20_000);
    let rows: Vec<NewEvent<'_>> = (0..150)
        .map(|n| NewEvent {
            event_type: "mcp.server.status_changed",
            emitted_at: crate::model::iso(chrono::Utc::now()),
            data: json!({"n": n, "pad": pad}).to_string().into(),
            process_id: None,
            held: None,
        })
        .collect();
    store.outbox().append_events(&rows).await.unwrap();
    let (send, received) = scripted(vec![BatchOutcome::Failed("down".into())]);
    let mut up = uploader(&store, send, 100, 10_000).with_byte_quota(MAX);
    up.tick().await.unwrap();
    let dropped = up.stats().dropped_over_quota;
    assert!((100..150).contains(&dropped), "{dropped} dropped of 150 events of 20 KB");
    assert!(store.outbox().outbox_bytes().await.unwrap() <= MAX);
    let sent = numbers(&received.lock()[..1]);
    assert_eq!(sent.first().copied(), Some(dropped as i64), "the oldest kept is the first sent");
    assert_eq!(store.outbox().event_count().await.unwrap() as u64, 150 - dropped + 1, "the rest and the report wait");
    let limits = store.outbox().events(Some("resource.limit.exceeded"), 0, 10).await.unwrap();
    assert_eq!(limits.len(), 1, "the overflow is reported");
    assert_eq!(limits[0].data["limit_value"], MAX);
    assert!(limits[0].data["current_value"].as_u64().unwrap() > 2 * MAX, "the outbox's own bytes before the prune");
}

#[tokio::test]
async fn flush_sends_everything_within_the_deadline() {
    let (_dir, store) = store_with(230).await;
    let (send, received) = scripted(vec![]);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.flush(Duration::from_secs(5)).await.unwrap(), 0);
    assert_eq!(received.lock().len(), 3);
    // A backend that keeps failing leaves the events for the next start.
    let (_dir2, store) = store_with(7).await;
    let (send, _) = scripted(vec![BatchOutcome::Failed("x".into()); 100]);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.flush(Duration::from_secs(5)).await.unwrap(), 7);
}

fn too_large() -> BatchOutcome {
    BatchOutcome::TooLarge("backend answered 413 Payload Too Large".into())
}

/// A 413 would come back for the same batch for ever, and every later event would wait behind it: the
/// batch is sent in halves, and an event the backend refuses even alone is held, so the rest still go.
#[tokio::test]
async fn a_batch_refused_as_too_large_is_sent_in_halves_and_an_event_too_large_alone_is_held() {
    let (_dir, store) = store_with(8).await;
    let (send, received) = scripted(vec![too_large()]);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.tick().await.unwrap(), Tick::Shrunk { from: 8, to: 4 });
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(4));
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(4), "an accepted batch lets the next one grow back");
    assert_eq!(up.tick().await.unwrap(), Tick::Idle);
    assert_eq!(numbers(&received.lock()), [(0..8).collect::<Vec<_>>(), (0..8).collect()].concat());
    assert_eq!(store.outbox().event_count().await.unwrap(), 0);

    let (_dir, store) = store_with(3).await;
    let (send, received) = scripted(vec![too_large(), too_large()]);
    let mut up = uploader(&store, send, 100, 10_000);
    assert_eq!(up.tick().await.unwrap(), Tick::Shrunk { from: 3, to: 1 });
    assert_eq!(up.tick().await.unwrap(), Tick::Held(1), "one event refused alone is held");
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(1));
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(1));
    assert_eq!(up.tick().await.unwrap(), Tick::Idle);
    assert_eq!(numbers(&received.lock()), [0, 1, 2, 0, 1, 2]);
    assert_eq!(up.stats().held, 1);
    let kept = store.outbox().events(None, 0, 10).await.unwrap();
    assert_eq!(kept.len(), 1, "the held event is kept, not dropped");
    assert_eq!(kept[0].data["n"], 0);
    assert!(kept[0].held.as_deref().is_some_and(|why| why.contains("too large")), "{:?}", kept[0].held);
}

/// No batch passes MAX_BATCH_BYTES of envelopes (so no 413 is needed to find the backend's limit), yet an
/// event bigger than that by itself is still sent, alone.
#[tokio::test]
async fn a_batch_stops_before_the_event_that_would_pass_its_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).await.unwrap();
    let sizes = [200 * 1024, 200 * 1024, 200 * 1024, 2 * MAX_BATCH_BYTES, 10, 10];
    let texts: Vec<String> =
        sizes.iter().enumerate().map(|(i, size)| json!({"n": i, "pad": "x".repeat(*size)}).to_string()).collect();
    let rows: Vec<NewEvent<'_>> =
        texts.iter().map(|text| NewEvent { data: text.as_str().into(), ..row(0, "p0") }).collect();
    store.outbox().append_events(&rows).await.unwrap();
    let (send, received) = scripted(vec![]);
    let mut up = uploader(&store, send, 100, 10_000);
    let mut ticks = Vec::new();
    loop {
        match up.tick().await.unwrap() {
            Tick::Idle => break,
            tick => ticks.push(tick),
        }
    }
    assert_eq!(ticks, [Tick::Sent(2), Tick::Sent(1), Tick::Sent(1), Tick::Sent(2)]);
    let batches = received.lock().clone();
    for batch in &batches {
        let bytes: usize = batch.iter().map(|e| e.to_string().len()).sum();
        assert!(batch.len() == 1 || bytes <= MAX_BATCH_BYTES, "{} events in {bytes} bytes", batch.len());
    }
    assert_eq!(numbers(&batches), (0..6).collect::<Vec<_>>(), "in order, each once");
    assert_eq!(store.outbox().event_count().await.unwrap(), 0);
}

/// A backend that is slow but steady (it answers within the longer wait, past half of it) keeps the longer wait:
/// the next batch does not go back to the short one and time out again.
#[tokio::test]
async fn a_slow_but_steady_backend_keeps_the_longer_wait() {
    let (_dir, store) = store_with(6).await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (seen, count) = (asked.clone(), calls.clone());
    let send: SendBatch = Arc::new(move |_batch, timeout| {
        seen.lock().push(timeout);
        let call = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            match call {
                0 => BatchOutcome::TimedOut("no answer".into()),
                // Answered in 300 ms of the 400 ms it was given.
                1 => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    BatchOutcome::Accepted { failures: vec![] }
                }
                _ => BatchOutcome::Accepted { failures: vec![] },
            }
        }
        .boxed()
    });
    let mut up = uploader(&store, send, 2, 10_000).with_timeout(Duration::from_millis(200));
    assert!(matches!(up.tick().await.unwrap(), Tick::Kept { .. }));
    assert_eq!(up.timeout(), Duration::from_millis(400));
    assert!(matches!(up.tick().await.unwrap(), Tick::Sent(_)));
    assert_eq!(up.timeout(), Duration::from_millis(400), "a slow answer keeps the longer wait");
    assert!(matches!(up.tick().await.unwrap(), Tick::Sent(_)));
    assert_eq!(up.timeout(), Duration::from_millis(200), "a quick one brings it back");
    assert_eq!(*asked.lock(), [200, 400, 400].map(Duration::from_millis));
}

/// A batch the backend did not answer in time may have been stored: it goes again with the same events (their ids
/// are in their data), but half as many at a time, after a backoff, with twice the time to answer; an accepted
/// batch brings the timeout and the size back. A slow backend gets less, not more.
#[tokio::test]
async fn a_timed_out_batch_goes_again_smaller_later_and_with_more_time() {
    let (_dir, store) = store_with(40).await;
    let timeouts = Arc::new(Mutex::new(Vec::new()));
    let (seen, asked) = (Arc::new(Mutex::new(Vec::<Vec<i64>>::new())), timeouts.clone());
    let sent = seen.clone();
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from([
        BatchOutcome::TimedOut("no answer".into()),
        BatchOutcome::TimedOut("no answer".into()),
    ])));
    let send: SendBatch = Arc::new(move |batch, timeout| {
        asked.lock().push(timeout);
        sent.lock().push(batch.iter().map(|e| e.data["n"].as_i64().unwrap_or(-1)).collect());
        let outcome = script.lock().pop_front().unwrap_or(BatchOutcome::Accepted { failures: vec![] });
        async move { outcome }.boxed()
    });
    let mut up = uploader(&store, send, 40, 10_000).with_timeout(Duration::from_secs(2));
    assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 40, wait: Some(BACKOFF_FIRST) });
    assert_eq!(up.timeout(), Duration::from_secs(4));
    assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 20, wait: Some(BACKOFF_FIRST * 2) });
    assert_eq!(up.timeout(), Duration::from_secs(8));
    assert_eq!(up.tick().await.unwrap(), Tick::Sent(10), "half again, and accepted");
    assert_eq!(up.timeout(), Duration::from_secs(4), "halved back toward the setting");
    assert_eq!(up.backoff(), None);
    assert_eq!(*timeouts.lock(), [2, 4, 8].map(Duration::from_secs));
    let batches = seen.lock().clone();
    assert_eq!(batches[1], batches[0][..20].to_vec(), "the same events again, oldest first");
    while up.tick().await.unwrap() != Tick::Idle {}
    assert_eq!(store.outbox().event_count().await.unwrap(), 0, "nothing lost");
    // The timeout never passes half the lease, however many in a row.
    let (_dir, store) = store_with(5).await;
    let (send, _) = scripted((0..10).map(|_| BatchOutcome::TimedOut("no answer".into())).collect());
    let mut up = uploader(&store, send, 100, 10_000);
    for _ in 0..10 {
        up.tick().await.unwrap();
    }
    assert_eq!(up.timeout(), Duration::from_secs(30));
}
