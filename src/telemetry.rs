//! Logging and tracing: log lines to stderr (stdout belongs to the demo server's protocol), pretty or JSON,
//! filtered by level; and, when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the satellite's spans exported as OpenTelemetry traces over
//! HTTP/protobuf, with W3C trace context propagated to HTTP upstreams (`inject_trace_context`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

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
    let (traces, problem) = match if traces { trace_provider() } else { Ok(None) } {
        Ok(provider) => (provider, None),
        Err(problem) => (None, Some(problem)),
    };
    let tracer = traces.as_ref().map(|provider| provider.tracer("satellite"));
    let _ = subscriber(level, format, tracer).try_init();
    if let Some(problem) = problem {
        tracing::warn!(error = %problem, "OpenTelemetry traces are off: the OTLP exporter could not be set up; check OTEL_EXPORTER_OTLP_ENDPOINT");
    } else if traces.is_some() {
        opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        tracing::info!("OpenTelemetry traces are exported over OTLP/HTTP");
    }
    Telemetry { traces }
}

/// The log lines at `level`; with a `tracer`, spans exported too (what `exported` takes, whatever the log
/// level). A span neither layer wants is not built at all.
fn subscriber(
    level: &str,
    format: LogFormat,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
) -> impl tracing::Subscriber + Send + Sync {
    use std::io::IsTerminal as _;
    let ansi = colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"));
    layered(level, format, tracer, std::io::stderr, ansi)
}

/// Colours only for a person at a terminal (and not when `NO_COLOR` is set, per no-color.org). A file, journald
/// or a container's log collector gets plain text: escape codes there are noise to every reader and grep, and
/// painting the request span's fields cost 2.4k instructions of every proxied call (docs/performance-history.md,
/// 2026-11-28 14:30).
fn colours(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// [`subscriber`], writing its lines to `writer`.
fn layered<W>(
    level: &str,
    format: LogFormat,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    writer: W,
    ansi: bool,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let level = if level == "fatal" { "error" } else { level };
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    let fmt = match format {
        LogFormat::Pretty if !ansi => fmt.fmt_fields(PlainFields).boxed(),
        LogFormat::Pretty => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    // `RUST_LOG` may filter on span fields, which only an `EnvFilter` does. The default directives are levels by
    // target, which a `Targets` filter holds as well, and it does no work when a span is entered or left: an
    // `EnvFilter` takes a lock and looks the span up each time, for the field filters it might have (a proxied
    // call enters spans eight times; docs/performance-history.md, 2026-12-02 02:15).
    let fmt = match EnvFilter::try_from_env("RUST_LOG") {
        Ok(filter) => fmt.with_filter(filter).boxed(),
        Err(_) => match default_directives(level).parse::<tracing_subscriber::filter::Targets>() {
            Ok(targets) => fmt.with_filter(targets).boxed(),
            Err(_) => fmt.with_filter(EnvFilter::new(default_directives(level))).boxed(),
        },
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![fmt];
    if let Some(tracer) = tracer {
        layers.push(tracing_opentelemetry::layer().with_tracer(tracer).with_filter(filter_fn(exported)).boxed());
    }
    tracing_subscriber::registry().with(layers)
}

/// The Pretty format's fields without colours, as tracing-subscriber's `DefaultFields` writes them then: `name=value`
/// apart from the message, separated by spaces, the message's (and errors') ANSI and C1 control characters escaped.
/// `DefaultFields` paints every name and `=` through `nu_ansi_term` even with colours off: about 2k instructions of
/// each proxied call, for the request span's three fields (docs/performance-history.md, 2026-12-02 02:15).
struct PlainFields;

impl<'writer> tracing_subscriber::fmt::FormatFields<'writer> for PlainFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let sanitize = writer.sanitizes_ansi_escapes();
        let mut visitor = PlainVisitor { writer, sanitize, empty: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'writer> {
    writer: tracing_subscriber::fmt::format::Writer<'writer>,
    sanitize: bool,
    empty: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"))
        } else {
            self.record_debug(field, &value)
        }
    }

    fn record_error(&mut self, field: &tracing::field::Field, value: &(dyn std::error::Error + 'static)) {
        let sanitize = self.sanitize;
        match value.source() {
            Some(source) => self.record_debug(
                field,
                &format_args!("{} {}.sources={}", Escaped(value, sanitize), field.name(), Sources(source, sanitize)),
            ),
            None => self.record_debug(field, &format_args!("{}", Escaped(value, sanitize))),
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        // tracing-log's metadata fields, which the line shows already.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        if !std::mem::take(&mut self.empty) {
            self.result = self.writer.write_char(' ');
        }
        self.result = self.result.and_then(|()| match name {
            "message" => write!(self.writer, "{:?}", Escaped(value, self.sanitize)),
            name => {
                self.writer.write_str(name.strip_prefix("r#").unwrap_or(name))?;
                self.writer.write_char('=')?;
                write!(self.writer, "{value:?}")
            }
        });
    }
}

/// A value's `Display` or `Debug`, its ANSI and C1 control characters escaped when `.1` (as tracing-subscriber
/// escapes them).
struct Escaped<T>(T, bool);
/// An error's sources, as a list, each escaped as [`Escaped`].
struct Sources<'a>(&'a (dyn std::error::Error + 'static), bool);

impl<T: std::fmt::Display> std::fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        match self.1 {
            true => write!(EscapingWriter(f), "{}", self.0),
            false => self.0.fmt(f),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Escaped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        match self.1 {
            true => write!(EscapingWriter(f), "{:?}", self.0),
            false => self.0.fmt(f),
        }
    }
}

impl std::fmt::Display for Sources<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        let mut next = Some(self.0);
        while let Some(error) = next {
            list.entry(&format_args!("{}", Escaped(&error, self.1)));
            next = error.source();
        }
        list.finish()
    }
}

/// Writes through, with ANSI and C1 control characters as escapes (`\x1b`, `\u{9b}`).
struct EscapingWriter<'a, 'b>(&'a mut std::fmt::Formatter<'b>);

impl std::fmt::Write for EscapingWriter<'_, '_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        for ch in text.chars() {
            match ch {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                ch if ('\u{80}'..='\u{9f}').contains(&ch) => write!(self.0, "\\u{{{:x}}}", ch as u32)?,
                ch => self.0.write_char(ch)?,
            }
        }
        Ok(())
    }
}

/// What the trace exporter takes: the satellite's own spans at `debug` and above (a request to an upstream server
/// is a `debug` span, so that at the default log level a request builds one span, not two, when nothing is
/// exported) and its events at `info` and above.
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    let floor = if meta.is_span() { tracing::Level::DEBUG } else { tracing::Level::INFO };
    ours(meta.target()) && *meta.level() <= floor
}

/// Whether a target is the satellite's own: the binary's (`satellite::app`) or a workspace crate's
/// (`satellite_http::http::mcp`), not another crate's (`hyper::proto`, `tantivy`).
fn ours(target: &str) -> bool {
    let Some(rest) = target.strip_prefix("satellite") else { return false };
    rest.is_empty() || rest.starts_with("::") || rest.starts_with('_')
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines written to memory, for reading back.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Written to a file or a collector, a log line is plain text, its request span's fields included; colours
    /// only at a terminal, and never with `NO_COLOR` set. (Run from the test above: see there.)
    fn log_lines_are_plain_text_unless_a_person_reads_them_at_a_terminal() {
        assert!(!colours(false, None));
        assert!(colours(true, None));
        assert!(!colours(true, Some("1".into())));
        assert!(colours(true, Some("".into())), "an empty NO_COLOR does not count (no-color.org)");

        let written = |ansi: bool| {
            let lines = Lines::default();
            let writer = lines.clone();
            let subscriber = layered("info", LogFormat::Pretty, None, move || writer.clone(), ansi);
            tracing::subscriber::with_default(subscriber, || {
                let _request = tracing::info_span!("http", method = "POST", path = "/mcp").entered();
                tracing::info!(tool = "echo", "the plain line");
            });
            let bytes = lines.0.lock().clone();
            String::from_utf8(bytes).unwrap()
        };
        let plain = written(false);
        assert!(plain.contains(r#"http{method="POST" path="/mcp"}: "#), "{plain}");
        assert!(plain.contains("the plain line tool=\"echo\""), "{plain}");
        assert!(!plain.contains('\x1b'), "escape codes in a plain line: {plain:?}");
        assert!(written(true).contains('\x1b'), "a terminal gets its colours");
    }

    /// With no trace export, a span below the log level is not built: at `info` the request's span is, the
    /// upstream request's (`debug`) is not.
    #[test]
    fn only_spans_at_the_log_level_or_exported_are_built() {
        tracing::subscriber::with_default(subscriber("warn", LogFormat::Pretty, None), || {
            assert!(tracing::info_span!("http", request_id = "r-1").is_disabled());
            assert!(!tracing::warn_span!("kept").is_disabled());
        });
        tracing::subscriber::with_default(subscriber("info", LogFormat::Json, None), || {
            assert!(!tracing::info_span!("http", request_id = "r-2").is_disabled());
            assert!(tracing::debug_span!("mcp.upstream").is_disabled());
        });
        // In the same test: a callsite's interest is global, so two tests with their own dispatchers running at
        // once would see each other's.
        the_exporter_takes_the_satellites_debug_spans_and_info_events();
        log_lines_are_plain_text_unless_a_person_reads_them_at_a_terminal();
        plain_fields_write_what_default_fields_write_without_colours();
    }

    /// [`PlainFields`] writes each line as tracing-subscriber's `DefaultFields` does with colours off, escapes in
    /// messages and errors included. (Run from the test above: see there.)
    fn plain_fields_write_what_default_fields_write_without_colours() {
        #[derive(Debug)]
        struct Cause;
        impl std::fmt::Display for Cause {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the cause \x1b[31m in red")
            }
        }
        impl std::error::Error for Cause {}
        #[derive(Debug)]
        struct Failure(Cause);
        impl std::fmt::Display for Failure {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("it failed")
            }
        }
        impl std::error::Error for Failure {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let written = |plain: bool| {
            let lines = Lines::default();
            let writer = lines.clone();
            let layer =
                tracing_subscriber::fmt::layer().with_writer(move || writer.clone()).with_ansi(false).without_time();
            let layer = if plain { layer.fmt_fields(PlainFields).boxed() } else { layer.boxed() };
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
                let request = tracing::info_span!("http", method = %"POST", path = "/mcp", r#type = 3, ok = true);
                let _request = request.entered();
                tracing::info!(tool = "echo", count = 2, ratio = 0.5, what = ?Some("x"), "a \x1b[2J clear and a \u{9b} C1");
                let failure = Failure(Cause);
                tracing::warn!(error = &failure as &(dyn std::error::Error + 'static), "failed");
                let alone = Cause;
                tracing::warn!(error = &alone as &(dyn std::error::Error + 'static), shown = %"\x1b[1m", "alone");
                tracing::info!(message = "a message given as a field", extra = %"shown");
                tracing::error!("{} {}", "formatted", 7);
            });
            let bytes = lines.0.lock().clone();
            String::from_utf8(bytes).unwrap()
        };
        let (plain, default) = (written(true), written(false));
        assert_eq!(plain, default);
        assert_eq!(plain.lines().count(), 5, "{plain}");
        assert!(plain.contains("a \\x1b[2J clear and a \\u{9b} C1"), "the message's escapes escaped: {plain}");
        assert!(plain.contains("error.sources=[the cause \\x1b[31m in red]"), "{plain}");
        assert!(plain.contains(r#"http{method=POST path="/mcp" type=3 ok=true}"#), "{plain}");
    }

    /// The exporter takes the satellite's spans down to `debug` (the upstream request's span) and its events
    /// down to `info`; other crates' nothing.
    fn the_exporter_takes_the_satellites_debug_spans_and_info_events() {
        use parking_lot::Mutex;
        use std::sync::Arc;
        #[derive(Clone, Default)]
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> Layer<S> for Seen {
            fn on_new_span(
                &self,
                attrs: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0.lock().push(attrs.metadata().name().to_owned());
            }
            fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                self.0.lock().push(format!("event {}", event.metadata().level()));
            }
        }
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone().with_filter(filter_fn(exported)));
        tracing::subscriber::with_default(subscriber, || {
            let _upstream = tracing::debug_span!(target: "satellite_mcp::mcp::client", "mcp.upstream");
            let _app = tracing::info_span!("app");
            let _finer = tracing::trace_span!("finer");
            let _theirs = tracing::info_span!(target: "hyper::proto", "theirs");
            tracing::info!("kept");
            tracing::debug!("not kept");
            tracing::warn!(target: "tantivy", "not ours");
        });
        let seen = seen.0.lock().clone();
        assert_eq!(seen, ["mcp.upstream", "app", "event INFO"]);
        assert!(!ours("satellitex") && !ours("hyper") && ours("satellite") && ours("satellite_store::store"));
    }
}
