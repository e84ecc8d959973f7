//! ARCHITECTURE.md's invariants that a reading of the code can check, over the production code of `src/` (test
//! modules and test files aside, as `layering_tests` reads it: `source_tests`). Each check fails with the `file:line`
//! of every offender:
//!
//! - the web frameworks (`warp`, `hyper`, `hyper_util`) are named only in `http` and `demo` (its own server);
//! - `sqlx` only in `store`, the only SQL;
//! - `tantivy` and the semantic stage's model crates (`candle_*`, `tokenizers`) only in `search`;
//! - no task is spawned with its handle dropped on the spot (`tokio::spawn(…);`, a runtime handle's `spawn`): a
//!   background task goes on a `TaskTracker` or `JoinSet` that someone waits for, or its `JoinHandle` is kept
//!   (bound to a name or a field) to be awaited or aborted;
//! - no unbounded channel (tokio's or futures' `unbounded*`, `std::sync::mpsc::channel()`);
//! - JSON-RPC envelopes (a `"jsonrpc"` string literal, or JSON text holding one) only in the `mcp` module tree,
//!   whose `protocol` builds and reads them.
//!
//! What breaks a rule on purpose is listed in [`ALLOWED`], each entry with its reason; an entry that no longer
//! matches anything fails too, so the list stays as short as the code allows.

use crate::source_tests::{production, shown, source_files, Line, ModPath};

/// One offence: where, what rule, the line as written.
#[derive(Debug, PartialEq)]
struct Offence {
    rule: Rule,
    file: String,
    line: usize,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Web,
    Sql,
    Search,
    Spawn,
    Unbounded,
    JsonRpc,
}

/// A site that breaks `rule` on purpose: the line of `file` that contains `line`, and why.
struct Allowed {
    rule: Rule,
    file: &'static str,
    line: &'static str,
    why: &'static str,
}

const ALLOWED: &[Allowed] = &[
    Allowed {
        rule: Rule::JsonRpc,
        file: "src/fuzz.rs",
        line: r#"("jsonrpc", jsonrpc)"#,
        why: "the name of the fuzz target of the JSON-RPC decoder, not an envelope",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/http/src/http/exchange/asking.rs",
        line: "tokio::spawn(watch.run(answered, reply));",
        why: "one server request's watcher: it ends when the client answers or the asker stops waiting, whose wait \
              the call's timeout bounds; `Exchange` holds no tracker",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/mcp/src/mcp/transport/stdio/mod.rs",
        line: "tokio::spawn(",
        why: "the transport's own: a child's stdin writer and owner end with the child, which the owner stops once \
              the transport's Drop cancels its `stop` token",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/mcp/src/mcp/transport/sse.rs",
        line: "spawn(",
        why: "the transport's own: its SSE reader ends with its `stop` token (cancelled on Drop), and the cancel \
              notice an abandoned call posts from a Drop with its request timeout; `mcp` sees no tracker",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/mcp/src/mcp/transport/streamable_http/send.rs",
        line: "spawn(async move {",
        why: "the transport's own: the cancel notice an abandoned call posts from a Drop ends with its `stop` token \
              and CANCEL_TIMEOUT",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/mcp/src/mcp/transport/streamable_http/server_stream.rs",
        line: "tokio::spawn(stream.run())",
        why: "the transport's own: the session's GET stream ends with its `stop` token (cancelled on Drop)",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/search/src/search/mod.rs",
        line: "runtime.spawn(run_writer(",
        why: "the index's one writer: it ends when the last `SearchIndex` (its command sender) goes",
    },
    Allowed {
        rule: Rule::Spawn,
        file: "crates/search/src/search/semantic/mod.rs",
        line: "tokio::spawn(task)",
        why: "the embedding task: it ends when the `Semantic` that feeds it goes (its queue closes)",
    },
    Allowed {
        rule: Rule::Unbounded,
        file: "crates/search/src/search/semantic/mod.rs",
        line: "",
        why: "the embedding queue: a tool goes on it once per content hash (`State::queued`), so it holds at most \
              the tools not yet embedded; a bound would drop vectors, not memory",
    },
];

/// Crates and the modules that alone may name them.
const CRATES: &[(Rule, &[&str], &[&str])] = &[
    (Rule::Web, &["warp", "hyper", "hyper_util"], &["http", "demo"]),
    (Rule::Sql, &["sqlx"], &["store"]),
    (Rule::Search, &["tantivy", "candle_core", "candle_nn", "candle_transformers", "tokenizers"], &["search"]),
];

/// The modules that alone may write a JSON-RPC envelope.
const JSON_RPC_HOMES: &[&str] = &["mcp"];

fn ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// The identifier tokens of a line of code, with their byte offsets.
fn tokens(code: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, ch) in code.char_indices().chain([(code.len(), ' ')]) {
        match (ident(ch), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &code[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Whether the line names `krate` as a crate: a path that starts with it (`warp::Filter`, `::warp::x`, `use warp;`,
/// `use {warp, hyper}`), not a field, a method or a later segment of another path (`index.tokenizers()`,
/// `x::hyper`).
fn names_crate(code: &str, krate: &str) -> bool {
    tokens(code).into_iter().any(|(at, token)| {
        if token != krate {
            return false;
        }
        let before = code[..at].trim_end();
        let after = code[at + token.len()..].trim_start();
        let later_segment = before.strip_suffix("::").is_some_and(|b| b.ends_with(|c: char| ident(c) || c == '>'));
        let member = before.ends_with('.') || before.ends_with('\'');
        let last_word = before.rsplit(|c: char| !ident(c)).next().unwrap_or_default();
        let used = last_word == "use" || last_word == "crate" || group(before);
        !later_segment && !member && (after.starts_with("::") || used)
    })
}

/// Whether `before` ends inside a `use` group at the crate level: `use {a, ` before `warp`.
fn group(before: &str) -> bool {
    let Some(open) = before.rfind('{') else { return false };
    before[..open].trim_end().ends_with("use") && !before[open..].contains('}')
}

/// The spawns of `line` whose `JoinHandle` is dropped on the spot. A handle bound to a name (`let x = …`,
/// `x = Some(…)`) or a field (`task: …`) is kept to be awaited or aborted; `let _ =` keeps nothing. `previous`: the
/// code of the line before, for a spawn whose binding is written there. `runtimes`: whether the file holds a tokio
/// runtime or handle, whose `spawn` its `runtime` or `handle` then is (elsewhere those names are other types').
/// `ahead`: this line's code and the next lines', for a spawn that is its block's value (`fn f() -> JoinHandle<()>
/// { tokio::spawn(…) }`), whose handle goes to the caller.
fn bare_spawns(code: &str, previous: &str, ahead: &str, runtimes: bool) -> usize {
    const SPAWNS: &[&str] = &["tokio::spawn(", "tokio::task::spawn(", "task::spawn(", "Handle::current().spawn("];
    const RUNTIME_SPAWNS: &[&str] = &["runtime.spawn(", "handle.spawn("];
    let mut found = 0;
    for (at, _) in code.match_indices("spawn(") {
        let written = &code[..at + "spawn(".len()];
        let runtime = RUNTIME_SPAWNS.iter().filter(|_| runtimes);
        let Some(spawn) = SPAWNS.iter().chain(runtime).find(|s| written.ends_with(*s)) else { continue };
        let start = at + "spawn(".len() - spawn.len();
        if code[..start].ends_with(|c: char| ident(c) || c == ':') {
            continue;
        }
        let before = match code[..start].trim() {
            "" => previous.trim(),
            before => before,
        };
        let before = before.strip_suffix("Some(").map_or(before, str::trim_end);
        let bound = (before.ends_with('=') && !before.ends_with("==") && !before.ends_with("_ ="))
            || (before.ends_with(':') && !before.ends_with("::"));
        if !bound && !block_value(&ahead[at + "spawn".len()..]) {
            found += 1;
        }
    }
    found
}

/// Whether the call whose arguments open `call` (at its `(`) ends its block without a `;`: the block's value.
fn block_value(call: &str) -> bool {
    let mut depth = 0usize;
    for (i, ch) in call.char_indices() {
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return call[i + 1..].trim_start().starts_with('}');
                }
            }
            _ => {}
        }
    }
    false
}

/// Whether `line` makes or names an unbounded channel.
fn unbounded(code: &str) -> bool {
    tokens(code).iter().any(|(_, token)| {
        matches!(*token, "unbounded" | "unbounded_channel" | "UnboundedSender" | "UnboundedReceiver")
            || token.starts_with("UnboundedReceiver")
    }) || code.contains("mpsc::channel()")
        || (code.contains("mpsc::channel::<")
            && code.split("mpsc::channel::<").nth(1).is_some_and(|rest| rest.contains(">()")))
}

/// Whether a string literal is, or holds, the `"jsonrpc"` member of an envelope.
fn json_rpc(literal: &str) -> bool {
    literal == "jsonrpc" || literal.contains("\"jsonrpc\"") || literal.contains("\\\"jsonrpc\\\"")
}

fn within(me: &ModPath, homes: &[&str]) -> bool {
    homes.iter().any(|home| me.first().is_some_and(|first| first == home))
}

/// Every offence of one file (module `me`, shown as `file`).
fn offences(me: &ModPath, file: &str, lines: &[Line]) -> Vec<Offence> {
    let runtimes = lines.iter().any(|l| l.code.contains("runtime::Handle") || l.code.contains("runtime::Runtime"));
    let mut out = Vec::new();
    let mut offend = |rule: Rule, line: &Line| {
        out.push(Offence { rule, file: file.to_owned(), line: line.number, text: line.raw.clone() });
    };
    for (n, line) in lines.iter().enumerate() {
        let code = line.code.as_str();
        for (rule, crates, homes) in CRATES {
            if !within(me, homes) && crates.iter().any(|krate| names_crate(code, krate)) {
                offend(*rule, line);
            }
        }
        let previous = n.checked_sub(1).map_or("", |p| lines[p].code.as_str());
        let ahead: Vec<&str> = lines[n..lines.len().min(n + 40)].iter().map(|l| l.code.as_str()).collect();
        for _ in 0..bare_spawns(code, previous, &ahead.join("\n"), runtimes) {
            offend(Rule::Spawn, line);
        }
        if unbounded(code) {
            offend(Rule::Unbounded, line);
        }
        if !within(me, JSON_RPC_HOMES) && line.strings.iter().any(|s| json_rpc(s)) {
            offend(Rule::JsonRpc, line);
        }
    }
    out
}

#[test]
fn the_code_keeps_the_architecture_invariants() {
    let mut found = Vec::new();
    for (me, path) in source_files() {
        let text = std::fs::read_to_string(&path).expect("source is readable");
        found.extend(offences(&me, &shown(&path), &production(&text)));
    }
    let mut used = vec![false; ALLOWED.len()];
    let mut problems: Vec<String> = found
        .into_iter()
        .filter(|offence| {
            let allowed = ALLOWED
                .iter()
                .position(|a| a.rule == offence.rule && a.file == offence.file && offence.text.contains(a.line));
            if let Some(i) = allowed {
                used[i] = true;
            }
            allowed.is_none()
        })
        .map(|o| format!("{}:{}: {}: {}", o.file, o.line, message(o.rule), o.text))
        .collect();
    for (allowed, used) in ALLOWED.iter().zip(used) {
        if !used {
            problems.push(format!(
                "{}: the allow-list entry for {:?} ({:?}) matches nothing; remove it",
                allowed.file, allowed.rule, allowed.line
            ));
        }
    }
    assert!(ALLOWED.iter().all(|a| !a.why.is_empty()), "every allow-list entry says why");
    assert!(problems.is_empty(), "ARCHITECTURE.md's invariants are broken:\n{}", problems.join("\n"));
}

fn message(rule: Rule) -> &'static str {
    match rule {
        Rule::Web => "only `http` and `demo` use warp and hyper",
        Rule::Sql => "only `store` uses sqlx",
        Rule::Search => "only `search` uses tantivy and the semantic stage's model crates",
        Rule::Spawn => {
            "a task spawned with its handle dropped: spawn it on a TaskTracker or JoinSet, or keep its JoinHandle"
        }
        Rule::Unbounded => "an unbounded channel: give it a capacity and decide what a full one does",
        Rule::JsonRpc => "a JSON-RPC envelope outside `mcp`: build or read it with `mcp::protocol`",
    }
}

/// The checks themselves, on lines that break each rule and lines that only look as if they did.
#[test]
fn the_checks_tell_offences_from_lookalikes() {
    let check = |module: &str, text: &str| -> Vec<(Rule, usize)> {
        let me: ModPath = module.split("::").map(str::to_owned).collect();
        offences(&me, "f.rs", &production(text)).into_iter().map(|o| (o.rule, o.line)).collect()
    };
    let web = "use warp::Filter;\nlet x = hyper::StatusCode::OK;\nuse {serde, hyper_util};\n\
               let a = \"warp::x\"; // hyper::y\nself.warp.go(); x::hyper::y(); fn hyper() {}\n";
    assert_eq!(check("router", web), [(Rule::Web, 1), (Rule::Web, 2), (Rule::Web, 3)]);
    assert_eq!(check("http::sse", web), []);
    assert_eq!(check("demo::http", web), []);
    assert_eq!(check("events", "sqlx::query(\"x\").execute(p).await?;\n"), [(Rule::Sql, 1)]);
    assert_eq!(check("store::sql", "sqlx::query(\"x\").execute(p).await?;\n"), []);
    assert_eq!(check("app", "use tantivy::Index;\nindex.tokenizers().get(\"x\");\n"), [(Rule::Search, 1)]);
    let spawns = "tokio::spawn(a);\nlet h = tokio::spawn(b);\nx = Some(tokio::spawn(c));\nlet _ = tokio::spawn(d);\n\
                  runtime.spawn(e);\ntracker.spawn(f);\nset.spawn(g);\nlet t =\n    tokio::task::spawn(h);\n\
                  S { task: tokio::spawn(i) };\nfoo(tokio::spawn(j));\nStdioTransport::spawn(k);\n\
                  fn l() -> JoinHandle<()> {\n    tokio::spawn(\n        l(),\n    )\n}\n";
    assert_eq!(
        check("app", &format!("let runtime = tokio::runtime::Handle::current();\n{spawns}")),
        [(Rule::Spawn, 2), (Rule::Spawn, 5), (Rule::Spawn, 6), (Rule::Spawn, 12)],
        "bound handles are kept; trackers, join sets and other `spawn`s are not tokio's"
    );
    assert_eq!(check("app", spawns).len(), 3, "a `runtime` that is no tokio runtime has a `spawn` of its own");
    let channels = "let (tx, rx) = mpsc::unbounded_channel();\nlet (a, b) = mpsc::channel(8);\n\
                    let (c, d) = std::sync::mpsc::channel();\nfn f(x: UnboundedReceiver<u8>) {}\n\
                    let (e, f) = futures::channel::mpsc::unbounded();\nlet (g, h) = std::sync::mpsc::sync_channel(1);\n";
    let unbounded: Vec<usize> = check("app", channels).into_iter().map(|(_, line)| line).collect();
    assert_eq!(unbounded, [1, 3, 4, 5]);
    let envelopes = "let m = json!({\"jsonrpc\": \"2.0\", \"method\": m});\nlet t = r#\"{\"jsonrpc\":\"2.0\"}\"#;\n\
                     let e = \"{\\\"jsonrpc\\\":1}\";\nlet n = \"jsonrpc-ish\"; // \"jsonrpc\"\n\
                     #[cfg(test)]\nmod tests { fn t() { json!({\"jsonrpc\": \"2.0\"}); } }\n";
    assert_eq!(check("instances", envelopes), [(Rule::JsonRpc, 1), (Rule::JsonRpc, 2), (Rule::JsonRpc, 3)]);
    assert_eq!(check("mcp::protocol", envelopes), []);
}
