//! What a member's agent sees: the hierarchical router's four meta-tools (discover, execute, list and read
//! resources) over the member's own instances, the instance router that exposes one instance's tools directly,
//! prompts and resources; and `analytics`, the token-savings facts batched and written by one task, with the
//! reports and charts built from them.
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

#[cfg(test)]
#[macro_use]
extern crate satellite_model;

use satellite_auth::auth;
use satellite_instances::{discovery, instances};
use satellite_mcp::mcp;
use satellite_model::{metrics, model};
use satellite_search::{search, tokens};
use satellite_store::store;

pub mod analytics;
pub mod router;
