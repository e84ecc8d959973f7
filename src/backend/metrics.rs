//! The satellite's own CPU and memory for the heartbeat (BP §3.2), read from
//! `/proc/self`: CPU % is process CPU time over wall time since the last
//! sample, RSS in MB.

use std::time::{Duration, Instant};

/// Clock ticks per second of `/proc/self/stat` times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const CLOCK_TICKS: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_usage_percent: f64,
    pub memory_usage_mb: u64,
    pub uptime_seconds: u64,
}

/// Samples CPU between successive calls.
#[derive(Debug)]
pub struct ProcessMetrics {
    started: Instant,
    last: Option<(Instant, f64)>,
}

impl ProcessMetrics {
    pub fn new(started: Instant) -> Self {
        Self { started, last: None }
    }

    pub fn sample(&mut self) -> Sample {
        let now = Instant::now();
        let cpu_seconds = cpu_seconds().unwrap_or(0.0);
        let (since, before) = self.last.unwrap_or((self.started, 0.0));
        let wall = now.duration_since(since).max(Duration::from_millis(1)).as_secs_f64();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let percent = ((cpu_seconds - before).max(0.0) / wall / cores * 100.0).clamp(0.0, 100.0);
        self.last = Some((now, cpu_seconds));
        Sample {
            cpu_usage_percent: (percent * 100.0).round() / 100.0,
            memory_usage_mb: rss_bytes().unwrap_or(0) / (1024 * 1024),
            uptime_seconds: now.duration_since(self.started).as_secs(),
        }
    }
}

/// utime + stime of this process, in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS)
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_shows_cpu_and_memory_is_nonzero() {
        let mut metrics = ProcessMetrics::new(Instant::now());
        metrics.sample();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(200) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let s = metrics.sample();
        assert!(s.cpu_usage_percent > 0.0, "{s:?}");
        assert!(s.cpu_usage_percent <= 100.0);
        assert!(s.memory_usage_mb > 0, "{s:?}");
    }
}
