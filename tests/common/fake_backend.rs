//! A fake DeployStack backend (BP §13) for tests: a warp server on 127.0.0.1:0 that serves the backend protocol
//! strictly, validates every request body against the JSON Schemas in `proto/` (400 and a recorded violation
//! when one does not conform), records every call, and can be scripted to fail, slow down, go down and come
//! back on the same port.
//!
//! ```ignore
//! let backend = FakeBackend::start().await;
//! backend.push_command(Command::new("c1", Priority::Immediate, CommandKind::Configure(Default::default())));
//! backend.fail_next(Endpoint::Events, 500, 2);
//! // … run a satellite against backend.url() …
//! backend.assert_no_violations();
//! ```

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use satellite::backend::wire::{
    Command, CommandKind, CommandResult, ConfigResponse, EventEnvelope, OAuthToken, OAuthTokenRequest,
    OAuthTokenStatus, PollingMode, Priority,
};
use satellite::events::EventKind;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use warp::http::{HeaderMap, Method, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::answer_style::{shape, AnswerStyle};
use super::repo_path;

/// The backend's endpoints (BP §0.1; E11 is not served).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Health,
    Register,
    Heartbeat,
    Commands,
    CommandResult,
    Config,
    Events,
    Introspect,
    TokenStatus,
    TokenRetrieve,
    /// E11 `GET …/github-token/{installation_id}`.
    GithubToken,
    /// Not the backend: the GitHub tarball endpoint the tests point `DEPLOYSTACK_GITHUB_TARBALL_URL` at,
    /// `GET /github/{owner}/{repo}/tarball/{sha}` with an installation token.
    Tarball,
    /// Any other method or path: 404.
    Unknown,
}

/// A scripted misbehaviour for the next request(s) to an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with an error body; the request is not processed.
    Status(u16),
    /// Answer this status (429, 503) with an error body and `Retry-After: <value>`; the request is not processed.
    RetryAfter(u16, String),
    /// [`Fault::RetryAfter`] with an HTTP-date this long after the answer (whole seconds, so up to 1 s less).
    RetryAt(u16, Duration),
    /// Answer 200 with a body that is not JSON; the request is not processed.
    Garbage,
    /// Process the request, then answer 200 with the first half of the real body.
    Truncated,
    /// Process the request, then answer 200 and end the connection in the middle of the body, as when a proxy or
    /// the network cuts it.
    CutConnection,
}

/// One request as the fake saw it. The `authorization` header is recorded as `Bearer <redacted>`.
#[derive(Debug, Clone)]
pub struct Call {
    pub endpoint: Endpoint,
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: BTreeMap<String, String>,
    /// The JSON body; `Null` when empty, a string when it was not JSON.
    pub body: Value,
    pub at: SystemTime,
    /// The status answered.
    pub status: u16,
}

/// A request that broke the protocol: a body failing its schema, a missing header, an event failing its payload
/// schema.
#[derive(Debug, Clone)]
pub struct Violation {
    pub endpoint: Endpoint,
    pub what: String,
    pub errors: Vec<String>,
    pub body: Value,
}

/// What introspection answers for a client token (BP §10).
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub user_id: String,
    pub username: String,
    pub team_id: String,
    pub team_name: String,
    pub team_role: String,
    pub team_permissions: Vec<String>,
    pub scopes: Vec<String>,
    pub client_id: String,
    /// `["deploystack:mcp:satellite"]` by default, as the real backend issues (BP §10, OQ-14).
    pub aud: Option<Vec<String>>,
    /// `false`: answered `{active:false, …}` like an expired token.
    pub active: bool,
}

impl TokenInfo {
    /// An active token of `user` in `team` with the default grant (`mcp:read mcp:tools:execute offline_access`).
    pub fn new(user: &str, team: &str) -> Self {
        Self {
            user_id: user.into(),
            username: user.into(),
            team_id: team.into(),
            team_name: team.into(),
            team_role: "team_user".into(),
            team_permissions: vec!["mcp.servers.use".into()],
            scopes: ["mcp:read", "mcp:tools:execute", "offline_access"].map(String::from).to_vec(),
            client_id: "dyn_fake_client".into(),
            aud: Some(vec!["deploystack:mcp:satellite".into()]),
            active: true,
        }
    }

    pub fn with_aud(mut self, aud: &[&str]) -> Self {
        self.aud = Some(aud.iter().map(|a| a.to_string()).collect());
        self
    }

    /// No `aud` at all (accepted, OQ-14).
    pub fn without_aud(mut self) -> Self {
        self.aud = None;
        self
    }

    pub fn inactive(mut self) -> Self {
        self.active = false;
        self
    }
}

/// The identity a registration hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub satellite_id: String,
    pub api_key: String,
}

#[derive(Debug, Clone)]
struct RegisteredSatellite {
    id: String,
    name: String,
    api_key: String,
    satellite_type: &'static str,
    team_id: Option<String>,
    active: bool,
}

#[derive(Debug, Clone)]
struct Issued {
    command: Command,
    results: Vec<CommandResult>,
    /// Delivered as it is instead of `command` (a malformed command; `command` then holds only its id).
    raw: Option<Value>,
}

struct OAuthGrant {
    status: OAuthTokenStatus,
    token: Option<OAuthToken>,
}

#[derive(Default)]
struct State {
    /// The port the fake listens on (its tarball downloads redirect to `localhost` on it: another origin).
    port: u16,
    /// Registration token → consumed.
    registration_tokens: HashMap<String, bool>,
    registration_errors: VecDeque<(u16, String)>,
    satellites: Vec<RegisteredSatellite>,
    commands: Vec<Issued>,
    results: Vec<CommandResult>,
    poll_hint: Option<(PollingMode, u64)>,
    config: Value,
    events: Vec<EventEnvelope>,
    tokens: HashMap<String, TokenInfo>,
    oauth: HashMap<OAuthTokenRequest, OAuthGrant>,
    calls: Vec<Call>,
    violations: Vec<Violation>,
    faults: HashMap<Endpoint, VecDeque<Fault>>,
    latency: Duration,
    latency_for: HashMap<Endpoint, Duration>,
    /// Answers of these endpoints wait this long after the request was processed (a slow backend that stores
    /// what a client gave up waiting for).
    answer_delay_for: HashMap<Endpoint, Duration>,
    event_counter: u64,
    /// `data.event_id`s of the events stored, and how many events came again with an id already stored (BP §8,
    /// the dedupe key: stored once, answered as processed).
    event_ids: HashSet<String>,
    duplicate_events: u64,
    /// How 2xx answers are worded.
    style: AnswerStyle,
    /// GitHub-deployed installations → the installation token E11 hands out.
    github: HashMap<String, String>,
    /// (`owner/repo`, sha) → a gzipped tarball.
    tarballs: HashMap<(String, String), Vec<u8>>,
}

struct Shared {
    state: Mutex<State>,
    schemas: HashMap<String, jsonschema::Validator>,
    /// Requests being answered now (a dropped connection drops its request: it is not answered).
    in_flight: std::sync::atomic::AtomicUsize,
}

/// Counts one request in flight until dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The fake backend; dropping it stops the server.
pub struct FakeBackend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Mutex<Option<JoinHandle<()>>>,
}

/// A compiled schema from `proto/`, e.g. `proto_validator("heartbeat-request")`.
pub fn proto_validator(name: &str) -> jsonschema::Validator {
    let path = repo_path("proto").join(format!("{name}.schema.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let schema: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    jsonschema::validator_for(&schema).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Every validation error as `message at /path`; empty when `value` conforms.
pub fn schema_errors(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator.iter_errors(value).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

/// Every schema in `proto/`, by name without `.schema.json`.
fn load_schemas() -> HashMap<String, jsonschema::Validator> {
    let mut schemas = HashMap::new();
    for entry in std::fs::read_dir(repo_path("proto")).expect("proto/ exists") {
        let file = entry.expect("proto/ entry").file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".schema.json") {
            schemas.insert(name.to_owned(), proto_validator(name));
        }
    }
    schemas
}

impl FakeBackend {
    /// The registration token accepted out of the box (global scope, single use).
    pub const REGISTRATION_TOKEN: &'static str = "deploystack_satellite_global_fake0registration0token";

    pub async fn start() -> FakeBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake backend");
        let addr = listener.local_addr().expect("local addr");
        let mut state = State { config: json!({"mcp_servers": {}}), port: addr.port(), ..State::default() };
        state.registration_tokens.insert(Self::REGISTRATION_TOKEN.into(), false);
        let shared =
            Arc::new(Shared { state: Mutex::new(state), schemas: load_schemas(), in_flight: Default::default() });
        let server = tokio::spawn(serve(listener, shared.clone()));
        FakeBackend { shared, addr, server: Mutex::new(Some(server)) }
    }

    /// `http://127.0.0.1:<port>`, the value of `DEPLOYSTACK_BACKEND_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    // --- identity

    /// Accept another registration token (`deploystack_satellite_global_…` or `…_team_…`), single use.
    pub fn add_registration_token(&self, token: &str) {
        self.shared.state.lock().registration_tokens.insert(token.into(), false);
    }

    /// The next registration answers `status` with this §2.3 error code (e.g. 401, `token_expired`).
    pub fn fail_registration(&self, status: u16, code: &str) {
        self.shared.state.lock().registration_errors.push_back((status, code.into()));
    }

    /// A satellite registered (and activated by a heartbeat) before the test began: stored credentials.
    pub fn register_directly(&self, name: &str) -> Credentials {
        let mut state = self.shared.state.lock();
        let credentials = upsert_satellite(&mut state, name, "global", None);
        if let Some(satellite) = state.satellites.iter_mut().find(|s| s.id == credentials.satellite_id) {
            satellite.active = true;
        }
        credentials
    }

    /// The api key stops working, as after a re-registration elsewhere.
    pub fn revoke_api_key(&self, satellite_id: &str) {
        let mut state = self.shared.state.lock();
        if let Some(satellite) = state.satellites.iter_mut().find(|s| s.id == satellite_id) {
            satellite.api_key = format!("revoked-{}", uuid::Uuid::new_v4().simple());
        }
    }

    /// Whether the satellite has heartbeated (BP §2.2: inactive satellites get no commands).
    pub fn is_active(&self, satellite_id: &str) -> bool {
        self.shared.state.lock().satellites.iter().any(|s| s.id == satellite_id && s.active)
    }

    // --- commands

    /// Queue a command; it is delivered on every poll until a result for it arrives (BP §4.3).
    /// Make `installation_id` a GitHub deployment: E11 hands out a token for it.
    pub fn add_github_installation(&self, installation_id: &str) {
        self.shared.state.lock().github.insert(installation_id.into(), format!("ghs_fake_{installation_id}"));
    }

    /// Serve `tarball` (gzipped) as `repo` (`owner/repo`) at `sha`, to holders of an installation token.
    pub fn add_tarball(&self, repo: &str, sha: &str, tarball: Vec<u8>) {
        self.shared.state.lock().tarballs.insert((repo.into(), sha.into()), tarball);
    }

    /// The base URL of the served tarballs, for `DEPLOYSTACK_GITHUB_TARBALL_URL`.
    pub fn tarball_base(&self) -> String {
        format!("{}/github", self.url())
    }

    /// Word every 2xx answer from now on as `style` (the real backend's by default).
    pub fn set_style(&self, style: AnswerStyle) {
        self.shared.state.lock().style = style;
    }

    pub fn push_command(&self, command: Command) {
        self.shared.state.lock().commands.push(Issued { command, results: Vec::new(), raw: None });
    }

    /// A command delivered exactly as given, however malformed (a `null` type, a numeric id, not an object at
    /// all), until a result names its `id` (as text); one without an id is delivered for ever.
    pub fn push_raw_command(&self, raw: Value) {
        let id = match &raw["id"] {
            Value::String(id) => id.clone(),
            Value::Number(id) => id.to_string(),
            _ => String::new(),
        };
        let kind = CommandKind::Unknown { command_type: String::new(), payload: Value::Null };
        let priority = serde_json::from_value(raw["priority"].clone()).ok();
        let command = Command { id, priority, correlation_id: None, kind };
        self.shared.state.lock().commands.push(Issued { command, results: Vec::new(), raw: Some(raw) });
    }

    /// Answer every poll with this mode and interval instead of deriving them (BP §4.2); `None` derives again.
    pub fn set_poll_hint(&self, hint: Option<(PollingMode, u64)>) {
        self.shared.state.lock().poll_hint = hint;
    }

    /// Ids of the commands still delivered by a poll, oldest first.
    pub fn pending_commands(&self) -> Vec<String> {
        let state = self.shared.state.lock();
        state.commands.iter().filter(|c| c.results.is_empty()).map(|c| c.command.id.clone()).collect()
    }

    /// Every result posted for a known command, in arrival order.
    pub fn results(&self) -> Vec<CommandResult> {
        self.shared.state.lock().results.clone()
    }

    /// The results posted for one command, in arrival order.
    pub fn results_for(&self, command_id: &str) -> Vec<CommandResult> {
        let state = self.shared.state.lock();
        state.commands.iter().find(|c| c.command.id == command_id).map(|c| c.results.clone()).unwrap_or_default()
    }

    // --- config

    pub fn set_config(&self, config: &ConfigResponse) {
        self.set_config_raw(serde_json::to_value(config).expect("a config serializes"));
    }

    /// Any JSON at all, for oversized or malformed configs.
    pub fn set_config_raw(&self, config: Value) {
        self.shared.state.lock().config = config;
    }

    // --- tokens

    /// Introspection of `token` answers `info` (BP §10); unknown tokens are inactive.
    pub fn add_token(&self, token: &str, info: TokenInfo) {
        self.shared.state.lock().tokens.insert(token.into(), info);
    }

    pub fn remove_token(&self, token: &str) {
        self.shared.state.lock().tokens.remove(token);
    }

    /// tokens/status answers `status` and tokens/retrieve `token` (404 when `None`) for this key (BP §11).
    pub fn add_oauth_token(&self, key: OAuthTokenRequest, status: OAuthTokenStatus, token: Option<OAuthToken>) {
        self.shared.state.lock().oauth.insert(key, OAuthGrant { status, token });
    }

    // --- failures

    /// The next `n` requests to `endpoint` get `status` (401, 404, 429, 500, …) and are not processed.
    pub fn fail_next(&self, endpoint: Endpoint, status: u16, n: usize) {
        self.fault_next(endpoint, Fault::Status(status), n);
    }

    pub fn fault_next(&self, endpoint: Endpoint, fault: Fault, n: usize) {
        let mut state = self.shared.state.lock();
        let queue = state.faults.entry(endpoint).or_default();
        queue.extend(std::iter::repeat_n(fault, n));
    }

    /// Every answer waits this long first.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.state.lock().latency = latency;
    }

    /// Answers of one endpoint wait this long (instead of the global latency).
    pub fn set_latency_for(&self, endpoint: Endpoint, latency: Duration) {
        self.shared.state.lock().latency_for.insert(endpoint, latency);
    }

    /// Requests to `endpoint` are processed at once, and answered `delay` later: a slow backend, which stores a batch
    /// even when the client gave up waiting for the answer.
    pub fn set_answer_delay_for(&self, endpoint: Endpoint, delay: Duration) {
        self.shared.state.lock().answer_delay_for.insert(endpoint, delay);
    }

    /// Events that arrived again with a `data.event_id` already stored (not stored twice).
    pub fn duplicate_events(&self) -> u64 {
        self.shared.state.lock().duplicate_events
    }

    /// Stop listening and cut every open connection: new connections are refused.
    pub async fn go_down(&self) {
        let server = self.server.lock().take();
        if let Some(server) = server {
            server.abort();
            let _ = server.await;
        }
    }

    /// Listen again on the same port, with the same state.
    pub async fn come_back(&self) {
        self.go_down().await;
        let listener = TcpListener::bind(self.addr).await.expect("rebind the fake backend's port");
        *self.server.lock() = Some(tokio::spawn(serve(listener, self.shared.clone())));
    }

    // --- what happened

    /// Requests being answered right now (held by a latency, say).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn calls(&self, endpoint: Endpoint) -> Vec<Call> {
        self.shared.state.lock().calls.iter().filter(|c| c.endpoint == endpoint).cloned().collect()
    }

    pub fn all_calls(&self) -> Vec<Call> {
        self.shared.state.lock().calls.clone()
    }

    /// Bodies of the heartbeats answered 200, in order.
    pub fn heartbeats(&self) -> Vec<Value> {
        self.calls(Endpoint::Heartbeat).into_iter().filter(|c| c.status == 200).map(|c| c.body).collect()
    }

    /// Every event accepted, in arrival order.
    pub fn events(&self) -> Vec<EventEnvelope> {
        self.shared.state.lock().events.clone()
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.shared.state.lock().violations.clone()
    }

    /// The violations so far, forgetting them (for tests that provoke some on purpose).
    pub fn take_violations(&self) -> Vec<Violation> {
        std::mem::take(&mut self.shared.state.lock().violations)
    }

    pub fn assert_no_violations(&self) {
        let violations = self.violations();
        assert!(violations.is_empty(), "the satellite broke the backend protocol: {violations:#?}");
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        if let Some(server) = self.server.lock().take() {
            server.abort();
        }
    }
}

/// The accept loop. Its connections live in a `JoinSet` owned by this task, so aborting it closes them all.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let service =
            TowerToHyperService::new(tower::ServiceExt::<warp::http::Request<hyper::body::Incoming>>::map_response(
                warp::service(routes(shared.clone())),
                cut_where_marked,
            ));
        connections.spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
        while connections.try_join_next().is_some() {}
    }
}

/// The header marking an answer whose body `cut_where_marked` cuts (it never reaches the satellite).
const CUT_MARK: &str = "x-fake-backend-cut";

type FakeBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Every answer as warp made it, except one marked with [`CUT_MARK`]: its status, its headers and the first half
/// of its body go out, and then the body fails, so hyper ends the connection with the body unfinished (a chunked
/// body without its last chunk), as a proxy or the network cutting an answer would.
fn cut_where_marked(response: Response) -> warp::http::Response<FakeBody> {
    use http_body_util::BodyExt;
    let (mut parts, body) = response.into_parts();
    if parts.headers.remove(CUT_MARK).is_none() {
        let body = body.map_err(|err| Box::new(err) as Box<dyn std::error::Error + Send + Sync>).boxed_unsync();
        return warp::http::Response::from_parts(parts, body);
    }
    parts.headers.remove("content-length");
    let frames: Vec<Result<hyper::body::Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
        Ok(hyper::body::Frame::data(Bytes::from_static(b"{\"success\":tr"))),
        Err(Box::new(std::io::Error::other("cut"))),
    ];
    // Each frame a moment after the last, so the status and the first frame are on the wire before the cut.
    let frames = futures::StreamExt::then(futures::stream::iter(frames), |frame| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        frame
    });
    warp::http::Response::from_parts(parts, http_body_util::StreamBody::new(frames).boxed_unsync())
}

fn routes(shared: Arc<Shared>) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone + Send + Sync {
    let query = warp::query::raw().or(warp::any().map(String::new)).unify();
    warp::method().and(warp::path::full()).and(query).and(warp::header::headers_cloned()).and(warp::body::bytes()).then(
        move |method: Method, path: warp::path::FullPath, query: String, headers: HeaderMap, body: Bytes| {
            let shared = shared.clone();
            async move { handle(shared, method, path.as_str().to_owned(), query, headers, body).await }
        },
    )
}

/// `(endpoint, satellite id in the path)`.
fn classify(method: &Method, path: &str) -> (Endpoint, Option<String>) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let endpoint = match (method.as_str(), segments.as_slice()) {
        ("GET", ["api", "health"]) => Endpoint::Health,
        ("POST", ["api", "satellites", "register"]) => Endpoint::Register,
        ("POST", ["api", "oauth2", "introspect"]) => Endpoint::Introspect,
        ("POST", ["api", "satellites", _, "heartbeat"]) => Endpoint::Heartbeat,
        ("GET", ["api", "satellites", _, "commands"]) => Endpoint::Commands,
        ("POST", ["api", "satellites", _, "command-result"]) => Endpoint::CommandResult,
        ("GET", ["api", "satellites", _, "config"]) => Endpoint::Config,
        ("POST", ["api", "satellites", _, "events"]) => Endpoint::Events,
        ("POST", ["api", "satellites", _, "tokens", "status"]) => Endpoint::TokenStatus,
        ("POST", ["api", "satellites", _, "tokens", "retrieve"]) => Endpoint::TokenRetrieve,
        ("GET", ["api", "satellites", _, "github-token", _]) => Endpoint::GithubToken,
        ("GET", ["github", _, _, "tarball", _]) => Endpoint::Tarball,
        _ => Endpoint::Unknown,
    };
    let sid = match segments.as_slice() {
        ["api", "satellites", sid, _, ..] if !matches!(endpoint, Endpoint::Unknown | Endpoint::Tarball) => {
            Some(sid.to_string())
        }
        _ => None,
    };
    (endpoint, sid)
}

enum Body {
    Json(Value),
    Raw(String),
    Bytes(Vec<u8>),
    /// A redirect to this URL.
    Redirect(String),
    /// This text, then the connection ends before the body does.
    CutShort(String),
}

struct Answer {
    status: u16,
    body: Body,
}

impl Answer {
    fn json(status: u16, body: Value) -> Self {
        Self { status, body: Body::Json(body) }
    }
    fn error(status: u16, error: &str) -> Self {
        Self::json(status, json!({"success": false, "error": error}))
    }
}

/// Fastify's default `bodyLimit` (1 MiB), which the real backend keeps.
pub const BODY_LIMIT: usize = 1024 * 1024;

async fn handle(
    shared: Arc<Shared>,
    method: Method,
    path: String,
    query: String,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let _in_flight = InFlight(&shared.in_flight);
    let (endpoint, sid) = classify(&method, &path);
    let delay = {
        let state = shared.state.lock();
        state.latency_for.get(&endpoint).copied().unwrap_or(state.latency)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let parsed = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);

    let fault = shared.state.lock().faults.get_mut(&endpoint).and_then(VecDeque::pop_front);
    let retry_after = match &fault {
        Some(Fault::RetryAfter(_, value)) => Some(value.clone()),
        Some(Fault::RetryAt(_, after)) => {
            let at = chrono::Utc::now() + chrono::Duration::from_std(*after).unwrap_or_default();
            Some(at.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
        }
        _ => None,
    };
    let answer = match fault {
        // The real backend is a Fastify server with its default body limit: a bigger body is refused, unread.
        _ if body.len() > BODY_LIMIT => Answer::json(
            413,
            json!({"statusCode": 413, "code": "FST_ERR_CTP_BODY_TOO_LARGE", "error": "Payload Too Large",
                   "message": "Request body is too large"}),
        ),
        Some(Fault::Status(status) | Fault::RetryAfter(status, _) | Fault::RetryAt(status, _)) => {
            Answer::error(status, &format!("scripted failure {status}"))
        }
        Some(Fault::Garbage) => Answer { status: 200, body: Body::Raw("<html>502 Bad Gateway</html>".into()) },
        Some(fault @ (Fault::Truncated | Fault::CutConnection)) => {
            let answer = dispatch(&shared, endpoint, sid.as_deref(), &path, &query, bearer.as_deref(), &parsed);
            let text = match answer.body {
                Body::Json(value) => value.to_string(),
                Body::Raw(text) => text,
                Body::Bytes(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Body::Redirect(url) | Body::CutShort(url) => url,
            };
            let cut: String = text.chars().take(text.chars().count() / 2).collect();
            match fault {
                Fault::CutConnection => Answer { status: 200, body: Body::CutShort(cut) },
                _ => Answer { status: 200, body: Body::Raw(cut) },
            }
        }
        None => {
            let answer = dispatch(&shared, endpoint, sid.as_deref(), &path, &query, bearer.as_deref(), &parsed);
            match answer.body {
                Body::Json(value) if (200..300).contains(&answer.status) => {
                    let style = shared.state.lock().style;
                    Answer { status: answer.status, body: Body::Json(shape(style, endpoint, value)) }
                }
                body => Answer { status: answer.status, body },
            }
        }
    };

    let mut recorded = BTreeMap::new();
    for (name, value) in &headers {
        let value = if name.as_str() == "authorization" {
            "Bearer <redacted>".to_owned()
        } else {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        };
        recorded.insert(name.as_str().to_owned(), value);
    }
    {
        let mut state = shared.state.lock();
        // BP §0: Content-Type: application/json on every request, GETs too.
        let json_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json_type && !matches!(endpoint, Endpoint::Unknown | Endpoint::Tarball) {
            state.violations.push(Violation {
                endpoint,
                what: "missing Content-Type: application/json (BP §0)".into(),
                errors: Vec::new(),
                body: parsed.clone(),
            });
        }
        state.calls.push(Call {
            endpoint,
            method: method.to_string(),
            path,
            query,
            headers: recorded,
            body: parsed,
            at: SystemTime::now(),
            status: answer.status,
        });
    }

    let answer_delay = shared.state.lock().answer_delay_for.get(&endpoint).copied().unwrap_or_default();
    if !answer_delay.is_zero() {
        tokio::time::sleep(answer_delay).await;
    }
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = match answer.body {
        Body::Json(value) => warp::reply::with_status(warp::reply::json(&value), status).into_response(),
        Body::Raw(text) => {
            warp::reply::with_status(warp::reply::with_header(text, "content-type", "application/json"), status)
                .into_response()
        }
        Body::Bytes(bytes) => {
            warp::reply::with_status(warp::reply::with_header(bytes, "content-type", "application/x-gzip"), status)
                .into_response()
        }
        Body::Redirect(url) => {
            warp::reply::with_status(warp::reply::with_header(warp::reply(), "location", url), status).into_response()
        }
        Body::CutShort(text) => {
            // Cut below warp, which has no public body that can fail (`cut_where_marked`).
            let reply = warp::reply::with_header(text, CUT_MARK, "1");
            warp::reply::with_status(reply, status).into_response()
        }
    };
    if let Some(value) = retry_after.and_then(|v| warp::http::HeaderValue::from_str(&v).ok()) {
        response.headers_mut().insert("retry-after", value);
    }
    response
}

/// Check `body` against a schema; on failure record the violation and return the 400 answer.
fn validate(shared: &Shared, state: &mut State, endpoint: Endpoint, schema: &str, body: &Value) -> Option<Answer> {
    let validator = shared.schemas.get(schema).unwrap_or_else(|| panic!("proto/{schema}.schema.json is missing"));
    let errors = schema_errors(validator, body);
    if errors.is_empty() {
        return None;
    }
    state.violations.push(Violation {
        endpoint,
        what: format!("body does not match {schema}.schema.json"),
        errors: errors.clone(),
        body: body.clone(),
    });
    Some(Answer::json(
        400,
        json!({"success": false, "error": format!("Validation failed: {}", errors.join("; ")), "details": errors}),
    ))
}

/// Api-key authentication (BP §0.1): the key picks the satellite (401), then the path's id must exist (404)
/// and be that satellite (403).
fn authenticate(state: &State, sid: Option<&str>, bearer: Option<&str>) -> Result<String, Answer> {
    let Some(satellite) = bearer.and_then(|key| state.satellites.iter().find(|s| s.api_key == key)) else {
        return Err(Answer::error(401, "Invalid or missing API key"));
    };
    if let Some(sid) = sid {
        if !state.satellites.iter().any(|s| s.id == sid) {
            return Err(Answer::error(404, "Satellite not found"));
        }
        if sid != satellite.id {
            return Err(Answer::error(403, "Forbidden: satellite id does not match the API key"));
        }
    }
    Ok(satellite.id.clone())
}

fn upsert_satellite(
    state: &mut State,
    name: &str,
    satellite_type: &'static str,
    team_id: Option<String>,
) -> Credentials {
    let api_key = format!("deploystack_satellite_api_{satellite_type}_{}", uuid::Uuid::new_v4().simple());
    if let Some(existing) = state.satellites.iter_mut().find(|s| s.name == name) {
        existing.api_key = api_key.clone();
        existing.satellite_type = satellite_type;
        existing.team_id = team_id;
        return Credentials { satellite_id: existing.id.clone(), api_key };
    }
    // 15 lowercase characters, stable per name.
    let id: String = hex::encode(Sha256::digest(name.as_bytes())).chars().take(15).collect();
    state.satellites.push(RegisteredSatellite {
        id: id.clone(),
        name: name.into(),
        api_key: api_key.clone(),
        satellite_type,
        team_id,
        active: false,
    });
    Credentials { satellite_id: id, api_key }
}

fn dispatch(
    shared: &Shared,
    endpoint: Endpoint,
    sid: Option<&str>,
    path: &str,
    query: &str,
    bearer: Option<&str>,
    body: &Value,
) -> Answer {
    let mut guard = shared.state.lock();
    let state = &mut *guard;
    match endpoint {
        Endpoint::Unknown => Answer::error(404, "Not found"),
        Endpoint::Health => Answer::json(200, json!({"status": "ok"})),
        Endpoint::Register => register(shared, state, bearer, body),
        Endpoint::Tarball => {
            let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
            let (repo, sha) = (format!("{}/{}", segments[1], segments[2]), segments[4].to_owned());
            // As GitHub: the API answers a download with a redirect to another origin (codeload.github.com), whose
            // URL carries its own short-lived grant and which needs no token (the client drops it there).
            if query.contains("codeload=") {
                return match state.tarballs.get(&(repo, sha)) {
                    Some(bytes) if query.contains(&format!("codeload={}", state.port)) => {
                        Answer { status: 200, body: Body::Bytes(bytes.clone()) }
                    }
                    _ => Answer::error(404, "Not Found"),
                };
            }
            if !bearer.is_some_and(|b| state.github.values().any(|t| t == b)) {
                return Answer::error(401, "Bad credentials");
            }
            match state.tarballs.get(&(repo, sha)) {
                Some(_) => Answer {
                    status: 302,
                    body: Body::Redirect(format!("http://localhost:{port}{path}?codeload={port}", port = state.port)),
                },
                None => Answer::error(404, "Not Found"),
            }
        }
        Endpoint::Introspect => {
            if let Some(bad) = validate(shared, state, endpoint, "introspect-request", body) {
                return bad;
            }
            let token = body["token"].as_str().unwrap_or_default();
            match state.tokens.get(token) {
                Some(info) if info.active => {
                    let mut answer = json!({
                        "active": true, "sub": info.user_id, "username": info.username, "client_id": info.client_id,
                        "scope": info.scopes.join(" "), "iss": "http://fake-backend.invalid",
                        "exp": chrono::Utc::now().timestamp() + 3600, "iat": chrono::Utc::now().timestamp(),
                        "team_id": info.team_id, "team_name": info.team_name, "team_role": info.team_role,
                        "team_permissions": info.team_permissions,
                    });
                    if let Some(aud) = &info.aud {
                        answer["aud"] = json!(aud);
                    }
                    Answer::json(200, answer)
                }
                Some(_) => Answer::json(
                    200,
                    json!({"active": false, "error": "invalid_token", "error_description": "Token has expired"}),
                ),
                None => Answer::json(
                    200,
                    json!({"active": false, "error": "invalid_token", "error_description": "Token not found"}),
                ),
            }
        }
        _ => {
            let me = match authenticate(state, sid, bearer) {
                Ok(me) => me,
                Err(answer) => return answer,
            };
            match endpoint {
                Endpoint::Heartbeat => {
                    if let Some(bad) = validate(shared, state, endpoint, "heartbeat-request", body) {
                        return bad;
                    }
                    if let Some(satellite) = state.satellites.iter_mut().find(|s| s.id == me) {
                        satellite.active = true;
                    }
                    Answer::json(
                        200,
                        json!({"success": true, "message": format!("Heartbeat recorded for satellite {me}")}),
                    )
                }
                Endpoint::Commands => poll(state, &me, query, body),
                Endpoint::CommandResult => {
                    if let Some(bad) = validate(shared, state, endpoint, "command-result-request", body) {
                        return bad;
                    }
                    let Ok(result) = serde_json::from_value::<CommandResult>(body.clone()) else {
                        return Answer::error(400, "Validation failed: not a command result");
                    };
                    let Some(issued) = state.commands.iter_mut().find(|c| c.command.id == result.command_id) else {
                        return Answer::error(404, "Command not found or does not belong to this satellite");
                    };
                    let message = format!(
                        "Command {} result recorded with status: {}",
                        result.command_id,
                        result.status.as_str()
                    );
                    issued.results.push(result.clone());
                    state.results.push(result);
                    Answer::json(200, json!({"success": true, "message": message}))
                }
                Endpoint::Config => Answer::json(200, state.config.clone()),
                Endpoint::GithubToken => {
                    let installation = path.rsplit('/').next().unwrap_or_default();
                    match state.github.get(installation) {
                        Some(token) => Answer::json(
                            200,
                            json!({"token": token, "expires_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}),
                        ),
                        None => Answer::json(404, json!({"error": "Installation is not a GitHub deployment"})),
                    }
                }
                Endpoint::Events => events(shared, state, body),
                Endpoint::TokenStatus | Endpoint::TokenRetrieve => {
                    if let Some(bad) = validate(shared, state, endpoint, "oauth-token-request", body) {
                        return bad;
                    }
                    let Ok(key) = serde_json::from_value::<OAuthTokenRequest>(body.clone()) else {
                        return Answer::error(400, "Validation failed");
                    };
                    let grant = state.oauth.get(&key);
                    match (endpoint, grant) {
                        (Endpoint::TokenStatus, Some(grant)) => Answer::json(200, json!(grant.status)),
                        (Endpoint::TokenStatus, None) => Answer::json(200, json!({"exists": false})),
                        (_, Some(OAuthGrant { token: Some(token), .. })) => Answer::json(200, json!(token)),
                        _ => {
                            Answer::error(404, "OAuth tokens not found for this installation - user needs to authorize")
                        }
                    }
                }
                _ => Answer::error(404, "Not found"),
            }
        }
    }
}

fn register(shared: &Shared, state: &mut State, bearer: Option<&str>, body: &Value) -> Answer {
    fn refuse(status: u16, code: &str, message: &str) -> Answer {
        Answer::json(
            status,
            json!({"success": false, "error": code, "message": message,
                   "instructions": "Generate a new registration token in the DeployStack dashboard"}),
        )
    }
    if let Some((status, code)) = state.registration_errors.pop_front() {
        return refuse(status, &code, "scripted registration failure");
    }
    let Some(token) = bearer else {
        return refuse(401, "registration_token_required", "Authorization: Bearer <registration token> is required");
    };
    if let Some(bad) = validate(shared, state, Endpoint::Register, "register-request", body) {
        return bad;
    }
    let scope = [("deploystack_satellite_global_", "global"), ("deploystack_satellite_team_", "team")]
        .into_iter()
        .find_map(|(prefix, scope)| token.strip_prefix(prefix).filter(|rest| rest.len() >= 10).map(|_| scope));
    let Some(satellite_type) = scope else {
        return refuse(401, "invalid_registration_token", "malformed registration token");
    };
    match state.registration_tokens.get_mut(token) {
        None => return refuse(401, "invalid_registration_token", "unknown registration token"),
        Some(true) => return refuse(401, "token_already_used", "this registration token was already used"),
        Some(used) => *used = true,
    }
    let team_id = (satellite_type == "team").then(|| "fake-team".to_owned());
    let name = body["name"].as_str().unwrap_or_default();
    let credentials = upsert_satellite(state, name, satellite_type, team_id.clone());
    Answer::json(
        200,
        json!({
            "success": true,
            "satellite": {"id": credentials.satellite_id, "name": name, "satellite_type": satellite_type,
                          "team_id": team_id, "status": "inactive", "api_key": credentials.api_key},
            "message": "Satellite registered successfully. Status set to 'inactive' - admin activation required."
        }),
    )
}

/// BP §4.1-§4.2: pending commands, oldest first, up to `limit`; mode and interval from their priorities.
fn poll(state: &mut State, me: &str, query: &str, body: &Value) -> Answer {
    let params: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let limit = match params.get("limit").map(|l| l.parse::<usize>()) {
        None => 10,
        Some(Ok(limit)) if (1..=50).contains(&limit) => limit,
        Some(_) => {
            let errors = vec![format!("limit must be an integer 1-50, got {:?}", params.get("limit"))];
            state.violations.push(Violation {
                endpoint: Endpoint::Commands,
                what: "bad query".into(),
                errors: errors.clone(),
                body: body.clone(),
            });
            return Answer::json(400, json!({"success": false, "error": errors.join("; ")}));
        }
    };
    let last_poll_ok = params.get("last_poll").is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
    if !last_poll_ok {
        state.violations.push(Violation {
            endpoint: Endpoint::Commands,
            what: "last_poll missing or not an ISO timestamp (BP §4.1)".into(),
            errors: vec![format!("last_poll = {:?}", params.get("last_poll"))],
            body: body.clone(),
        });
    }
    let active = state.satellites.iter().any(|s| s.id == me && s.active);
    let issued: Vec<&Issued> =
        if active { state.commands.iter().filter(|c| c.results.is_empty()).take(limit).collect() } else { Vec::new() };
    let has = |p: Priority| issued.iter().any(|c| c.command.priority.as_ref() == Some(&p));
    let commands: Vec<Value> = issued
        .iter()
        .map(|c| c.raw.clone().unwrap_or_else(|| serde_json::to_value(&c.command).unwrap_or_default()))
        .collect();
    let (mode, interval) = if let Some((mode, interval)) = &state.poll_hint {
        (mode.clone(), *interval)
    } else if has(Priority::Immediate) {
        (PollingMode::Immediate, 2)
    } else if has(Priority::High) {
        (PollingMode::Normal, 10)
    } else if !commands.is_empty() {
        (PollingMode::Normal, 30)
    } else {
        (PollingMode::Slow, 60)
    };
    Answer::json(200, json!({"commands": commands, "polling_mode": mode, "next_poll_interval": interval}))
}

/// BP §8.1-§8.2: the envelope is all or nothing (400); each event then passes or fails alone.
fn events(shared: &Shared, state: &mut State, body: &Value) -> Answer {
    if let Some(bad) = validate(shared, state, Endpoint::Events, "events-request", body) {
        return bad;
    }
    let mut event_ids = Vec::new();
    let mut failures = Vec::new();
    let empty = Vec::new();
    for (index, raw) in body["events"].as_array().unwrap_or(&empty).iter().enumerate() {
        let event_type = raw["type"].as_str().unwrap_or_default().to_owned();
        let error = if EventKind::parse(&event_type).is_none() {
            Some(format!("Unknown event type: {event_type}"))
        } else if chrono::DateTime::parse_from_rfc3339(raw["timestamp"].as_str().unwrap_or_default()).is_err() {
            Some("Invalid event timestamp".to_owned())
        } else {
            let schema = format!("event.{event_type}");
            let validator =
                shared.schemas.get(&schema).unwrap_or_else(|| panic!("proto/{schema}.schema.json is missing"));
            let errors = schema_errors(validator, &raw["data"]);
            (!errors.is_empty()).then(|| format!("Validation failed: {}", errors.join("; ")))
        };
        match error {
            Some(error) => {
                state.violations.push(Violation {
                    endpoint: Endpoint::Events,
                    what: format!("event {index} ({event_type}) rejected"),
                    errors: vec![error.clone()],
                    body: raw.clone(),
                });
                failures.push(json!({"index": index, "type": event_type, "error": error}));
            }
            None => {
                state.event_counter += 1;
                event_ids.push(format!("evt_{}_{:09}", chrono::Utc::now().timestamp_millis(), state.event_counter));
                // The dedupe key: an event seen before is processed (answered) but not stored again.
                let id = raw["data"]["event_id"].as_str().map(str::to_owned);
                if id.as_ref().is_some_and(|id| !state.event_ids.insert(id.clone())) {
                    state.duplicate_events += 1;
                } else if let Ok(envelope) = serde_json::from_value::<EventEnvelope>(raw.clone()) {
                    state.events.push(envelope);
                }
            }
        }
    }
    let mut answer =
        json!({"success": true, "processed": event_ids.len(), "failed": failures.len(), "event_ids": event_ids});
    if !failures.is_empty() {
        answer["failures"] = Value::Array(failures);
    }
    Answer::json(200, answer)
}
