//! `Retry-After` on a backend refusal (RFC 9110 §10.2.3): read from a 429 or a 503, in either of its forms, and
//! bounded, so a loop calls the backend again no sooner than it asked, no sooner than its own backoff, and never
//! later than [`CAP`] because of it.

use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

/// The longest wait a `Retry-After` imposes: 5 minutes, the command poll's own backoff ceiling (BP §4.4) and so the
/// longest any loop of this client waits by itself. A value past it (an hour, a date in 2100) waits this long: a
/// backend that meant it asks again then, and one whose clock or proxy is wrong does not silence the satellite.
pub const CAP: Duration = Duration::from_secs(300);

/// The wait a `Retry-After` value asks for, read at `now`: delta-seconds (`120`) or an HTTP-date (`Sun, 06 Nov 1994
/// 08:49:37 GMT`, or the obsolete forms RFC 9110 still requires a recipient to read). A date already past asks for
/// no wait; anything else (empty, negative, fractional, words) is `None`, and the loop keeps its own backoff.
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "very long": bounded by CAP where it is used.
        return Some(value.parse().map_or(Duration::MAX, Duration::from_secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait before a loop's next attempt: its own backoff `own`, or longer when the backend asked for longer, to
/// [`CAP`] (never shorter than `own`).
pub fn bounded(own: Duration, asked: Option<Duration>) -> Duration {
    asked.map_or(own, |asked| own.max(asked.min(CAP)))
}

/// Until when a loop leaves the backend alone, as its last `Retry-After` asked (bounded by [`CAP`]): for the loops
/// whose attempts do not wait for each other (the heartbeat's fixed tick) or that another path can fail (the
/// configuration fetch, failed by a `configure` command too).
#[derive(Debug, Default)]
pub struct Hold {
    until: Mutex<Option<Instant>>,
}

impl Hold {
    /// The backend answered asking for `asked` (none: nothing changes). The latest answer decides.
    pub fn asked(&self, asked: Option<Duration>) {
        if let Some(asked) = asked {
            *self.until.lock() = Some(Instant::now() + asked.min(CAP));
        }
    }

    /// What is left of the wait asked for; zero when none is.
    pub fn left(&self) -> Duration {
        self.until.lock().map_or(Duration::ZERO, |until| until.saturating_duration_since(Instant::now()))
    }

    /// Whether the backend is to be left alone now.
    pub fn holds(&self) -> bool {
        !self.left().is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(date: &str) -> SystemTime {
        httpdate::parse_http_date(date).unwrap()
    }

    #[test]
    fn delta_seconds_and_every_http_date_form_are_read() {
        let now = at("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse("Sun, 06 Nov 1994 08:50:07 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse("Sunday, 06-Nov-94 08:50:07 GMT", now), Some(Duration::from_secs(30)), "RFC 850");
        assert_eq!(parse("Sun Nov  6 08:50:07 1994", now), Some(Duration::from_secs(30)), "asctime");
        assert_eq!(parse("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO), "a date past asks no wait");
    }

    #[test]
    fn garbage_asks_for_nothing_and_absurd_values_are_very_long() {
        let now = SystemTime::now();
        for garbage in ["", "soon", "-5", "1.5", "3s", "0x10", "Sun, 06 Nov 1994", "∞"] {
            assert_eq!(parse(garbage, now), None, "{garbage:?}");
        }
        assert_eq!(parse("99999999999999999999999999", now), Some(Duration::MAX));
        assert!(parse("Fri, 31 Dec 9999 23:59:59 GMT", now).is_some_and(|d| d > CAP));
    }

    #[test]
    fn the_wait_is_never_below_the_own_backoff_nor_past_the_cap() {
        let own = Duration::from_millis(100);
        assert_eq!(bounded(own, None), own);
        assert_eq!(bounded(own, Some(Duration::from_secs(3))), Duration::from_secs(3));
        assert_eq!(bounded(Duration::from_secs(8), Some(Duration::from_secs(3))), Duration::from_secs(8));
        assert_eq!(bounded(own, Some(Duration::MAX)), CAP);
        assert_eq!(bounded(own, Some(Duration::ZERO)), own);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_lasts_as_asked_to_the_cap_and_the_latest_answer_decides() {
        let hold = Hold::default();
        assert!(!hold.holds());
        hold.asked(None);
        assert!(!hold.holds());
        hold.asked(Some(Duration::MAX));
        assert_eq!(hold.left(), CAP);
        hold.asked(Some(Duration::from_secs(3)));
        assert_eq!(hold.left(), Duration::from_secs(3));
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert!(hold.holds());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!hold.holds());
    }
}
