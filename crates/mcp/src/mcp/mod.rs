//! The Model Context Protocol: wire data (`protocol`), upstream transports
//! (`transport`) and the negotiating client built on them (`client`).

pub mod cache;
pub mod client;
pub mod headers;
pub mod payload;
pub mod progress;
pub mod protocol;
pub mod task_ids;
pub mod transport;
