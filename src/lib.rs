//! satellite: an MCP gateway for teams.
//!
//! See ARCHITECTURE.md for the map of modules and how a request flows.

/// The size of the future an `async fn` returns, read from its signature without calling it (tests that keep a
/// hot path's future small): `future_size!(f, <'a> (&'a A, B))`, the arguments' types with their one lifetime.
#[cfg(test)]
macro_rules! future_size {
    ($f:expr, <$lt:lifetime> ($($arg:ty),* $(,)?)) => {{
        #[allow(clippy::type_complexity)]
        fn size<$lt, Fut>(_: fn($($arg),*) -> Fut) -> usize {
            std::mem::size_of::<Fut>()
        }
        size($f)
    }};
}

pub use satellite_config::{config, control};
pub use satellite_mcp::mcp;
pub use satellite_model::{jobs, memory, metrics, model, secrets};
pub use satellite_search::{search, tokens};

pub mod activity;
pub mod analytics;
pub mod app;
pub mod auth;
pub mod backend;
pub mod demo;
pub mod discovery;
pub mod events;
pub mod fuzz;
pub mod http;
pub mod instances;
pub mod logcapture;
pub mod router;
pub mod store;
pub mod telemetry;
pub mod toolsets;

#[cfg(test)]
mod invariants_tests;
#[cfg(test)]
mod layering_tests;
#[cfg(test)]
mod source_tests;
