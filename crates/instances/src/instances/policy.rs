//! Pure decisions of the supervisor: the crash window and restart backoff
//! (SB §9.7), which remote failures are retried (SB §11.1), and the recovery
//! probe's backoff. Clock values come from the caller, so tests need no waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::mcp::transport::{ExitInfo, UpstreamError};

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

/// What a failed upstream request says about the instance: the one classification behind the retry of remote
/// calls and the status change after a failed call. Only the loss of the connection or the process changes an
/// instance's status; a slow, malformed or refused answer fails that one call (SB §11, issue: full fidelity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The server answered, slowly, wrongly or with a refusal: that call fails, the instance is fine.
    Call,
    /// The server could not be reached: a remote call is tried again (SB §11.1), then the instance is offline.
    Unreachable,
    /// The connection or the process is gone, or the credentials were refused: the instance's status changes.
    Instance,
}

pub fn blame(err: &UpstreamError) -> Blame {
    match err {
        UpstreamError::Rpc(_) | UpstreamError::Timeout { .. } | UpstreamError::Protocol(_) => Blame::Call,
        UpstreamError::HttpStatus { status: 401 | 403 | 404, .. } => Blame::Instance,
        UpstreamError::HttpStatus { .. } => Blame::Call,
        UpstreamError::Connect(_) => Blame::Unreachable,
        UpstreamError::Exited { .. }
        | UpstreamError::Closed(_)
        | UpstreamError::Spawn { .. }
        | UpstreamError::Refused(_)
        | UpstreamError::AtCapacity(_)
        | UpstreamError::Deployment { .. }
        | UpstreamError::OAuth(_)
        | UpstreamError::Io(_) => Blame::Instance,
    }
}

/// A stdio child that could not be spawned, died before its handshake finished or never answered `initialize`
/// is a crash, with its exit code and signal when the transport saw them; any other connect failure is not.
pub fn handshake_crash(err: &UpstreamError) -> Option<(Option<i32>, Option<i32>)> {
    match err {
        // A child that stays silent (an `npx` fetching its package past the handshake timeout on a first start, a
        // server waiting on something that comes later) was terminated when the timeout struck: retried under the
        // restart policy like a crash, not left offline until someone restarts it.
        UpstreamError::Timeout { method, .. } if method == "initialize" => Some((None, None)),
        UpstreamError::Exited { exit: ExitInfo::Exited { code, signal }, .. } => Some((*code, *signal)),
        UpstreamError::Exited { exit: ExitInfo::Stopped, .. } | UpstreamError::Closed(_) => Some((None, None)),
        // A spawn that failed (the binary missing for a moment during an upgrade, no descriptors left) is a
        // crash too: retried under the restart policy, never a terminal error on its own.
        UpstreamError::Spawn { .. } => Some((None, None)),
        _ => None,
    }
}

/// Whether a failed request says the server refuses this user's credentials (BP §6.2): HTTP 401/403, no
/// OAuth token, or a JSON-RPC error whose message names authentication (the reference's word list).
pub fn refuses_credentials(err: &UpstreamError) -> bool {
    match err {
        UpstreamError::HttpStatus { status: 401 | 403, .. } | UpstreamError::OAuth(_) => true,
        UpstreamError::Rpc(rpc) => {
            let message = rpc.message.to_ascii_lowercase();
            ["auth", "unauthorized", "forbidden", "token", "credentials"].iter().any(|w| message.contains(w))
        }
        _ => false,
    }
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

    /// Retries and status changes follow the error's variant, whatever its message says.
    #[test]
    fn failures_are_blamed_by_variant_not_by_wording() {
        use crate::mcp::protocol::RpcError;
        assert_eq!(blame(&UpstreamError::Connect("HTTP 401 token refused".into())), Blame::Unreachable);
        assert_eq!(
            blame(&UpstreamError::HttpStatus { status: 401, body: "connection refused".into() }),
            Blame::Instance
        );
        assert_eq!(blame(&UpstreamError::HttpStatus { status: 500, body: "connection lost".into() }), Blame::Call);
        assert_eq!(blame(&UpstreamError::Rpc(RpcError::new(-32000, "connection refused, process died"))), Blame::Call);
        assert_eq!(blame(&UpstreamError::Closed("gone".into())), Blame::Instance);
        assert_eq!(blame(&UpstreamError::Io("reset".into())), Blame::Instance);
    }

    /// A slow or malformed answer is the call's failure, never the server's.
    #[test]
    fn slow_and_malformed_answers_fail_the_call_only() {
        assert_eq!(blame(&UpstreamError::Timeout { method: "tools/call".into(), after: Duration::ZERO }), Blame::Call);
        assert_eq!(blame(&UpstreamError::Protocol("process exited; invalid json reply".into())), Blame::Call);
    }

    /// A death during the handshake is a crash (and so restarted under the policy) by variant; a refusal or a
    /// protocol error that mentions an exit code is not.
    #[test]
    fn handshake_deaths_are_crashes_by_variant() {
        let died = UpstreamError::Exited {
            label: "p".into(),
            exit: ExitInfo::Exited { code: Some(2), signal: None },
            detail: Some("last stderr line: bye".into()),
        };
        assert_eq!(handshake_crash(&died), Some((Some(2), None)));
        let killed = UpstreamError::Exited {
            label: "p".into(),
            exit: ExitInfo::Exited { code: None, signal: Some(9) },
            detail: None,
        };
        assert_eq!(handshake_crash(&killed), Some((None, Some(9))));
        assert_eq!(handshake_crash(&UpstreamError::Closed("stdout closed".into())), Some((None, None)));
        assert_eq!(handshake_crash(&UpstreamError::Protocol("child process has died (exit code 2)".into())), None);
        assert_eq!(handshake_crash(&UpstreamError::Refused("exit code 2".into())), None);
        let missing = UpstreamError::Spawn {
            program: "/opt/mcp/server".into(),
            kind: std::io::ErrorKind::NotFound,
            message: "No such file or directory".into(),
            detail: None,
        };
        assert_eq!(handshake_crash(&missing), Some((None, None)), "a failed spawn is retried like a crash");
        let silent = UpstreamError::Timeout { method: "initialize".into(), after: Duration::from_secs(30) };
        assert_eq!(handshake_crash(&silent), Some((None, None)), "a silent child is retried like a crash");
        let slow_call = UpstreamError::Timeout { method: "tools/list".into(), after: Duration::from_secs(30) };
        assert_eq!(handshake_crash(&slow_call), None);
    }

    /// Credential refusals are recognised by variant; for a server's own JSON-RPC error the reference's word
    /// list applies to the server's message, never to one the satellite wrote.
    #[test]
    fn credential_refusals_by_variant() {
        use crate::mcp::protocol::RpcError;
        assert!(refuses_credentials(&UpstreamError::HttpStatus { status: 401, body: String::new() }));
        assert!(refuses_credentials(&UpstreamError::HttpStatus { status: 403, body: "fine".into() }));
        assert!(refuses_credentials(&UpstreamError::OAuth("re-authorize in the dashboard".into())));
        assert!(refuses_credentials(&UpstreamError::Rpc(RpcError::new(-32000, "Unauthorized: bad API key"))));
        assert!(!refuses_credentials(&UpstreamError::Connect("401 auth token credentials".into())));
        assert!(!refuses_credentials(&UpstreamError::HttpStatus { status: 500, body: "auth backend down".into() }));
        assert!(!refuses_credentials(&UpstreamError::Timeout { method: "auth/token".into(), after: Duration::ZERO }));
    }

    #[test]
    fn probes_back_off_to_thirty_seconds() {
        let waits: Vec<u64> = (0..8).map(|a| probe_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
