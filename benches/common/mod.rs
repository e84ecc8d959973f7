//! Measurement shared by the benchmarks: run `calls` operations over
//! `concurrency` workers after a warm-up, report throughput and latency.

#![allow(dead_code)]

pub mod pipe;
pub mod process;

use std::future::Future;
use std::time::Instant;

pub struct Figures {
    pub per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

pub async fn measure<F, Fut>(warmup: usize, calls: usize, concurrency: usize, op: F) -> Figures
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    for i in 0..warmup {
        op(i).await;
    }
    let per_worker = calls / concurrency;
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_worker);
                for i in 0..per_worker {
                    let t = Instant::now();
                    op(w * per_worker + i).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(calls);
    for worker in workers {
        latencies.extend(worker.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e6;
    Figures { per_sec: latencies.len() as f64 / elapsed.as_secs_f64(), p50_us: pct(0.50), p99_us: pct(0.99) }
}

pub fn row(label: &str, concurrency: usize, f: &Figures) {
    println!("{label:<40} {concurrency:>4} {:>10.0} {:>10.1} {:>10.1}", f.per_sec, f.p50_us, f.p99_us);
}

pub fn header() {
    println!("{:<40} {:>4} {:>10} {:>10} {:>10}", "operation", "c", "req/s", "p50 us", "p99 us");
}
