//! What the data volume did to the database, for readiness and the upkeep: whether it refused the file (the store
//! runs in memory) and its disk reserve (given back when the volume fills).

use std::sync::Arc;

use super::reserve::Reserve;

/// The data volume as the store found it; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Volume {
    /// SQLite: the disk reserve on the data volume (`reserve`).
    pub(super) reserve: Option<Arc<Reserve>>,
    /// The data volume refused the database file: this store is in memory, and nothing survives a stop.
    pub(super) in_memory: bool,
}

impl Volume {
    /// The disk reserve of the SQLite data volume, when there is one.
    pub fn reserve(&self) -> Option<&Reserve> {
        self.reserve.as_deref()
    }

    /// Whether the data volume refused the database file and this store is in memory.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }
}
