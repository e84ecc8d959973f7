//! The server-to-client GET stream of a handshake-era session, and ending a session with DELETE.

use super::*;
use crate::http::exchange::HearsWithdrawals;
use crate::instances::seat_owner;
use crate::instances::InstanceManager;
use crate::mcp::protocol::RequestId;
use crate::mcp::transport::relay::SeatGuard;
use crate::mcp::transport::Relay;

pub(super) fn open_stream(deps: &McpDeps, endpoint: Endpoint, headers: &HeaderMap) -> Result<Response, McpError> {
    let id = stream_session(headers)?;
    // Held for as long as the stream is open: each holds a connection, and one caller's must not take them all.
    let streams = &deps.places.streams;
    let place = streams.take(endpoint.target.caller()).ok_or(McpError::CallerStreams { limit: streams.max() })?;
    let token = endpoint.sessions.open_stream(id, &endpoint.owner).map_err(|err| match err {
        StreamError::NoSession => McpError::SessionNotFound,
        StreamError::AlreadyOpen => McpError::StreamConflict,
    })?;
    let manager = &deps.routing.manager;
    let notes = announcements(manager, &endpoint, id);
    let (asks, seat, hears) = server_asks(manager, &endpoint, id);
    let notes = futures::stream::select(notes, asks);
    // The stream ends with the session (or the satellite); until then pings keep it open. A client that drops it
    // ends it too (the guard goes with the stream): the session is then no longer streaming, so it can expire
    // and open a stream again.
    // It ends too once the credential that opened it no longer admits its caller (`credential`).
    let gone = token.clone().drop_guard();
    let revoked = revoked(deps.gate.auth.clone(), manager.clone(), endpoint.credential(headers), "session");
    let events = notes
        .map(move |note| {
            let _gone = (&gone, &seat, &hears, &place);
            Ok::<_, Infallible>(warp::sse::Event::default().event("message").data(note.to_string()))
        })
        .chain(futures::stream::pending())
        .take_until(async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = revoked => {}
            }
        });
    let stream = warp::sse::keep_alive().interval(PING_INTERVAL).text("ping").stream(events);
    let mut response = warp::sse::reply(stream).into_response();
    if let Ok(value) = HeaderValue::from_str(id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    Ok(response)
}

/// The session a GET names, from a client of the handshake era that takes an event stream.
fn stream_session(headers: &HeaderMap) -> Result<&str, McpError> {
    if header(headers, names::MCP_PROTOCOL_VERSION) == Some(MODERN_VERSION) {
        return Err(McpError::NoServerStream);
    }
    check_version(headers)?;
    let id = header(headers, names::MCP_SESSION_ID).ok_or(McpError::InvalidSession)?;
    if !session::well_formed(id) {
        return Err(McpError::MalformedSession);
    }
    if !accepts_all(headers, ["text/event-stream"]) {
        return Err(McpError::NotAcceptable { stream_only: true });
    }
    Ok(id)
}

/// What a session's stream carries.
type Notes = std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send + Sync>>;

/// What the endpoint announces outside any request. On an instance endpoint: what the server announces, list
/// changes and updates of the resources this session subscribed to. On `/mcp`: the caller's own list changes (an
/// instance of theirs came or went, its resources or prompts changed); the four meta-tools never change, and
/// discover always searches the current catalogs.
fn announcements(manager: &InstanceManager, endpoint: &Endpoint, id: &str) -> Notes {
    match &endpoint.target {
        Target::Instance(instance) => {
            // Marked changed: an edit applied since the endpoint named this instance is caught up with at once.
            let mut applied = manager.applied();
            applied.mark_changed();
            let following = Following {
                manager: manager.clone(),
                applied,
                announcements: BroadcastStream::new(instance.announcements()),
                instance: instance.clone(),
                sessions: endpoint.sessions.clone(),
                session_id: id.to_owned(),
            };
            let notes = futures::stream::unfold(following, |mut following| async move {
                let notes = following.next().await?;
                Some((futures::stream::iter(notes), following))
            })
            .flatten();
            Box::pin(notes)
        }
        Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => view_changes(manager, caller),
    }
}

/// The list changes of one caller's view: those of its own instances, or all of them after falling behind.
fn view_changes(manager: &InstanceManager, caller: &auth::Principal) -> Notes {
    let (team, user) = (caller.team.clone(), caller.user.clone());
    let notes = BroadcastStream::new(manager.view_changes())
        .filter_map(move |change| {
            let notes = match change {
                Ok(change) if change.team == team && change.user == user => change.notifications(),
                Ok(_) => Vec::new(),
                // Fell behind: some of the missed changes may have been this caller's.
                Err(_) => crate::instances::ViewChange {
                    team: team.clone(),
                    user: user.clone(),
                    resources: true,
                    prompts: true,
                }
                .notifications(),
            };
            async move { (!notes.is_empty()).then(|| futures::stream::iter(notes)) }
        })
        .flatten();
    Box::pin(notes)
}

/// What a server asks outside any call reaches this client on this stream, when it declared the capability
/// (`Seats` prefers a stream on the instance's own endpoint, then the newest on `/mcp`). The client answers by
/// POST, under the id the exchange gives the request, as it answers requests on a call's stream. With the requests
/// goes word of those withdrawn; the seat and the withdrawals' registration last as long as the stream.
fn server_asks(
    manager: &InstanceManager,
    endpoint: &Endpoint,
    id: &str,
) -> (impl futures::Stream<Item = Value> + Send + Sync, SeatGuard, HearsWithdrawals) {
    let (relay, asks) = Relay::for_client(endpoint.sessions.capabilities(id));
    let (owner, instance) = match &endpoint.target {
        Target::Instance(instance) => {
            let spec = instance.spec();
            (seat_owner(&spec.team_id, &spec.user_id), Some(spec.process_id.0.clone()))
        }
        Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => {
            (seat_owner(&caller.team, &caller.user), None)
        }
    };
    let seat = manager.seats().take(owner, instance, relay);
    let (sessions, scope) = (endpoint.sessions.clone(), id.to_owned());
    // A request the server withdraws, or whose asker gives up, before the client answers: the client hears so.
    let (withdrawn, withdrawals) = crate::http::exchange::Withdrawn::channel();
    // This stream also carries word of requests withdrawn after the POST answer that carried them has ended.
    let hears = endpoint.sessions.exchange.hear_withdrawals(id, withdrawn.clone());
    let asks = tokio_stream::wrappers::ReceiverStream::new(asks).filter_map(move |inbound| {
        let message = sessions.exchange.outbound(&scope, &RequestId::Number(0), inbound, &withdrawn);
        std::future::ready(message.map(|(message, _)| message))
    });
    let withdrawals = tokio_stream::wrappers::ReceiverStream::new(withdrawals);
    (futures::stream::select(asks, withdrawals), seat, hears)
}

/// What an instance endpoint's GET stream listens to: the announcements of the instance its path names now. An
/// instance edited in place is a new instance under the same path and process id (the credential watcher ends the
/// stream if either changes, or its token): the stream follows it, and the client hears that its lists changed (as
/// the new instance publishes its first catalog, or at once when it is online already). Before, the stream went on
/// listening to the retired instance, and the client heard nothing more.
struct Following {
    manager: crate::instances::InstanceManager,
    /// Bumped once each configuration is applied, after an edited instance is back under its path.
    applied: tokio::sync::watch::Receiver<u64>,
    announcements: BroadcastStream<crate::mcp::transport::Announcement>,
    instance: Arc<crate::instances::Instance>,
    sessions: Arc<SessionTable>,
    session_id: String,
}

impl Following {
    /// The next notifications for the client; `None` once the satellite is stopping.
    async fn next(&mut self) -> Option<Vec<Value>> {
        loop {
            tokio::select! {
                note = self.announcements.next() => {
                    let notes = match note {
                        Some(Ok(note)) if crate::instances::missed_announcements(&note) => self.missed(),
                        Some(Ok(note)) if for_session(&note, &self.sessions, &self.session_id) => {
                            vec![Arc::unwrap_or_clone(note)]
                        }
                        Some(Ok(_)) => Vec::new(),
                        Some(Err(_)) => self.missed(),
                        // The instance holds its channel as long as this stream holds the instance.
                        None => std::future::pending().await,
                    };
                    if !notes.is_empty() {
                        return Some(notes);
                    }
                }
                changed = self.applied.changed() => {
                    changed.ok()?;
                    let current = self.manager.get(&self.instance.spec().process_id);
                    let Some(current) = current.filter(|current| !Arc::ptr_eq(current, &self.instance)) else {
                        continue;
                    };
                    // Listening first: a new instance announces its lists once its first catalog is published,
                    // so one not yet online is heard from then; one online already is said to have changed now.
                    self.announcements = BroadcastStream::new(current.announcements());
                    let online = current.state() == crate::model::InstanceStatus::Online;
                    self.instance = current;
                    if online {
                        return Some(self.missed());
                    }
                }
            }
        }
    }

    fn missed(&self) -> Vec<Value> {
        missed(&self.sessions, &self.session_id)
    }
}

/// What a session's stream says when announcements were missed (its listener fell behind, or the instance's did):
/// each list may have changed, and so may each resource it subscribed to. A client re-reads them, as after
/// hearing each; before, the missed ones were lost and the client kept a stale list.
fn missed(sessions: &SessionTable, session_id: &str) -> Vec<Value> {
    let lists = ["tools", "prompts", "resources"]
        .map(|list| protocol::notification(&format!("notifications/{list}/list_changed"), None));
    let updates = sessions
        .subscriptions(session_id)
        .into_iter()
        .map(|uri| protocol::notification("notifications/resources/updated", Some(serde_json::json!({"uri": uri}))));
    lists.into_iter().chain(updates).collect()
}

/// Whether a server announcement is for this session: a resource update only if it subscribed to that resource.
pub(super) fn for_session(note: &Value, sessions: &SessionTable, session_id: &str) -> bool {
    match note.get("method").and_then(Value::as_str) {
        Some("notifications/resources/updated") => {
            let uri = note.pointer("/params/uri").and_then(Value::as_str).unwrap_or_default();
            sessions.subscribed(session_id, uri)
        }
        _ => true,
    }
}

/// An `MCP-Protocol-Version` the endpoint does not speak is refused with 400 on every request, as on a POST
/// (2025-11-25 transports: "MUST respond with 400 Bad Request"); GET and DELETE went ahead.
fn check_version(headers: &HeaderMap) -> Result<(), McpError> {
    match header(headers, names::MCP_PROTOCOL_VERSION) {
        Some(version) if version != MODERN_VERSION && !HANDSHAKE_VERSIONS.contains(&version) => {
            Err(McpError::UnsupportedVersion(version.to_owned()))
        }
        _ => Ok(()),
    }
}

pub(super) fn delete(endpoint: Endpoint, headers: &HeaderMap) -> Result<Response, McpError> {
    if header(headers, names::MCP_PROTOCOL_VERSION) == Some(MODERN_VERSION) {
        return Err(McpError::NoSessions);
    }
    check_version(headers)?;
    match header(headers, names::MCP_SESSION_ID) {
        None => Err(McpError::InvalidSession),
        Some(id) if !session::well_formed(id) => Err(McpError::MalformedSession),
        Some(id) if endpoint.sessions.remove(id, &endpoint.owner) => {
            Ok(warp::reply::with_status(warp::reply(), StatusCode::OK).into_response())
        }
        Some(_) => Err(McpError::SessionNotFound),
    }
}
