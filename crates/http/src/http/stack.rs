//! The tower stack around the warp routes, and the accept loop that serves it.
//!
//! Each request gets an `x-request-id` (kept when the client sent one) and a
//! tracing span carrying it; a deadline; and a place under a global
//! concurrency limit, refused at once with 503 when the satellite is full
//! (load shedding) rather than queued without bound. Connections are capped
//! (past the cap new ones wait in the listen backlog), request heads must
//! arrive within a timeout, and idle keep-alive connections are closed.
//! Shutdown stops accepting, then lets open connections finish their in-flight
//! requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info_span, warn, Instrument};
use warp::http::{HeaderName, HeaderValue, Request};
use warp::reply::Response;
use warp::Filter;

use super::activity::{Activity, Busy, Tracked};
use super::body_deadline::{self, Timed};
use super::McpError;

/// The TCP peer of the connection a request came on (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Limits of the HTTP stack.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Requests handled at once; more are refused with 503.
    pub max_concurrent_requests: usize,
    /// Until the response starts (an SSE stream, once started, is not cut).
    pub request_timeout: Duration,
    /// Open connections at most: past it, new ones wait in the kernel's backlog (no descriptor spent).
    pub max_connections: usize,
    /// A request's head must arrive within this; it is also how long an idle keep-alive connection stays.
    pub header_read_timeout: Duration,
    /// One write to a client may wait this long for it to read; then the connection is cut. A client that stops
    /// reading an 8 MB answer held the answer and its connection for ever.
    pub write_timeout: Duration,
    /// A request body must arrive whole within this once the satellite waits for it; then 408 (`body_deadline`).
    pub body_read_timeout: Duration,
}

/// Default for `HttpLimits::header_read_timeout`: a slow client still sends a request head in well under this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one warning per this long while connections are refused for lack of room or descriptors.
const CAP_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// A request the satellite refuses itself (full, or past its deadline); not a bearer failure, so the resource URLs
/// are never read.
fn refusal(refusal: McpError) -> Response {
    refusal.into_response(&super::oauth::ResourceUrls { public_url: String::new() })
}

/// RFC 9110 §5.3: `Authorization` is a field of one value. A request that sends it twice carries two credentials,
/// and which one a route would take is chance (warp's header filters and `HeaderMap::get` read the first), so it is
/// refused before any route runs: 400, with the API's error shape under `/api/` and a JSON-RPC error elsewhere.
/// Neither value is read, and nothing of them is logged.
fn two_authorizations<B>(request: &Request<B>) -> Option<Response> {
    let mut sent = request.headers().get_all(warp::http::header::AUTHORIZATION).iter();
    sent.next()?;
    sent.next()?;
    if request.uri().path().starts_with("/api/") {
        let body = serde_json::json!({"error": "bad_request", "message": super::error::TWO_AUTHORIZATIONS});
        return Some(super::json_response(warp::http::StatusCode::BAD_REQUEST, &body));
    }
    Some(refusal(McpError::TwoAuthorizations))
}

/// The target of the access log (a line as each request starts and ends, at debug): outside `satellite`, so
/// `LOG_LEVEL=debug` does not turn it on; `RUST_LOG=warn,satellite=info,http_access=debug` does
/// (docs/operations.md).
const ACCESS_LOG: &str = "http_access";

/// An answer whose body is a stream of events (SSE), sent long after its head.
fn is_stream(response: &Response) -> bool {
    response
        .headers()
        .get(warp::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// Where a request's id comes and goes: the client's, kept as sent, or one made for it; its answer carries it.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's `x-request-id` as the client sent it, or a new UUID v4 (from a thread-local generator: no system
/// call per request).
fn request_id<B>(request: &Request<B>) -> HeaderValue {
    if let Some(sent) = request.headers().get(X_REQUEST_ID) {
        return sent.clone();
    }
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let made = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
    HeaderValue::from_str(made).unwrap_or(HeaderValue::from_static("-"))
}

/// The route template a path belongs to, as the `route` label of the request metrics: bounded, and never an
/// instance path (which names a user's instance) or anything a client made up.
pub fn route_label(path: &str) -> &'static str {
    const EXACT: [&str; 10] = [
        "/",
        "/mcp",
        "/sse",
        "/message",
        "/healthz",
        "/readyz",
        "/metrics",
        "/admin",
        "/api/status/debug",
        "/api/status/backend",
    ];
    if let Some(exact) = EXACT.iter().find(|route| **route == path) {
        return exact;
    }
    // Per request: read the segments in place rather than collecting them.
    let mut segments = path.trim_start_matches('/').split('/');
    match (segments.next(), segments.next(), segments.next(), segments.next()) {
        (Some("i"), Some(_), Some("mcp"), None) => "/i/{path}/mcp",
        (Some("api"), Some("analytics"), ..) => "/api/analytics/*",
        (Some("admin"), ..) => "/admin/*",
        (Some(".well-known"), ..) => "/.well-known/*",
        _ => "other",
    }
}

/// Serve `routes` behind the tower stack until `shutdown` resolves, then drain open connections.
pub async fn serve<F>(
    listener: TcpListener,
    routes: F,
    limits: HttpLimits,
    metrics: crate::metrics::Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    let service = per_request(routes, &limits, metrics);
    // Every connection's task: the drain waits for them (each closes gracefully once the drain begins).
    let connections = tokio_util::task::TaskTracker::new();
    // Set when the drain begins: a connection that has sent nothing yet is closed then, not waited for.
    let draining = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut warnings = CapWarnings::default();
    loop {
        let Some(slot) = next_slot(&slots, &mut shutdown, &mut warnings, limits.max_connections).await else { break };
        let Some((stream, peer)) = next_connection(&listener, &mut shutdown, &mut warnings).await else { break };
        // Answers are often written in pieces (an SSE answer: head, events, end): with Nagle's algorithm on, a
        // piece waits for the client's delayed ACK, up to 40 ms (benches/matrix.rs saw p99 = 44 ms at
        // concurrency 1). Every write goes out at once instead.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "TCP_NODELAY could not be set on a connection");
        }
        // What the connection has in flight, and since when it has had nothing.
        let activity = Arc::new(Activity::new());
        let with_peer = with_peer(service.clone(), peer, activity.clone());
        let connection = Connection { peer, activity, limits, drain: draining.clone() };
        connections.spawn(async move {
            let _slot = slot;
            connection.serve(stream, with_peer).await;
        });
    }
    drop(listener);
    draining.cancel();
    connections.close();
    connections.wait().await;
}

/// The service every connection shares. Each request, in one future (`answer`): its request id and span, a place
/// under the global limit, its deadline, its metrics, and the id on its answer. Six tower and tower-http layers did
/// this in as many futures, and entered the span again for each frame of the body: 136.1k → 129.3k instructions per
/// proxied call without them (docs/performance-history.md, 2026-12-01 19:30). The span covers the request until its
/// answer's head.
fn per_request<F>(
    routes: F,
    limits: &HttpLimits,
    metrics: crate::metrics::Metrics,
) -> impl tower::Service<Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
       + Clone
       + Send
       + 'static
where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    // Shared by every connection: one limit for the whole satellite.
    let places = Arc::new(Semaphore::new(limits.max_concurrent_requests));
    let routes = warp::service(routes);
    let (request_timeout, body_read_timeout) = (limits.request_timeout, limits.body_read_timeout);
    tower::service_fn(move |request: Request<Incoming>| {
        let (routes, places, metrics) = (routes.clone(), places.clone(), metrics.clone());
        let request_id = request_id(&request);
        // The path, never the query: `?token=` does not reach the log.
        let span = info_span!("http", method = %request.method(), path = %request.uri().path(),
            request_id = %request_id.to_str().unwrap_or("-"));
        let admission = Admission { places, request_timeout, body_read_timeout, metrics };
        answer(routes, admission, request, request_id).instrument(span)
    })
}

/// `service` for the requests of one connection: each carries the peer's address, for client tracking and audit
/// events, and counts as activity until its answer has ended (an SSE answer, until its stream does).
fn with_peer<S, B>(
    service: S,
    peer: SocketAddr,
    activity: Arc<Activity>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = hyper::Response<Tracked<B>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    S: tower::Service<Request<Incoming>, Response = hyper::Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    tower::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(PeerAddr(peer));
        let busy = Busy::new(&activity);
        let answer = service.clone().oneshot(request);
        async move {
            let mut response = answer.await?;
            let span = response.extensions_mut().remove::<tracing::Span>();
            Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy, span }))
        }
    })
}

/// What every request shares: the places under the global limit, the deadline, the metrics.
struct Admission {
    places: Arc<Semaphore>,
    request_timeout: Duration,
    body_read_timeout: Duration,
    metrics: crate::metrics::Metrics,
}

/// One request's answer: refused at once with 503 when there is no place under the global limit (load shedding,
/// never a queue), the place held until its answer's head; routed (`routed`); counted; its id on the answer.
async fn answer<S>(
    mut routes: S,
    admission: Admission,
    request: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<Response, Infallible>
where
    S: tower::Service<Request<Timed<Incoming>>, Response = Response, Error = Infallible>,
{
    let Admission { places, request_timeout, body_read_timeout, metrics } = admission;
    // Counted here, outside the limit, so requests shed with 503 are counted too.
    let (route, method, began) = (route_label(request.uri().path()), request.method().clone(), Instant::now());
    debug!(target: ACCESS_LOG, "started processing request");
    let mut response = match two_authorizations(&request) {
        Some(refused) => refused,
        None => match places.try_acquire_owned() {
            Ok(_place) => routed(&mut routes, request, request_timeout, body_read_timeout).await,
            Err(_) => refusal(McpError::Overloaded),
        },
    };
    let status = response.status().as_u16();
    metrics.http_request(route, method.as_str(), status, began.elapsed());
    // A 5xx is not an operator's problem by itself: `/readyz` answers 503 while starting, a full satellite sheds
    // load with 503 (counted in /metrics), and real failures are logged where they happen, with context.
    debug!(target: ACCESS_LOG, status, latency_ms = began.elapsed().as_millis() as u64, "finished processing request");
    response.headers_mut().entry(X_REQUEST_ID).or_insert(request_id);
    // A stream's body is the rest of its request: what is logged while it is sent carries the request's span (and
    // the exported span lasts as long as the stream). A whole answer needs no span to be sent.
    if is_stream(&response) {
        response.extensions_mut().insert(tracing::Span::current());
    }
    Ok(response)
}

/// The routes' answer to an admitted request: routed noting what the routes of its path take (for the `Allow` of a
/// 405), its body read under the body-read timeout (408 when it did not come whole in time, whatever the route
/// made of the failed read); 504 past the request's deadline.
async fn routed<S>(
    routes: &mut S,
    request: Request<Incoming>,
    request_timeout: Duration,
    body_read_timeout: Duration,
) -> Response
where
    S: tower::Service<Request<Timed<Incoming>>, Response = Response, Error = Infallible>,
{
    let (method, version) = (request.method().clone(), request.version());
    let request = request.map(|body| Timed::new(body, body_read_timeout));
    let routing = super::allow::noting(&method, tower::Service::call(routes, request));
    match tokio::time::timeout(request_timeout, body_deadline::watching(routing)).await {
        Ok((_, true)) => body_deadline::timed_out(version, body_read_timeout),
        Ok((Ok(response), false)) => response,
        Ok((Err(never), _)) => match never {},
        Err(_) => refusal(McpError::GatewayTimeout),
    }
}

/// At most one warning per `CAP_WARNING_INTERVAL` while connections are refused for lack of room or descriptors.
#[derive(Default)]
struct CapWarnings {
    last: Option<Instant>,
}

impl CapWarnings {
    fn warn(&mut self, message: &str, detail: String) {
        if self.last.is_none_or(|at| at.elapsed() >= CAP_WARNING_INTERVAL) {
            self.last = Some(Instant::now());
            warn!(detail = %detail, "{message}");
        }
    }
}

/// A connection slot, or `None` once `shutdown` resolves: when all are taken, new clients wait in the listen
/// backlog instead of costing a descriptor each.
async fn next_slot(
    slots: &Arc<Semaphore>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    warnings: &mut CapWarnings,
    max_connections: usize,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    warnings.warn(
        "connection limit reached, new connections wait until one closes; raise SATELLITE_MAX_CONNECTIONS (and the open-file limit, LimitNOFILE) if this is legitimate load",
        format!("max_connections={max_connections}"),
    );
    tokio::select! {
        _ = shutdown => None,
        slot = slots.clone().acquire_owned() => slot.ok(),
    }
}

/// The next connection, or `None` once `shutdown` resolves.
async fn next_connection(
    listener: &TcpListener,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    warnings: &mut CapWarnings,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = &mut *shutdown => return None,
            accepted = listener.accept() => match accepted {
                Ok(pair) => return Some(pair),
                Err(err) => {
                    warnings.warn(
                        "accepting connections fails; check the open-file limit (LimitNOFILE) and SATELLITE_MAX_CONNECTIONS",
                        err.to_string(),
                    );
                    // Out of descriptors and similar: give the system a moment instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// One accepted connection: its peer, what it has in flight, the limits it is held to, and the drain.
struct Connection {
    peer: SocketAddr,
    activity: Arc<Activity>,
    limits: HttpLimits,
    drain: CancellationToken,
}

impl Connection {
    /// Serve the connection's requests with `service` until it ends, is idle, or the drain closes it.
    async fn serve<S, B>(self, stream: TcpStream, service: S)
    where
        S: tower::Service<Request<Incoming>, Response = hyper::Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if !first_byte(&stream, self.limits.header_read_timeout, &self.drain, self.peer).await {
            return;
        }
        self.activity.quiet_now();
        // A write pending past the write timeout (the client's window and the socket's buffer full) fails, and with
        // it the connection: what it held (the answer, a place, a descriptor) is let go.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(self.limits.write_timeout));
        let builder = connection_builder(self.limits.header_read_timeout);
        let connection =
            builder.serve_connection_with_upgrades(TokioIo::new(Box::pin(stream)), TowerToHyperService::new(service));
        // Its wakes of itself fold into its poll (wakes.rs): a request made alone no longer wakes the runtime's
        // other worker for nothing.
        self.run(super::wakes::Coalesced::new(connection.into_owned())).await;
    }

    /// Drive `connection` until it ends. A connection with nothing in flight for the header timeout is not kept
    /// either: one that has sent a byte but no whole request (hyper's HTTP/1 header timer starts only once the auto builder has
    /// told HTTP/1 from HTTP/2, and the HTTP/2 side has no timer at all, so one byte of the HTTP/2 preface held a
    /// place for ever), or an HTTP/2 connection idle after its requests (its peer answering pings kept it open for
    /// ever, where an idle HTTP/1 keep-alive connection is closed after the same timeout). Closed gracefully (what
    /// is being sent is sent whole; HTTP/2 says GOAWAY) when the drain begins or the connection is idle; one that
    /// never sent a whole request is dropped at once, as it always was.
    async fn run<C>(&self, mut connection: super::wakes::Coalesced<C>)
    where
        C: GracefulConnection<Error: std::fmt::Display>,
    {
        let peer = self.peer;
        let idle = self.activity.idle_for(self.limits.header_read_timeout);
        tokio::pin!(idle);
        let mut closing = false;
        loop {
            tokio::select! {
                ended = &mut connection => {
                    if let Err(err) = ended {
                        debug!(error = %err, "connection ended with an error");
                    }
                    break;
                }
                _ = self.drain.cancelled(), if !closing => {
                    closing = true;
                    connection.inner_mut().graceful_shutdown();
                }
                () = &mut idle, if !closing => {
                    if !self.activity.seen.load(std::sync::atomic::Ordering::Acquire) {
                        debug!(peer = %peer, "connection sent no whole request within the header timeout, closed");
                        break;
                    }
                    debug!(peer = %peer, "connection had nothing in flight for the header timeout, closing");
                    closing = true;
                    connection.inner_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Whether the connection sent a first byte within the header timeout (and before the drain began). A connection
/// that sends nothing is closed like a half-sent head: hyper's header timer starts only with the first byte (the
/// auto builder first waits to tell HTTP/1 from HTTP/2), so silent connections were held for ever and a cap full of
/// them starved every client (benches/storm.rs). Nor does one hold the drain: a client's spare pooled connection
/// used to delay every stop by the whole header timeout.
async fn first_byte(stream: &TcpStream, timeout: Duration, drain: &CancellationToken, peer: SocketAddr) -> bool {
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(timeout, stream.peek(&mut first)) => peeked,
        _ = drain.cancelled() => return false,
    };
    match peeked {
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
        Err(_) => {
            debug!(peer = %peer, "connection sent nothing within the header timeout, closed");
            false
        }
    }
}

/// HTTP/1 and HTTP/2 on one port. Half-sent requests and idle keep-alive connections are closed after the header
/// timeout; an HTTP/2 connection whose peer stops answering pings is closed too.
fn connection_builder(header_read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(header_read_timeout);
    builder
}

#[cfg(test)]
mod route_label_tests {
    use super::{route_label, two_authorizations};

    /// A second `Authorization` header is refused with 400, in the shape of the route's own errors; one, or none,
    /// goes on to the routes. Before, the first header was served.
    #[test]
    fn two_authorization_headers_are_refused_on_every_route() {
        let request = |path: &str, count: usize| {
            let mut builder = warp::http::Request::builder().uri(path);
            for n in 0..count {
                builder = builder.header("authorization", format!("Bearer token-{n}"));
            }
            builder.body(()).expect("a request")
        };
        for path in ["/mcp", "/i/alice-demo/mcp", "/sse", "/message?session=x", "/api/analytics/summary"] {
            assert!(two_authorizations(&request(path, 0)).is_none(), "{path}");
            assert!(two_authorizations(&request(path, 1)).is_none(), "{path}");
            let refused = two_authorizations(&request(path, 2)).expect("refused");
            assert_eq!(refused.status(), warp::http::StatusCode::BAD_REQUEST, "{path}");
        }
    }

    #[test]
    fn labels_are_templates_and_anything_else_is_other() {
        assert_eq!(route_label("/mcp"), "/mcp");
        assert_eq!(route_label("/i/alice-github/mcp"), "/i/{path}/mcp");
        assert_eq!(route_label("/i/alice-github/mcp/extra"), "other", "only the exact template");
        assert_eq!(route_label("/i/mcp"), "other");
        assert_eq!(route_label("/api/analytics/summary"), "/api/analytics/*");
        assert_eq!(route_label("/.well-known/oauth-protected-resource/mcp"), "/.well-known/*");
        assert_eq!(route_label("/made/up/path-123"), "other");
    }
}
