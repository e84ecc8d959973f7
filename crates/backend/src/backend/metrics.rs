//! The satellite's own CPU and memory for the heartbeat (BP §3.2), read from
//! `/proc/self`: CPU % is process CPU time over wall time since the last
//! sample, RSS in MB.

use std::time::{Duration, Instant};

use nix::unistd::{sysconf, SysconfVar};

/// Clock ticks per second of `/proc/self/stat` times, as the kernel says (`sysconf(_SC_CLK_TCK)`).
fn clock_ticks() -> f64 {
    sysconf(SysconfVar::CLK_TCK).ok().flatten().filter(|t| *t > 0).map_or(100.0, |t| t as f64)
}

/// Bytes per page of `/proc/self/statm`, as the kernel says: 4 KiB on most machines, 16 or 64 KiB on some arm64
/// and ppc64 kernels.
fn page_bytes() -> u64 {
    sysconf(SysconfVar::PAGE_SIZE).ok().flatten().filter(|p| *p > 0).map_or(4096, |p| p as u64)
}

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
    Some((utime + stime) / clock_ticks())
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RSS and CPU time agree with what the kernel reports in its own units (kB, and `getrusage`), whatever
    /// the page size and clock tick of the machine.
    #[test]
    fn rss_and_cpu_time_agree_with_the_kernels_own_units() -> Result<(), Box<dyn std::error::Error>> {
        let vm_rss_kb = || -> Result<u64, Box<dyn std::error::Error>> {
            let status = std::fs::read_to_string("/proc/self/status")?;
            let kb = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok());
            Ok(kb.ok_or("no VmRSS line in /proc/self/status")?)
        };
        // Other tests of this binary allocate meanwhile: our reading must fall between the kernel's own
        // readings just before and just after it (with 10% slack), not equal one taken at another moment.
        let before = vm_rss_kb()?;
        let ours_kb = rss_bytes().ok_or("no RSS from statm")? / 1024;
        let after = vm_rss_kb()?;
        let (low, high) = (before.min(after), before.max(after));
        assert!(
            ours_kb * 10 >= low * 9 && ours_kb * 10 <= high * 11,
            "statm pages {ours_kb} kB vs VmRSS {before}..{after} kB"
        );
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(300) {
            std::hint::black_box(0u64.wrapping_add(1));
        }
        let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
        let rusage = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        let kernel = rusage(usage.user_time()) + rusage(usage.system_time());
        let ours = cpu_seconds().ok_or("no CPU time from stat")?;
        assert!((ours - kernel).abs() < 0.2 + kernel * 0.1, "stat {ours}s vs getrusage {kernel}s");
        Ok(())
    }

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
