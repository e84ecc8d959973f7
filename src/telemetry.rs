//! Logging: tracing to stderr (stdout belongs to the demo server's protocol),
//! pretty or JSON, filtered by level.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Install the global subscriber. `RUST_LOG` refines `level` when set.
pub fn init(level: &str, format: LogFormat) {
    let level = if level == "fatal" { "error" } else { level };
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},hyper=warn,sqlx=warn,reqwest=warn")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
