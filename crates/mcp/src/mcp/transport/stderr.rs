//! The stderr pipeline of a stdio child (SB §9.6): a per-process sliding
//! one-second rate limit, line truncation and the level of a line. Pure and
//! clock-driven by the caller, so it is tested without waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Limits for one process's stderr.
#[derive(Debug, Clone, PartialEq)]
pub struct StderrSettings {
    /// Lines accepted per sliding second; more are dropped and counted.
    pub per_second: u32,
    /// Longer lines are cut and suffixed `... [truncated]`.
    pub max_line_bytes: usize,
    /// At most one drop warning per this interval.
    pub warning_interval: Duration,
}

impl Default for StderrSettings {
    fn default() -> Self {
        Self { per_second: 20, max_line_bytes: 1024, warning_interval: Duration::from_secs(60) }
    }
}

/// What to do with one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep(String),
    Drop,
    /// Keep nothing, and report that `dropped` lines were dropped since the last warning.
    DropAndWarn {
        dropped: u64,
    },
}

/// Per-process limiter state.
#[derive(Debug)]
pub struct StderrLimiter {
    settings: StderrSettings,
    window: VecDeque<Instant>,
    dropped_since_warning: u64,
    dropped_total: u64,
    last_warning: Option<Instant>,
}

impl StderrLimiter {
    pub fn new(settings: StderrSettings) -> Self {
        Self { settings, window: VecDeque::new(), dropped_since_warning: 0, dropped_total: 0, last_warning: None }
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// Decide on a line that arrived at `now`.
    pub fn admit(&mut self, line: &str, now: Instant) -> Verdict {
        while self.window.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
            self.window.pop_front();
        }
        if self.window.len() < self.settings.per_second as usize {
            self.window.push_back(now);
            return Verdict::Keep(truncate(line, self.settings.max_line_bytes));
        }
        self.dropped_since_warning += 1;
        self.dropped_total += 1;
        let due = self.last_warning.is_none_or(|t| now.duration_since(t) >= self.settings.warning_interval);
        if due {
            self.last_warning = Some(now);
            let dropped = std::mem::take(&mut self.dropped_since_warning);
            return Verdict::DropAndWarn { dropped };
        }
        Verdict::Drop
    }
}

/// Cut a line to `max` bytes on a character boundary, marking the cut.
pub fn truncate(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_owned();
    }
    let mut cut = max;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... [truncated]", &line[..cut])
}

/// The level of a stderr line (SB §9.6 step 3).
pub fn level_of(line: &str) -> &'static str {
    let lower = line.to_ascii_lowercase();
    if ["error", "fatal", "exception", "failed"].iter().any(|w| lower.contains(w)) {
        "error"
    } else if lower.contains("warn") {
        "warn"
    } else if lower.contains("debug") || lower.contains("trace") {
        "debug"
    } else {
        "info"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: u32) -> StderrLimiter {
        StderrLimiter::new(StderrSettings { per_second, max_line_bytes: 8, warning_interval: Duration::from_secs(60) })
    }

    #[test]
    fn a_sliding_second_admits_the_limit_and_counts_the_rest() {
        let mut l = limiter(3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(l.admit("x", t0 + Duration::from_millis(i)), Verdict::Keep("x".into()));
        }
        assert_eq!(l.admit("x", t0 + Duration::from_millis(10)), Verdict::DropAndWarn { dropped: 1 });
        assert_eq!(l.admit("x", t0 + Duration::from_millis(20)), Verdict::Drop);
        assert_eq!(l.admit("x", t0 + Duration::from_millis(30)), Verdict::Drop);
        // One second after the first line a slot frees up.
        assert_eq!(l.admit("x", t0 + Duration::from_millis(1000)), Verdict::Keep("x".into()));
        assert_eq!(l.dropped_total(), 3);
        // The next warning waits for the interval and reports what was dropped since the last one.
        assert_eq!(l.admit("x", t0 + Duration::from_millis(1000)), Verdict::Drop);
        assert_eq!(l.admit("x", t0 + Duration::from_secs(61)), Verdict::Keep("x".into()));
        for _ in 0..2 {
            l.admit("x", t0 + Duration::from_secs(61));
        }
        assert_eq!(l.admit("x", t0 + Duration::from_secs(61)), Verdict::DropAndWarn { dropped: 4 });
    }

    #[test]
    fn long_lines_are_cut_on_a_char_boundary() {
        let mut l = limiter(10);
        assert_eq!(l.admit("abcdefghij", Instant::now()), Verdict::Keep("abcdefgh... [truncated]".into()));
        assert_eq!(truncate("ééééé", 5), "éé... [truncated]");
    }

    #[test]
    fn levels_follow_the_words_in_the_line() {
        assert_eq!(level_of("Error: boom"), "error");
        assert_eq!(level_of("request FAILED"), "error");
        assert_eq!(level_of("WARNING: deprecated"), "warn");
        assert_eq!(level_of("[debug] x"), "debug");
        assert_eq!(level_of("listening on stdio"), "info");
    }
}
