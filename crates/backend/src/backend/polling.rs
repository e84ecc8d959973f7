//! The command-poll cadence (BP §4.4): the backend's hint clamped to
//! 2-300 s, a mode table when the hint is missing, doubling backoff to
//! 300 s on failure, reset by the first success.

use std::time::Duration;

pub const MIN_DELAY: Duration = Duration::from_secs(2);
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// How the last poll went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    /// 2xx with the backend's `polling_mode` and `next_poll_interval` (either may be missing or odd).
    Ok { mode: Option<String>, hint_seconds: Option<i64> },
    /// Network error, timeout, non-2xx, bad JSON.
    Failed,
}

/// The wait before the next poll. `idle` is `DEPLOYSTACK_BACKEND_POLLING_INTERVAL` (default 60 s).
pub fn next_delay(outcome: &PollOutcome, previous: Duration, idle: Duration) -> Duration {
    match outcome {
        PollOutcome::Ok { hint_seconds: Some(n), .. } if *n > 0 => {
            Duration::from_secs(*n as u64).clamp(MIN_DELAY, MAX_DELAY)
        }
        PollOutcome::Ok { mode, .. } => match mode.as_deref() {
            Some("immediate") => MIN_DELAY,
            Some("high") => Duration::from_secs(10),
            Some("normal") => Duration::from_secs(30),
            _ => idle.clamp(MIN_DELAY, MAX_DELAY),
        },
        PollOutcome::Failed => (previous.max(MIN_DELAY) * 2).min(MAX_DELAY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(60);

    fn ok(mode: Option<&str>, hint: Option<i64>) -> PollOutcome {
        PollOutcome::Ok { mode: mode.map(str::to_owned), hint_seconds: hint }
    }

    #[test]
    fn the_hint_wins_clamped_to_two_and_three_hundred_seconds() {
        let prev = Duration::from_secs(60);
        assert_eq!(next_delay(&ok(Some("immediate"), Some(2)), prev, IDLE), Duration::from_secs(2));
        assert_eq!(next_delay(&ok(Some("normal"), Some(10)), prev, IDLE), Duration::from_secs(10));
        assert_eq!(next_delay(&ok(Some("normal"), Some(30)), prev, IDLE), Duration::from_secs(30));
        assert_eq!(next_delay(&ok(Some("slow"), Some(60)), prev, IDLE), Duration::from_secs(60));
        assert_eq!(next_delay(&ok(None, Some(1)), prev, IDLE), MIN_DELAY);
        assert_eq!(next_delay(&ok(None, Some(9_999)), prev, IDLE), MAX_DELAY);
    }

    #[test]
    fn without_a_hint_the_mode_decides_and_unknown_modes_are_idle() {
        let prev = Duration::from_secs(60);
        assert_eq!(next_delay(&ok(Some("immediate"), None), prev, IDLE), Duration::from_secs(2));
        assert_eq!(next_delay(&ok(Some("high"), Some(0)), prev, IDLE), Duration::from_secs(10));
        assert_eq!(next_delay(&ok(Some("normal"), Some(-5)), prev, IDLE), Duration::from_secs(30));
        assert_eq!(next_delay(&ok(Some("error"), None), prev, IDLE), IDLE);
        assert_eq!(next_delay(&ok(Some("party"), None), prev, IDLE), IDLE);
        assert_eq!(next_delay(&ok(None, None), prev, Duration::from_secs(15)), Duration::from_secs(15));
    }

    #[test]
    fn failures_double_to_five_minutes_and_a_success_resets() {
        let mut delay = Duration::from_secs(2);
        let mut seen = Vec::new();
        for _ in 0..9 {
            delay = next_delay(&PollOutcome::Failed, delay, IDLE);
            seen.push(delay.as_secs());
        }
        assert_eq!(seen, [4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(next_delay(&ok(Some("immediate"), Some(2)), delay, IDLE), Duration::from_secs(2));
    }
}
