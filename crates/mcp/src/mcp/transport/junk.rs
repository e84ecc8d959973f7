//! What a stdio server writes on stdout that is not JSON-RPC ("junk": a banner, a stray debug print, a progress
//! bar): the first few lines of a burst are logged, the rest counted and summed up once per window, so a server
//! printing junk in a loop costs the log a line per window instead of one per line it prints. One [`JunkLimiter`]
//! per process: one server's junk never silences another's. Pure and clock-driven by the caller, so it is tested
//! without waiting.

use std::time::{Duration, Instant};

/// How much of a server's junk reaches the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JunkSettings {
    /// Lines logged in a window that starts after a quiet one; the rest of the window's lines are counted.
    pub logged_lines: u32,
    /// How often the count of suppressed lines is logged while junk keeps coming.
    pub window: Duration,
}

impl Default for JunkSettings {
    fn default() -> Self {
        Self { logged_lines: 5, window: Duration::from_secs(60) }
    }
}

/// Lines counted and not logged, over how long: what a summary line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppressed {
    pub lines: u64,
    pub over: Duration,
}

/// Per-process state.
#[derive(Debug)]
pub struct JunkLimiter {
    settings: JunkSettings,
    window: Option<Window>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    /// Lines this window may still log.
    budget: u32,
    suppressed: u64,
}

impl JunkLimiter {
    pub fn new(settings: JunkSettings) -> Self {
        Self { settings, window: None }
    }

    /// Whether a junk line that came at `now` is to be logged; if not, it is counted for the next summary.
    ///
    /// A window begins with the first line after a quiet spell, with the whole budget. A window in which lines
    /// were suppressed is followed by one with no budget (see [`JunkLimiter::summary`]): a server that keeps
    /// printing is summed up, window after window, until it has been quiet for a whole window.
    pub fn admit(&mut self, now: Instant) -> bool {
        let window = match &mut self.window {
            Some(window) if window.suppressed > 0 || now.duration_since(window.start) < self.settings.window => window,
            _ => self.window.insert(Window { start: now, budget: self.settings.logged_lines, suppressed: 0 }),
        };
        if window.budget > 0 {
            window.budget -= 1;
            return true;
        }
        window.suppressed += 1;
        false
    }

    /// When the next summary is due: the end of a window in which lines were suppressed.
    pub fn due(&self) -> Option<Instant> {
        self.window.filter(|w| w.suppressed > 0).map(|w| w.start + self.settings.window)
    }

    /// What the window that ended by `now` suppressed, if it did; the next window starts at `now` with no budget.
    pub fn summary(&mut self, now: Instant) -> Option<Suppressed> {
        let window = self.window.as_mut()?;
        if window.suppressed == 0 || now.duration_since(window.start) < self.settings.window {
            return None;
        }
        let done = std::mem::replace(window, Window { start: now, budget: 0, suppressed: 0 });
        Some(Suppressed { lines: done.suppressed, over: now.duration_since(done.start) })
    }

    /// What is suppressed and not yet summed up, whatever the time (the process has ended).
    pub fn finish(&mut self, now: Instant) -> Option<Suppressed> {
        let window = self.window.take()?;
        (window.suppressed > 0).then(|| Suppressed { lines: window.suppressed, over: now.duration_since(window.start) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter() -> JunkLimiter {
        JunkLimiter::new(JunkSettings { logged_lines: 3, window: Duration::from_secs(10) })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// 100,000 lines at once: three logged, the rest summed up once the window ends.
    #[test]
    fn a_burst_logs_the_first_lines_and_sums_up_the_rest_when_its_window_ends() {
        let (mut junk, t0) = (limiter(), Instant::now());
        let logged = (0..100_000).filter(|_| junk.admit(t0)).count();
        assert_eq!(logged, 3);
        assert_eq!(junk.due(), Some(t0 + secs(10)));
        assert_eq!(junk.summary(t0 + secs(9)), None, "not before the window ends");
        assert_eq!(junk.summary(t0 + secs(10)), Some(Suppressed { lines: 99_997, over: secs(10) }));
        assert_eq!(junk.due(), None, "nothing more to say");
        assert_eq!(junk.finish(t0 + secs(11)), None);
    }

    /// A server that keeps printing gets a count per window and no more lines, until it was quiet for a window.
    #[test]
    fn junk_that_goes_on_is_counted_window_after_window_until_a_quiet_one() {
        let (mut junk, t0) = (limiter(), Instant::now());
        (0..10).for_each(|_| _ = junk.admit(t0));
        assert_eq!(junk.summary(t0 + secs(10)).map(|s| s.lines), Some(7));
        assert!(!junk.admit(t0 + secs(11)), "the next window has no budget");
        assert!(!junk.admit(t0 + secs(12)));
        assert_eq!(junk.due(), Some(t0 + secs(20)));
        assert_eq!(junk.summary(t0 + secs(20)), Some(Suppressed { lines: 2, over: secs(10) }));
        // Quiet from 20 to 30: a new burst is logged again.
        assert!(junk.admit(t0 + secs(31)), "after a quiet window the budget is back");
        assert!(junk.admit(t0 + secs(31)) && junk.admit(t0 + secs(31)));
        assert!(!junk.admit(t0 + secs(31)));
        assert_eq!(junk.finish(t0 + secs(33)), Some(Suppressed { lines: 1, over: secs(2) }), "said at the end");
    }

    /// A line now and then is always logged: a window that suppressed nothing ends by itself.
    #[test]
    fn sparse_lines_are_all_logged() {
        let (mut junk, t0) = (limiter(), Instant::now());
        for i in 0..20 {
            assert!(junk.admit(t0 + secs(4 * i)), "line {i}");
        }
        assert_eq!(junk.due(), None);
    }
}
