//! Logging: tracing to stderr (stdout belongs to the demo server's protocol),
//! pretty or JSON, filtered by level.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Install the global subscriber. `RUST_LOG` refines `level` when set.
pub fn init(level: &str, format: LogFormat) {
    let level = if level == "fatal" { "error" } else { level };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(default_directives(level)));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The satellite's own lines at `level`, every other crate's (tantivy, hyper, sqlx, reqwest, tower-http) at warn:
/// their info lines are about their internals, not about anything an operator can act on.
fn default_directives(level: &str) -> String {
    let others = match level {
        "error" => "error",
        _ => "warn",
    };
    format!("{others},satellite={level}")
}
