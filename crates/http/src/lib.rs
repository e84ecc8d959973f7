//! The front door: warp routes behind a tower stack (limits, request ids, authentication, request logs), MCP
//! sessions and the exchange that carries a call and what the server says mid-call, the legacy SSE transport,
//! status and metrics, OAuth discovery documents, and the admin pages. The only crate that names warp or hyper
//! besides the demo server (`invariants_tests`).
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

#[cfg(test)]
#[macro_use]
extern crate satellite_model;

use satellite_auth::{auth, toolsets};
use satellite_backend::backend;
use satellite_config::config;
use satellite_instances::{activity, instances};
use satellite_mcp::mcp;
use satellite_model::{jobs, metrics, model, secrets};
use satellite_router::{analytics, router};
use satellite_store::{events, store};

pub mod http;
