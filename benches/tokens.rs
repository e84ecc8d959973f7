//! Token counting (SB §15) over every tool of the shared corpus, single-threaded: the time to build the
//! `o200k_base` encoder once, then MB/s of tool JSON (the text `tokens::tool_text` prints) counted three ways:
//! `count_catalog` per server (what discovery runs), `count_tool` per tool, and `count_text` of text printed
//! beforehand. Run with `cargo bench --bench tokens` (needs ../shared/data/toolsearch).
//!
//! Figures are per wall-clock second and per second of this thread's CPU time: on a shared machine the second
//! is what the code costs, the first also counts the time other processes held the core.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use satellite::model::catalog::ToolDef;
use satellite::tokens::{tool_text, Counter};
use serde_json::Value;

/// Passes over the corpus after one warm-up pass; at least this long in total.
const MIN_PASSES: usize = 3;
const MIN_TIME: Duration = Duration::from_secs(3);

fn main() {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/toolsearch/corpus.jsonl");
    let corpus_text = std::fs::read_to_string(&corpus).expect("corpus (../shared/data/toolsearch/corpus.jsonl)");
    let tools: Vec<(String, String, Value)> = corpus_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("corpus line");
            let name = v["name"].as_str().expect("name").to_owned();
            let description = v["description"].as_str().unwrap_or("").to_owned();
            (name, description, v["inputSchema"].clone())
        })
        .collect();

    let started = Instant::now();
    let counter = Counter::o200k_base().expect("o200k_base");
    let build = started.elapsed();

    let texts: Vec<String> = tools.iter().map(|(n, d, s)| tool_text(n, Some(d), s)).collect();
    let bytes: usize = texts.iter().map(String::len).sum();
    let total_tokens: usize = texts.iter().map(|t| counter.count_text(t)).sum();

    // The corpus as catalogs, one per server, as discovery produces them.
    let mut catalogs: Vec<Vec<Value>> = Vec::new();
    let mut last_server = String::new();
    for line in corpus_text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("corpus line");
        let server = v["server"].as_str().unwrap_or("").to_owned();
        if catalogs.is_empty() || server != last_server {
            catalogs.push(Vec::new());
            last_server = server;
        }
        if let Some(catalog) = catalogs.last_mut() {
            catalog.push(v);
        }
    }
    // One listing per server, as discovery makes them.
    let catalogs: Vec<Vec<ToolDef>> = catalogs.into_iter().map(ToolDef::listing).collect();

    let per_catalog = passes(|| catalogs.iter().map(|c| counter.count_catalog(c).iter().sum::<usize>()).sum());
    let count_only = passes(|| texts.iter().map(|t| counter.count_text(t)).sum::<usize>());
    let with_text = passes(|| tools.iter().map(|(n, d, s)| counter.count_tool(n, Some(d), s)).sum::<usize>());

    let mb = bytes as f64 / 1e6;
    println!("corpus: {} tools, {:.2} MB of tool JSON, {} tokens", tools.len(), mb, total_tokens);
    println!("{:<44} {:>10.1} ms", "build o200k_base encoder (once)", build.as_secs_f64() * 1e3);
    println!("{:<44} {:>10} {:>10} {:>10} {:>10}", "single thread", "wall ms", "wall MB/s", "cpu MB/s", "tools/s");
    let rows = [
        ("count_catalog, one per server (print + count)", per_catalog),
        ("count_tool each (print + count)", with_text),
        ("count_text each (tool JSON already printed)", count_only),
    ];
    for (label, (wall, cpu)) in rows {
        println!(
            "{label:<44} {:>10.1} {:>10.1} {:>10.1} {:>10.0}",
            wall.as_secs_f64() * 1e3,
            mb / wall.as_secs_f64(),
            mb / cpu.as_secs_f64(),
            tools.len() as f64 / wall.as_secs_f64()
        );
    }
}

/// Mean wall and CPU time of one pass, after a warm-up pass.
fn passes(mut pass: impl FnMut() -> usize) -> (Duration, Duration) {
    std::hint::black_box(pass());
    let started = Instant::now();
    let cpu_started = thread_cpu();
    let mut n = 0;
    while n < MIN_PASSES || started.elapsed() < MIN_TIME {
        std::hint::black_box(pass());
        n += 1;
    }
    (started.elapsed() / n as u32, (thread_cpu() - cpu_started) / n as u32)
}

/// User + system CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage");
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}
