//! Two per-request costs that grew with what the satellite holds (issue 19, item 3), each measured next to the
//! algorithm it replaced, run in the same process on the same data:
//! - a new session on a full session table (10,000 sessions): the least recently used is evicted from the
//!   front of an ordered map, where the old table scanned every session for the oldest;
//! - a static bearer token check with 10 to 10,000 users: one lookup of the token's SHA-256, where the old check
//!   compared it with every grant of every user;
//! - a request id (UUID v4): from uuid's thread-local generator, where each id was a `getrandom` system call;
//! - relaying a server's result (a stdio line to the client's response body): read as its envelope and passed on
//!   as the server's text, where it was parsed into a tree, measured (written once to count its bytes) and
//!   written out again;
//! - a 2026-07-28 `tools/call` on an instance's endpoint finding its tool's `x-mcp-header` annotations, on a
//!   server of 1,000 tools: one lookup in the catalog's index of the few tools that name a header, where the old
//!   check walked the listing for the tool by name and read its schema text.
//!
//! Prints ns per operation and the ratio old/new. Run with `cargo bench --bench hot_paths`.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use satellite::auth::Authenticator;
use satellite::config::sha256_hex;
use satellite::http::session::{SessionTable, MAX_SESSIONS};
use subtle::ConstantTimeEq;

/// Run `op` for about `budget` and return the mean time per call.
fn time_per_call(budget: Duration, mut op: impl FnMut()) -> Duration {
    let mut calls: u32 = 0;
    let started = Instant::now();
    while started.elapsed() < budget {
        for _ in 0..64 {
            op();
        }
        calls += 64;
    }
    started.elapsed() / calls
}

fn sessions() {
    let table = SessionTable::default();
    // Twenty owners, each under its own cap: the table's cap is what evicts.
    let owners: Vec<String> = (0..20).map(|n| format!("owner-{n}")).collect();
    for n in 0..MAX_SESSIONS {
        table.create(&owners[n % owners.len()], "2025-06-18");
    }
    let mut n = 0;
    let new = time_per_call(Duration::from_secs(2), || {
        n += 1;
        black_box(table.create(&owners[n % owners.len()], "2025-06-18"));
    });
    // The replaced eviction: a scan of every session for the smallest last-seen time.
    let mut old: HashMap<String, Instant> =
        (0..MAX_SESSIONS).map(|i| (format!("session-{i}"), Instant::now())).collect();
    let mut next = 0u64;
    let scan = time_per_call(Duration::from_secs(2), || {
        if let Some(oldest) = old.iter().min_by_key(|(_, seen)| **seen).map(|(k, _)| k.clone()) {
            old.remove(&oldest);
        }
        next += 1;
        old.insert(format!("new-{next}"), Instant::now());
    });
    println!(
        "new session, full table ({MAX_SESSIONS}): {:>9} ns   old scan: {:>9} ns   old/new {:.1}x",
        new.as_nanos(),
        scan.as_nanos(),
        scan.as_secs_f64() / new.as_secs_f64()
    );
}

fn tokens(users: usize) {
    let mut file = String::from("[[teams]]\nid = \"t\"\n");
    for u in 0..users {
        file.push_str(&format!(
            "[[users]]\nid = \"u{u}\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&format!("token-{u}"))
        ));
    }
    let raw = satellite::config::parse_file(&file).expect("config");
    let directory = satellite::control::standalone::from_file(&raw).expect("valid").directory;
    let grants: Vec<String> =
        directory.users.values().flat_map(|u| u.tokens.iter().map(|g| g.sha256.clone())).collect();
    let auth = Authenticator::new(directory);
    let header = format!("Bearer token-{}", users / 2);
    let new = time_per_call(Duration::from_secs(1), || {
        black_box(auth.authenticate(Some(&header)).is_ok());
    });
    // The replaced check: the token's hash against every grant, each in constant time.
    let token = format!("token-{}", users / 2);
    let scan = time_per_call(Duration::from_secs(1), || {
        let hash = sha256_hex(&token);
        let found = grants.iter().fold(false, |found, g| found | bool::from(g.as_bytes().ct_eq(hash.as_bytes())));
        black_box(found);
    });
    println!(
        "token check, {users:>6} users:            {:>9} ns   old scan: {:>9} ns   old/new {:.1}x",
        new.as_nanos(),
        scan.as_nanos(),
        scan.as_secs_f64() / new.as_secs_f64()
    );
}

fn request_ids() {
    use rand::RngCore;
    let new = time_per_call(Duration::from_secs(1), || {
        black_box(uuid::Uuid::new_v4());
    });
    // The replaced source: 16 bytes from the OS per id (what uuid's `v4` without `fast-rng` does).
    let syscall = time_per_call(Duration::from_secs(1), || {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        black_box(uuid::Builder::from_random_bytes(bytes).into_uuid());
    });
    println!(
        "request id (UUID v4):                     {:>9} ns   getrandom: {:>8} ns   old/new {:.1}x",
        new.as_nanos(),
        syscall.as_nanos(),
        syscall.as_secs_f64() / new.as_secs_f64()
    );
}

/// One stdio response line, from the satellite reading it to the client's response body, with what the call's
/// record reads of it (isError, content an array, the result's size in bytes).
fn results() {
    use satellite::mcp::payload::{json_len, Payload, Shape};
    use satellite::mcp::protocol::{self, Message, RequestId, ResultResponse};
    let echo = r#"{"jsonrpc":"2.0","id":41,"result":{"content":[{"type":"text","text":"hi"}]}}"#.to_owned();
    let page = format!(
        r#"{{"jsonrpc":"2.0","id":41,"result":{{"content":[{{"type":"text","text":"{}"}}],"structuredContent":{{"rows":[{}]}}}}}}"#,
        "lorem ipsum dolor sit amet, ".repeat(400),
        (0..200)
            .map(|i| format!(r#"{{"id":{i},"name":"row {i}","score":{i}.5,"tags":["a","b"]}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    for (name, line) in [("echo result", &echo), ("page of rows", &page)] {
        let client_id = RequestId::Number(7);
        let tree = time_per_call(Duration::from_secs(2), || {
            let Ok((mut messages, _)) = protocol::decode_frame(line.as_bytes()) else { return };
            let Some(Ok(Message::Response { outcome: Ok(result), .. })) = messages.pop().map(Message::from_value)
            else {
                return;
            };
            black_box((Shape::of_value(&result), json_len(&result)));
            black_box(serde_json::to_vec(&protocol::response(client_id.clone(), result)).ok());
        });
        let text = time_per_call(Duration::from_secs(2), || {
            let Some((_, result)) = protocol::result_response(line) else { return };
            let result = Payload::text(result.to_owned());
            black_box((result.shape(), result.json_len()));
            black_box(serde_json::to_vec(&ResultResponse::new(&client_id, &result)).ok());
        });
        println!(
            "relay {name:<15} ({:>5} B):      {:>9} ns   as a tree: {:>8} ns   old/new {:.1}x",
            line.len(),
            text.as_nanos(),
            tree.as_nanos(),
            tree.as_secs_f64() / text.as_secs_f64()
        );
    }
}

/// The `x-mcp-header` check's look-up on a catalog of 1,000 tools, none naming a header (the common case), for the
/// last tool listed.
fn header_schemas() {
    use satellite::model::{Catalog, ToolDef};
    let mut catalog = Catalog::empty();
    catalog.tools = (0..1_000)
        .filter_map(|i| {
            ToolDef::from_listing(&serde_json::json!({"name": format!("tool_{i}"), "description": "Does one thing.",
                "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}))
        })
        .collect();
    let name = "tool_999";
    let new = time_per_call(Duration::from_secs(1), || {
        black_box(catalog.header_schema(black_box(name)));
    });
    let walk = time_per_call(Duration::from_secs(1), || {
        let schema = catalog.tools.iter().find(|t| t.name() == black_box(name)).and_then(|t| t.input_schema_text());
        black_box(schema.filter(|s| s.get().contains("x-mcp-header")));
    });
    println!(
        "header annotations, 1,000 tools:          {:>9} ns   walk: {:>13} ns   old/new {:.1}x",
        new.as_nanos(),
        walk.as_nanos(),
        walk.as_secs_f64() / new.as_secs_f64()
    );
}

fn main() {
    header_schemas();
    results();
    request_ids();
    sessions();
    for users in [10, 1_000, 10_000] {
        tokens(users);
    }
}
