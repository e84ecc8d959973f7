//! HTTP to the backend (BP §0.1): one method per endpoint, the timeouts of
//! the endpoint table, `Content-Type: application/json` on every request,
//! `Authorization: Bearer <api key>` where required, answers read with a
//! size cap and decoded into the `wire` types. Every failure is a typed
//! `BackendError` that names the endpoint; nothing here retries or logs
//! secrets.

use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::warn;
use url::Url;

use super::credentials::Credentials;
use super::retry_after;
use super::wire::{
    self, path, Ack, CommandResult, CommandsResponse, ConfigResponse, Credential, EventsRequest, EventsResponse,
    HealthResponse, HeartbeatRequest, IntrospectRequest, IntrospectResponse, RegisterRequest, RegisterResponse,
};

/// Largest answer read (a config for thousands of instances fits); more is refused, not buffered.
pub const MAX_CONFIG_BYTES: usize = 32 * 1024 * 1024;
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{endpoint}: backend unreachable: {reason}")]
    Network { endpoint: &'static str, reason: String },
    #[error("{endpoint}: backend answered HTTP {status}: {message}")]
    Status {
        endpoint: &'static str,
        status: u16,
        /// What the answer means, decided once from the status and the backend's error body.
        refusal: Refusal,
        message: String,
        /// Boxed: the error stays small enough to return everywhere (`clippy::result_large_err`).
        body: Option<Box<wire::BackendError>>,
        /// The wait a 429 or 503 asked for in `Retry-After` (unbounded: each loop bounds it, `retry_after`).
        retry_after: Option<Duration>,
    },
    #[error("{endpoint}: backend answer is not valid: {reason}")]
    Decode { endpoint: &'static str, reason: String },
    #[error("{endpoint}: not registered with the backend yet")]
    NotRegistered { endpoint: &'static str },
    /// No answer within the request's timeout: the backend may have done what was asked and be slow to say so.
    #[error("{endpoint}: backend did not answer in time: {reason}")]
    Timeout { endpoint: &'static str, reason: String },
}

impl BackendError {
    pub fn status(&self) -> Option<u16> {
        match self {
            BackendError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// How long the backend asked to be left alone: the `Retry-After` of a 429 (or a refusal naming the rate
    /// limit) or a 503. `None` for any other answer, or a value that is no delta-seconds or HTTP-date.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BackendError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the same request may succeed later: the backend unreachable, failing (5xx) or busy (429).
    pub fn transient(&self) -> bool {
        match self {
            BackendError::Network { .. } | BackendError::Timeout { .. } => true,
            BackendError::Status { refusal, .. } => matches!(refusal, Refusal::Server | Refusal::RateLimited),
            _ => false,
        }
    }
}

/// What a non-2xx backend answer means to the caller (BP §8.3 outcome table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400, or an error naming validation: the request can never succeed as sent.
    Invalid,
    /// 401, or an error naming authorisation: the satellite's credentials were refused.
    Unauthorized,
    Forbidden,
    NotFound,
    /// 429, or an error naming the rate limit.
    RateLimited,
    /// 5xx: the backend failed; the request may succeed later.
    Server,
    /// 413: the body is more than the backend takes; the same request never succeeds.
    TooLarge,
    Other,
}

impl Refusal {
    /// BP §8.3 reads the backend's error text as well as the status; this is the one place that does.
    pub fn of(status: u16, body: Option<&wire::BackendError>) -> Self {
        let text = body
            .map(|b| format!("{} {}", b.error, b.message.as_deref().unwrap_or_default()).to_ascii_lowercase())
            .unwrap_or_default();
        match status {
            400 | 422 => Refusal::Invalid,
            401 => Refusal::Unauthorized,
            403 => Refusal::Forbidden,
            404 => Refusal::NotFound,
            429 => Refusal::RateLimited,
            413 => Refusal::TooLarge,
            _ if text.contains("validation") => Refusal::Invalid,
            _ if text.contains("unauthorized") => Refusal::Unauthorized,
            _ if text.contains("rate limit") => Refusal::RateLimited,
            500..=599 => Refusal::Server,
            _ => Refusal::Other,
        }
    }
}

struct Session {
    satellite_id: String,
    api_key: SecretString,
}

/// The backend client; cheap to share behind an `Arc`.
pub struct BackendClient {
    http: reqwest::Client,
    base: String,
    session: RwLock<Option<Session>>,
}

impl BackendClient {
    pub fn new(base_url: &Url) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("deploystack-satellite-rs/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self { http, base: base_url.as_str().trim_end_matches('/').to_owned(), session: RwLock::new(None) })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Use these credentials from now on.
    pub fn set_credentials(&self, credentials: &Credentials) {
        *self.session.write() =
            Some(Session { satellite_id: credentials.satellite_id.clone(), api_key: credentials.api_key.clone() });
    }

    pub fn satellite_id(&self) -> Option<String> {
        self.session.read().as_ref().map(|s| s.satellite_id.clone())
    }

    /// Whether `key` is the API key in use (compared, never returned).
    pub fn uses_key(&self, key: &SecretString) -> bool {
        self.session.read().as_ref().is_some_and(|s| s.api_key.expose_secret() == key.expose_secret())
    }

    /// E1, no auth, 5 s.
    pub async fn health(&self) -> Result<HealthResponse, BackendError> {
        self.call_acknowledged(Request::get("health", path::HEALTH.to_owned()).timeout(5)).await
    }

    /// E2 with the registration token, 10 s.
    pub async fn register(
        &self,
        token: &SecretString,
        body: &RegisterRequest,
    ) -> Result<RegisterResponse, BackendError> {
        let auth = Some(token.expose_secret().to_owned());
        self.call(Request::post("register", path::REGISTER.to_owned(), body).bearer(auth)).await
    }

    /// E3, 10 s.
    pub async fn heartbeat(&self, body: &HeartbeatRequest) -> Result<Ack, BackendError> {
        let (id, key) = self.session("heartbeat")?;
        self.call_acknowledged(Request::post("heartbeat", path::heartbeat(&id), body).bearer(Some(key))).await
    }

    /// E4, 15 s.
    pub async fn poll_commands(&self, last_poll: &str) -> Result<CommandsResponse, BackendError> {
        let (id, key) = self.session("commands")?;
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("last_poll", last_poll)
            .append_pair("limit", "10")
            .finish();
        let path = format!("{}?{query}", path::commands(&id));
        self.call(Request::get("commands", path).bearer(Some(key)).timeout(15)).await
    }

    /// E5, 10 s.
    pub async fn post_result(&self, body: &CommandResult) -> Result<Ack, BackendError> {
        let (id, key) = self.session("command-result")?;
        self.call_acknowledged(Request::post("command-result", path::command_result(&id), body).bearer(Some(key))).await
    }

    /// E6, 10 s, answers up to 32 MB.
    pub async fn fetch_config(&self) -> Result<ConfigResponse, BackendError> {
        let (id, key) = self.session("config")?;
        let request = Request::get("config", path::config(&id)).bearer(Some(key));
        self.call(Request { max_bytes: MAX_CONFIG_BYTES, ..request }).await
    }

    /// E7, within `timeout` (10 s unless the uploader gave a slow backend longer).
    pub async fn post_events(&self, body: &EventsRequest, timeout: Duration) -> Result<EventsResponse, BackendError> {
        let (id, key) = self.session("events")?;
        let request = Request::post("events", path::events(&id), body).bearer(Some(key));
        self.call_acknowledged(Request { timeout, ..request }).await
    }

    /// E8, 10 s.
    pub async fn introspect(&self, token: &str) -> Result<IntrospectResponse, BackendError> {
        let key = self.session("introspect").ok().map(|(_, key)| key);
        let body = IntrospectRequest { token: Credential::new(token), expected_team_id: None };
        self.call(Request::post("introspect", path::INTROSPECT.to_owned(), &body).bearer(key)).await
    }

    /// E9, 10 s.
    pub async fn token_status(&self, body: &wire::OAuthTokenRequest) -> Result<wire::OAuthTokenStatus, BackendError> {
        let (id, key) = self.session("tokens/status")?;
        self.call(Request::post("tokens/status", path::tokens_status(&id), body).bearer(Some(key))).await
    }

    /// E10, 10 s.
    pub async fn token_retrieve(&self, body: &wire::OAuthTokenRequest) -> Result<wire::OAuthToken, BackendError> {
        let (id, key) = self.session("tokens/retrieve")?;
        self.call(Request::post("tokens/retrieve", path::tokens_retrieve(&id), body).bearer(Some(key))).await
    }

    /// E11, 60 s.
    pub async fn github_token(&self, installation_id: &str) -> Result<wire::GithubToken, BackendError> {
        let (id, key) = self.session("github-token")?;
        self.call(Request::get("github-token", path::github_token(&id, installation_id)).bearer(Some(key)).timeout(60))
            .await
    }

    fn session(&self, endpoint: &'static str) -> Result<(String, String), BackendError> {
        let session = self.session.read();
        let session = session.as_ref().ok_or(BackendError::NotRegistered { endpoint })?;
        Ok((session.satellite_id.clone(), session.api_key.expose_secret().to_owned()))
    }

    /// One request whose answer the satellite reads: a 2xx body that does not read as `T` is an error.
    async fn call<B: Serialize, T: DeserializeOwned>(&self, request: Request<'_, B>) -> Result<T, BackendError> {
        let endpoint = request.endpoint;
        let (status, bytes) = self.exchange(request).await?;
        let bytes = bytes.map_err(|cut| cut.into_error(endpoint))?;
        let bytes: &[u8] = if status == StatusCode::NO_CONTENT { b"{}" } else { &bytes };
        serde_json::from_slice(bytes).map_err(|e| BackendError::Decode { endpoint, reason: e.to_string() })
    }

    /// One request whose 2xx is the whole answer (health, heartbeat, command result, events: BP §0, §1.5, §3.4,
    /// §8.3): a body that does not read as `T` (empty, cut short, a field of another shape) is still that 2xx,
    /// read as `T::default()` with a warning, never a failure that would re-send, re-register or stop a start.
    async fn call_acknowledged<B: Serialize, T: DeserializeOwned + Default>(
        &self,
        request: Request<'_, B>,
    ) -> Result<T, BackendError> {
        let endpoint = request.endpoint;
        let (status, bytes) = self.exchange(request).await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(T::default());
        }
        // The 2xx came; its body was cut or too long. The request was processed all the same: sending it again
        // would deliver it twice (a batch of events, a command result).
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(cut) => {
                warn!(endpoint, status = status.as_u16(), error = %cut.reason(), "the body of a 2xx answer of the backend could not be read; taken as accepted");
                return Ok(T::default());
            }
        };
        Ok(serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            warn!(endpoint, status = status.as_u16(), error = %err, "a 2xx answer of the backend could not be read; taken as accepted");
            T::default()
        }))
    }

    /// Send one request; its 2xx status and body (or why a 2xx body could not be read: the connection cut, a body
    /// past `max_bytes`), or the error (a non-2xx answer, the network before an answer).
    async fn exchange<B: Serialize>(
        &self,
        request: Request<'_, B>,
    ) -> Result<(StatusCode, Result<Vec<u8>, CutBody>), BackendError> {
        let Request { endpoint, method, path, bearer, body, timeout, max_bytes } = request;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout)
            .header("content-type", "application/json");
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            let bytes =
                serde_json::to_vec(body).map_err(|e| BackendError::Decode { endpoint, reason: e.to_string() })?;
            request = request.body(bytes);
        }
        let mut response = request.send().await.map_err(|e| network_error(endpoint, &e))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| retry_after::parse(value, SystemTime::now()));
        let mut bytes = Vec::new();
        let cut = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if bytes.len() + chunk.len() > max_bytes {
                        break Some(CutBody::TooLarge(max_bytes));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break None,
                Err(e) => break Some(CutBody::Network(network_error(endpoint, &e))),
            }
        };
        match cut {
            Some(cut) if status.is_success() => return Ok((status, Err(cut))),
            Some(cut) => return Err(cut.into_error(endpoint)),
            None => {}
        }
        if !status.is_success() {
            return Err(refused(endpoint, status, &bytes, retry_after));
        }
        Ok((status, Ok(bytes)))
    }
}

/// The error of a non-2xx answer: what it means, the backend's error body and message, and its `Retry-After` when
/// the status is one that carries it (429, or an answer naming the rate limit, and 503).
fn refused(endpoint: &'static str, status: StatusCode, bytes: &[u8], retry_after: Option<Duration>) -> BackendError {
    let body: Option<wire::BackendError> = serde_json::from_slice(bytes).ok();
    let message = body
        .as_ref()
        .map(|b| b.message.clone().map_or_else(|| b.error.clone(), |m| format!("{}: {m}", b.error)))
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let refusal = Refusal::of(status.as_u16(), body.as_ref());
    let waits = refusal == Refusal::RateLimited || status == StatusCode::SERVICE_UNAVAILABLE;
    let retry_after = retry_after.filter(|_| waits);
    let body = body.map(Box::new);
    BackendError::Status { endpoint, status: status.as_u16(), refusal, message, body, retry_after }
}

/// One request to the backend: the endpoint's name (in errors and logs), method and path, the bearer token if any,
/// the JSON body if any, its timeout (10 s unless the endpoint table says otherwise) and the largest answer read.
struct Request<'b, B> {
    endpoint: &'static str,
    method: Method,
    path: String,
    bearer: Option<String>,
    body: Option<&'b B>,
    timeout: Duration,
    max_bytes: usize,
}

impl Request<'static, ()> {
    fn get(endpoint: &'static str, path: String) -> Self {
        Request::new(endpoint, Method::GET, path, None)
    }
}

impl<'b, B> Request<'b, B> {
    fn post(endpoint: &'static str, path: String, body: &'b B) -> Self {
        Request::new(endpoint, Method::POST, path, Some(body))
    }

    fn new(endpoint: &'static str, method: Method, path: String, body: Option<&'b B>) -> Self {
        let (timeout, max_bytes) = (Duration::from_secs(10), MAX_ANSWER_BYTES);
        Request { endpoint, method, path, bearer: None, body, timeout, max_bytes }
    }

    fn bearer(self, bearer: Option<String>) -> Self {
        Request { bearer, ..self }
    }

    fn timeout(self, seconds: u64) -> Self {
        Request { timeout: Duration::from_secs(seconds), ..self }
    }
}

/// Why an answer's body could not be read whole.
enum CutBody {
    TooLarge(usize),
    Network(BackendError),
}

impl CutBody {
    fn reason(&self) -> String {
        match self {
            CutBody::TooLarge(max) => format!("answer larger than {max} bytes"),
            CutBody::Network(err) => err.to_string(),
        }
    }

    /// The error of an answer whose body the satellite needs.
    fn into_error(self, endpoint: &'static str) -> BackendError {
        match self {
            CutBody::TooLarge(_) => BackendError::Decode { endpoint, reason: self.reason() },
            CutBody::Network(err) => err,
        }
    }
}

/// A request that failed on the way: a timeout, told apart (a slow backend may have done the work), or the network.
fn network_error(endpoint: &'static str, err: &reqwest::Error) -> BackendError {
    match err.is_timeout() {
        true => BackendError::Timeout { endpoint, reason: describe(err) },
        false => BackendError::Network { endpoint, reason: describe(err) },
    }
}

fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}
