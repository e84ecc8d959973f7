//! How a relayed request's client takes what its server says: the request's mode, and what of the server's
//! notifications (progress under which token, log messages at which level) it hears.

use std::sync::Arc;

use serde_json::Value;

use crate::mcp::protocol;
use crate::mcp::transport::Inbound;

/// How the client of a relayed request takes the server's requests.
#[derive(Debug, Clone)]
pub enum Mode {
    /// A handshake-era session: server requests go out on the response stream and the client POSTs the
    /// answers; a disconnected client does not cancel the call. `capabilities`: what it declared at `initialize`.
    Handshake { capabilities: std::sync::Arc<Value> },
    /// A 2026-07-28 request, which has no server requests: one the client declared the capability for ends the
    /// response with an `input_required` result, and the call waits, parked, for the client's retry with the
    /// answers (`resume`). Closing the response stream cancels the call.
    Stateless {
        /// The `clientCapabilities` of the request's envelope.
        capabilities: Value,
        /// Who may resume the call: the endpoint's owner.
        owner: String,
        /// A stream meant to stay open (`subscriptions/listen`): ended, gracefully, at shutdown or once its
        /// credential no longer admits the caller.
        long_lived: Option<LongLived>,
        /// The `io.modelcontextprotocol/logLevel` of the request's envelope: the server's log messages reach the
        /// client at or above it, and none without it, as 2026-07-28 has a server send them.
        log_level: Option<String>,
        /// The request's progress token, and the one its call's progress carries.
        progress: ProgressTokens,
    },
}

/// The progress tokens of a 2026-07-28 request. A call the satellite parked (its server asked the client
/// something) and resumed on the client's retry tells its progress under the token of the request that started
/// it; the retry is a new request (MRTR), whose client knows its progress by the retry's own token, or asked for
/// none. Before, a resumed call's progress went out under the first request's token, which the client no longer
/// listened for.
#[derive(Debug, Clone, Default)]
pub struct ProgressTokens(Option<Box<Tokens>>);

/// Boxed: most requests carry no token, and a `Mode` is moved about with every relayed request.
#[derive(Debug, Clone)]
struct Tokens {
    own: Option<Value>,
    /// The token the call's progress carries: `own`, unless the call was started by an earlier request.
    origin: Option<Value>,
}

impl ProgressTokens {
    /// Those of a request whose `params` may carry `_meta.progressToken`.
    pub fn of(params: Option<&Value>) -> Self {
        let own = params.and_then(|p| p.get("_meta")).and_then(|m| m.get("progressToken")).cloned();
        Self(own.map(|own| Box::new(Tokens { origin: Some(own.clone()), own: Some(own) })))
    }

    /// The token the call's progress carries.
    fn origin(&self) -> Option<Value> {
        self.0.as_ref().and_then(|tokens| tokens.origin.clone())
    }

    /// The call was started by an earlier request, whose progress token it carries.
    pub(super) fn started_by(&mut self, origin: Option<Value>) {
        let own = self.0.take().and_then(|tokens| tokens.own);
        self.0 = (own.is_some() || origin.is_some()).then(|| Box::new(Tokens { own, origin }));
    }

    /// A server's progress notification as this request's client hears it: under the request's own token, or not
    /// at all when it asked for none. Any other notification goes as it is.
    fn retag(&self, inbound: Inbound) -> Option<Inbound> {
        let Some(tokens) = self.0.as_deref().filter(|tokens| tokens.origin != tokens.own) else { return Some(inbound) };
        let Inbound::Notification { method, mut params, held } = inbound else { return Some(inbound) };
        if method == "notifications/progress" {
            let token = params.as_mut().and_then(Value::as_object_mut).and_then(|p| p.get_mut("progressToken"));
            if let Some(token) = token.filter(|token| Some(&**token) == tokens.origin.as_ref()) {
                *token = tokens.own.clone()?;
            }
        }
        Some(Inbound::Notification { method, params, held })
    }
}

/// What a request's client hears of a notification its call's server sent (a resumed call's progress retagged).
pub(super) fn retagged(mode: &Mode, inbound: Inbound) -> Option<Inbound> {
    match mode {
        Mode::Stateless { progress, .. } => progress.retag(inbound),
        Mode::Handshake { .. } => Some(inbound),
    }
}

/// The token a call's progress carries, kept with the call when it is parked.
pub(super) fn origin_of(mode: &Mode) -> Option<Value> {
    match mode {
        Mode::Stateless { progress, .. } => progress.origin(),
        Mode::Handshake { .. } => None,
    }
}

/// What ends a long-lived stream besides shutdown: `ends`, cancelled by whoever watches its credential. Cancelled
/// too once the last copy of the request's mode goes, whichever way the request ended (streamed, answered at once,
/// its client gone), so the watcher never outlives it.
#[derive(Debug, Clone)]
pub struct LongLived {
    ends: tokio_util::sync::CancellationToken,
    _gone: Arc<tokio_util::sync::DropGuard>,
}

impl LongLived {
    pub fn new() -> Self {
        let ends = tokio_util::sync::CancellationToken::new();
        Self { _gone: Arc::new(ends.clone().drop_guard()), ends }
    }

    /// The token that ends the stream; the watcher cancels it, and stops when it is cancelled.
    pub fn ends(&self) -> tokio_util::sync::CancellationToken {
        self.ends.clone()
    }
}

impl Default for LongLived {
    fn default() -> Self {
        Self::new()
    }
}

/// RFC 5424 severity of a log level, lowest first; an unknown one counts as the highest, so it is never lost.
fn severity(level: &str) -> usize {
    let levels = protocol::LOG_LEVELS;
    levels.iter().position(|known| *known == level).unwrap_or(levels.len())
}

/// Whether a 2026-07-28 client hears this message: a log message only at or above the level its request asked
/// for, and none when it asked for none. Everything else goes as it is.
pub(super) fn heard(mode: &Mode, inbound: &Inbound) -> bool {
    let (Mode::Stateless { log_level, .. }, Inbound::Notification { method, params, .. }) = (mode, inbound) else {
        return true;
    };
    if method != "notifications/message" {
        return true;
    }
    let level = params.as_ref().and_then(|p| p.get("level")).and_then(Value::as_str).unwrap_or("");
    log_level.as_deref().is_some_and(|wanted| severity(level) >= severity(wanted))
}

/// Who may resume a parked call of this mode: a 2026-07-28 endpoint's owner.
pub(super) fn owner_of(mode: &Mode) -> String {
    match mode {
        Mode::Stateless { owner, .. } => owner.clone(),
        Mode::Handshake { .. } => String::new(),
    }
}

/// The token that ends a long-lived stream besides shutdown; `None` for a stream that is not one.
pub(super) fn long_lived_ends(mode: &Mode) -> Option<tokio_util::sync::CancellationToken> {
    match mode {
        Mode::Stateless { long_lived: Some(long_lived), .. } => Some(long_lived.ends()),
        _ => None,
    }
}
