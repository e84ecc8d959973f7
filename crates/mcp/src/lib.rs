//! MCP itself: JSON-RPC envelopes, ids, error codes and protocol eras (`mcp::protocol`), the 2026-07-28 headers, a
//! server's result as the text it wrote (`mcp::payload`), the stdio, Streamable HTTP and SSE transports with their
//! relays, and the client that negotiates an era and stamps each request for it. The only crate that builds a
//! JSON-RPC envelope (`invariants_tests`).
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_model::{metrics, model, secrets};

pub mod mcp;
