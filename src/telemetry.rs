//! Logging and tracing: log lines to stderr (stdout belongs to the demo server's protocol), pretty or JSON,
//! filtered by level; and, when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the satellite's spans exported as OpenTelemetry traces over
//! HTTP/protobuf, with W3C trace context propagated to HTTP upstreams (`inject_trace_context`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// What must be flushed before the process exits: the trace exporter, when there is one.
#[must_use = "call shutdown() at exit so the last spans are sent"]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.traces.is_some()
    }

    /// Send what is buffered and stop the exporter. Call outside the async runtime (the exporter blocks).
    pub fn shutdown(self) {
        if let Some(provider) = self.traces {
            if let Err(err) = provider.shutdown() {
                eprintln!("warning: the last traces could not be sent: {err}");
            }
        }
    }
}

/// Install the global subscriber. `RUST_LOG` refines `level` when set. `traces`: export spans when an OTLP
/// endpoint is configured. Call before the async runtime starts.
pub fn init(level: &str, format: LogFormat, traces: bool) -> Telemetry {
    let level = if level == "fatal" { "error" } else { level };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(default_directives(level)));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Pretty => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let (traces, problem) = match if traces { trace_provider() } else { Ok(None) } {
        Ok(provider) => (provider, None),
        Err(problem) => (None, Some(problem)),
    };
    // Spans are exported whatever the log level: the satellite's own at info and above.
    let otel = traces.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("satellite"))
            .with_filter(tracing_subscriber::filter::Targets::new().with_target("satellite", tracing::Level::INFO))
    });
    let _ = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(otel).try_init();
    if let Some(problem) = problem {
        tracing::warn!(error = %problem, "OpenTelemetry traces are off: the OTLP exporter could not be set up; check OTEL_EXPORTER_OTLP_ENDPOINT");
    } else if traces.is_some() {
        opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        tracing::info!("OpenTelemetry traces are exported over OTLP/HTTP");
    }
    Telemetry { traces }
}

/// The OTLP trace pipeline when an endpoint is configured (the SDK reads the standard `OTEL_*` variables:
/// endpoint, headers, timeout, sampler, batch settings, resource attributes).
fn trace_provider() -> Result<Option<SdkTracerProvider>, opentelemetry_otlp::ExporterBuildError> {
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()));
    if !configured || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("satellite");
    }
    let resource =
        resource.with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))).build();
    Ok(Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build()))
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
