//! The desired state: what instances should exist, from wherever it comes.
//!
//! A config source (the standalone file today, the backend in managed mode)
//! produces a map of `mcp_servers` entries in the backend's wire shape
//! (BP §7.3); `snapshot` validates it into `InstanceSpec`s and diffs it
//! against the previous one. One reconciler applies either source.

mod access;
pub mod directory;
mod expand;
mod limits;
pub mod snapshot;
pub mod standalone;

pub use snapshot::{diff, DesiredState, McpServerEntry, SnapshotDiff};
