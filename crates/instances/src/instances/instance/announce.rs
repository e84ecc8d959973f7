//! What the server announces outside any request (resource updates, list changes, log messages), passed on to the
//! client sessions on the instance's endpoint, and the marker that tells them some were missed.

use std::sync::Arc;

use crate::mcp::transport::Announcement;

use super::Instance;

/// Announcements queued per listening session before the slowest one starts to miss some.
const ANNOUNCEMENT_BACKLOG: usize = 64;

/// How often, at most, [`Instance::announce_missed`] tells listeners.
const MISSED_ANNOUNCEMENTS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The method of the marker [`Instance::announce_missed`] sends; it never leaves the satellite.
const MISSED_ANNOUNCEMENTS: &str = "satellite/announcements-missed";

/// Whether an announcement says some were missed before it ([`Instance::announce_missed`]): what they were
/// (list changes, resource updates) is unknown, so a listener says each of them may have happened.
pub fn missed_announcements(note: &serde_json::Value) -> bool {
    note.get("method").and_then(serde_json::Value::as_str) == Some(MISSED_ANNOUNCEMENTS)
}

impl Instance {
    /// Listen to what the server announces outside any request (notification messages, as JSON-RPC).
    pub fn announcements(&self) -> tokio::sync::broadcast::Receiver<Announcement> {
        self.announcements.get_or_init(|| tokio::sync::broadcast::channel(ANNOUNCEMENT_BACKLOG).0).subscribe()
    }

    /// Pass on a notification the server sent outside any request; nobody listening is fine (a channel nobody
    /// ever listened to does not exist, and one whose listeners left drops it).
    pub(in crate::instances) fn announce(&self, notification: Announcement) {
        if let Some(announcements) = self.announcements.get() {
            let _ = announcements.send(notification);
        }
    }

    /// Tell listeners that announcements were lost before they reached this instance's channel (the server's
    /// burst outran the transport's backlog): each listener treats it as having fallen behind itself. At most
    /// once a second: a server flooding log lines outside any call would otherwise have every client re-read
    /// every list again and again.
    pub(in crate::instances) fn announce_missed(&self) {
        {
            let mut missed_at = self.missed_at.lock();
            if missed_at.is_some_and(|at| at.elapsed() < MISSED_ANNOUNCEMENTS_EVERY) {
                return;
            }
            *missed_at = Some(std::time::Instant::now());
        }
        self.announce(Arc::new(crate::mcp::protocol::notification(MISSED_ANNOUNCEMENTS, None)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::ToolOverrides;

    /// Lost announcements are said at most once a second: two lags in a row give listeners one marker (a flood of
    /// log lines would otherwise have every client re-read every list again and again), and the next second's lag
    /// gives another.
    #[test]
    fn lost_announcements_are_said_at_most_once_a_second() {
        let instance = Instance::new(Arc::new(crate::model::sample_spec()), None, 1, ToolOverrides::default());
        let mut heard = instance.announcements();
        instance.announce_missed();
        instance.announce_missed();
        let marker = heard.try_recv().expect("one marker");
        assert_eq!(marker["method"], MISSED_ANNOUNCEMENTS);
        assert!(heard.try_recv().is_err(), "the second lag within the second is not said again");
        *instance.missed_at.lock() = std::time::Instant::now().checked_sub(MISSED_ANNOUNCEMENTS_EVERY);
        instance.announce_missed();
        assert_eq!(heard.try_recv().expect("a marker a second later")["method"], MISSED_ANNOUNCEMENTS);
    }

    /// The announcement channel exists only once a session listens: what came before is gone (as with a channel
    /// nobody listened to), what comes after reaches every listener, and a listener that left does not stop it.
    #[test]
    fn announcements_reach_those_listening_when_they_are_made() {
        let note = |n: u32| Arc::new(serde_json::json!({"n": n}));
        let instance = Instance::new(Arc::new(crate::model::sample_spec()), None, 1, ToolOverrides::default());
        instance.announce(note(0));
        let mut first = instance.announcements();
        let gone = instance.announcements();
        drop(gone);
        instance.announce(note(1));
        let mut second = instance.announcements();
        instance.announce(note(2));
        assert_eq!(first.try_recv().ok(), Some(note(1)), "nothing from before anyone listened");
        assert_eq!(first.try_recv().ok(), Some(note(2)));
        assert_eq!(second.try_recv().ok(), Some(note(2)), "one channel for every listener");
        assert!(first.try_recv().is_err() && second.try_recv().is_err());
    }
}
