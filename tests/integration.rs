//! Integration tests: one binary, one module per area, real MCP servers.

mod common;

mod analytics;
mod budget;
mod cache_hints;
mod cli;
mod compat;
mod contracts;
mod credentials;
mod discovery;
mod fake_backend_selftest;
mod fidelity;
mod front_door;
mod front_door_corners;
mod fuzz_regressions;
mod github;
mod hangups;
mod lifecycle;
mod managed;
mod metrics;
mod mirrored_headers;
mod outage;
mod progress_tokens;
mod reconcile;
mod replicas;
mod sandbox;
mod secret_sweep;
mod storage;
mod tasks;
mod tenancy;
mod tokens;
mod toolsets;
mod upstream_http;
mod upstream_stdio;
mod wire;
