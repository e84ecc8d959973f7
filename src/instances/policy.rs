//! Pure decisions of the supervisor: the crash window and restart backoff
//! (SB §9.7), which remote failures are retried (SB §11.1), and the recovery
//! probe's backoff. Clock values come from the caller, so tests need no waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::mcp::transport::UpstreamError;

/// Crashes are counted over this window.
pub const CRASH_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Automatic restarts allowed within the window; the next crash is permanent failure.
pub const MAX_AUTO_RESTARTS: u32 = 3;
/// A process that ran this long is restarted at once.
pub const LONG_RUN: Duration = Duration::from_secs(60);
/// Waits between the attempts of a remote call (SB §11.1): three attempts in all.
pub const REMOTE_RETRY_WAITS: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1000)];
const PROBE_FIRST: Duration = Duration::from_secs(1);
const PROBE_MAX: Duration = Duration::from_secs(30);

/// Crash times of one instance within the window.
#[derive(Debug, Default)]
pub struct CrashWindow {
    times: VecDeque<Instant>,
}

impl CrashWindow {
    /// Record a crash at `now`; returns the crashes within the window, this one included.
    pub fn record(&mut self, now: Instant) -> u32 {
        self.times.push_back(now);
        while self.times.front().is_some_and(|t| now.duration_since(*t) >= CRASH_WINDOW) {
            self.times.pop_front();
        }
        self.times.len() as u32
    }

    /// A manual restart or a new config starts over.
    pub fn clear(&mut self) {
        self.times.clear();
    }

    pub fn len(&self) -> usize {
        self.times.len()
    }

    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }
}

/// What follows a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashDecision {
    Restart { after: Duration, attempt: u32 },
    GiveUp { crashes: u32 },
}

/// SB §9.7: up to three restarts within the window, waiting by the backoff list unless the process had run
/// for over a minute; the fourth crash gives up.
pub fn after_crash(crashes: u32, uptime: Duration, backoff: &[Duration]) -> CrashDecision {
    if crashes > MAX_AUTO_RESTARTS {
        return CrashDecision::GiveUp { crashes };
    }
    let after = if uptime > LONG_RUN {
        Duration::ZERO
    } else {
        let index = (crashes.saturating_sub(1) as usize).min(backoff.len().saturating_sub(1));
        backoff.get(index).copied().unwrap_or_default()
    };
    CrashDecision::Restart { after, attempt: crashes }
}

/// Whether a failed remote call is worth another attempt: only when the server could not be reached.
pub fn retryable(err: &UpstreamError) -> bool {
    matches!(err, UpstreamError::Connect(_))
}

/// Whether an error says the instance itself failed, as opposed to the tool refusing the request.
pub fn instance_failure(err: &UpstreamError) -> bool {
    !matches!(err, UpstreamError::Rpc(_))
}

/// Wait before recovery probe number `attempt` (0-based): 1 s, doubling, at most 30 s.
pub fn probe_wait(attempt: u32) -> Duration {
    PROBE_FIRST.saturating_mul(1u32 << attempt.min(8)).min(PROBE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Vec<Duration> {
        vec![Duration::from_secs(1), Duration::from_secs(5), Duration::from_secs(15)]
    }

    #[test]
    fn three_restarts_then_the_fourth_crash_in_five_minutes_gives_up() {
        let mut window = CrashWindow::default();
        let t0 = Instant::now();
        let short = Duration::from_secs(2);
        let mut decisions = Vec::new();
        for i in 0..4 {
            let n = window.record(t0 + Duration::from_secs(10 * i));
            decisions.push(after_crash(n, short, &backoff()));
        }
        assert_eq!(
            decisions,
            [
                CrashDecision::Restart { after: Duration::from_secs(1), attempt: 1 },
                CrashDecision::Restart { after: Duration::from_secs(5), attempt: 2 },
                CrashDecision::Restart { after: Duration::from_secs(15), attempt: 3 },
                CrashDecision::GiveUp { crashes: 4 },
            ]
        );
    }

    #[test]
    fn crashes_older_than_the_window_are_forgotten() {
        let mut window = CrashWindow::default();
        let t0 = Instant::now();
        for i in 0..3 {
            window.record(t0 + Duration::from_secs(i));
        }
        // Five minutes after the first crash, only the later ones count.
        assert_eq!(window.record(t0 + CRASH_WINDOW + Duration::from_secs(1)), 2);
        window.clear();
        assert!(window.is_empty());
    }

    #[test]
    fn a_long_run_restarts_at_once() {
        assert_eq!(
            after_crash(2, Duration::from_secs(61), &backoff()),
            CrashDecision::Restart { after: Duration::ZERO, attempt: 2 }
        );
    }

    #[test]
    fn only_unreachable_servers_are_retried() {
        assert!(retryable(&UpstreamError::Connect("connection refused".into())));
        assert!(!retryable(&UpstreamError::HttpStatus { status: 401, body: String::new() }));
        assert!(!retryable(&UpstreamError::HttpStatus { status: 500, body: String::new() }));
        assert!(!retryable(&UpstreamError::Rpc(crate::mcp::protocol::RpcError::new(-32000, "tool said no"))));
        assert!(!instance_failure(&UpstreamError::Rpc(crate::mcp::protocol::RpcError::new(-32000, "x"))));
        assert!(instance_failure(&UpstreamError::Closed("gone".into())));
    }

    #[test]
    fn probes_back_off_to_thirty_seconds() {
        let waits: Vec<u64> = (0..8).map(|a| probe_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
