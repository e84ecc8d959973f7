//! satellite: an MCP gateway for teams.
//!
//! The top of the workspace: the wiring (`app`), the demo server, telemetry and the fuzz entry points, over the
//! crates in `crates/`, whose modules it re-exports under their own names (`satellite::http`, `satellite::store`)
//! for the binary, the integration tests, the benchmarks and `fuzz/`. See ARCHITECTURE.md for the map of crates
//! and how a request flows.

pub use satellite_auth::{auth, toolsets};
pub use satellite_backend::backend;
pub use satellite_config::{config, control};
pub use satellite_http::http;
pub use satellite_instances::{activity, discovery, instances, logcapture};
pub use satellite_mcp::mcp;
pub use satellite_model::{jobs, memory, metrics, model, secrets};
pub use satellite_router::{analytics, router};
pub use satellite_search::{search, tokens};
pub use satellite_store::{events, store};

pub mod app;
pub mod demo;
pub mod fuzz;
pub mod telemetry;

#[cfg(test)]
mod invariants_tests;
#[cfg(test)]
mod layering_tests;
#[cfg(test)]
mod source_tests;
