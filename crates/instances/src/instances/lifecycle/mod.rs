//! The supervisor of each instance: start, stop, the watcher of a stdio
//! child (crash → restart policy, list changes, stderr warnings), dormancy
//! and respawn, calls with their limits and retries, and recovery of remote
//! servers. Every status change goes through `Reporter::set_status`.
//!
//! Locking: an instance's `lifecycle` lock is held while it is started,
//! stopped, restarted, put to sleep, woken or rediscovered. Crash handling
//! and probes run outside it and take it again for each attempt.
//!
//! The parts the supervisor works with, each in its file: the `Connector` (`connect`: spawn or connect, headers,
//! OAuth, the handshake), the `Room` (`room`: process slots, dormancy, room on demand), the `CatalogPublisher`
//! (`catalogs`: the store, the search index, the tool events) and the `CallLog` (`call_log`). The supervisor's own
//! steps, `impl Inner` blocks, one job a file: `start` (start, restart, halt, rediscover, stop), `retry` (starts
//! that could not happen yet), `publish` (a discovery made the instance's), `supervise` (watches), `listen` (the
//! satellite's own listen on a 2026-07-28 server), `crash`, `dormancy` (sleep and respawn), `restore` (what a
//! server started anew is asked again), `refresh` (rediscovery on request or when stale), `calls` (calls with
//! their limits and retries, `stateless` for 2026-07-28 servers) and `recovery` (probes of failed instances).

mod call_log;
mod calls;
mod catalogs;
mod connect;
mod crash;
mod dormancy;
mod listen;
mod publish;
mod recovery;
mod refresh;
mod restore;
mod retry;
mod room;
mod start;
mod stateless;
mod supervise;

pub(super) use call_log::CallLog;
pub(super) use catalogs::{load_stored, CatalogPublisher};
pub(super) use connect::Connector;
pub use refresh::RefreshReport;
pub(super) use room::Room;

/// What a start that could not happen yet waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::instances) enum Retry {
    /// A process slot given back.
    Slot,
    /// Time: the backend or GitHub may answer later ([`crate::instances::policy::probe_wait`]).
    Deployment,
}
