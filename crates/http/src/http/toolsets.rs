//! `/api/toolsets` (docs/toolsets.md, `proto/toolsets.openapi.json`): a member lists the toolsets they can
//! select, defines their own, previews what one takes, and sets their default; a team admin also defines the
//! team's. Every route authenticates like `/mcp` (a member's bearer token) and reaches only the caller's team.
//! Errors are `{"error", "message"}` with the status that says why.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use warp::http::{header, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::auth::{AuthError, Authenticator, Principal, SCOPE_EXECUTE, SCOPE_READ};
use crate::instances::InstanceManager;
use crate::model::{tool_path, Toolset, ToolsetScope};
use crate::toolsets::{Listed, ToolsetError, Toolsets};

/// Largest request body accepted (a toolset of 256 long patterns fits).
const MAX_BODY: u64 = 128 * 1024;

/// What the routes read.
#[derive(Clone)]
pub struct ToolsetDeps {
    pub auth: Authenticator,
    pub toolsets: Toolsets,
    pub manager: InstanceManager,
}

/// `PUT /api/toolsets/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutToolset {
    description: Option<String>,
    tools: Vec<String>,
    /// `user` (the default) or `team`.
    scope: Option<String>,
}

/// `PUT /api/toolsets/default`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutDefault {
    name: Option<String>,
}

/// Why a request was refused.
enum ApiError {
    Auth(AuthError),
    BadRequest(String),
    Toolset(ToolsetError),
}

impl ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            ApiError::Auth(err) => {
                let status = match err {
                    AuthError::Missing | AuthError::Invalid(_) => StatusCode::UNAUTHORIZED,
                    AuthError::InsufficientScope(_) | AuthError::NotAdmin | AuthError::NotMember => {
                        StatusCode::FORBIDDEN
                    }
                    AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                };
                let code = match status {
                    StatusCode::UNAUTHORIZED => "unauthorized",
                    StatusCode::SERVICE_UNAVAILABLE => "unavailable",
                    _ => "forbidden",
                };
                (status, code, err.to_string())
            }
            ApiError::BadRequest(message) => (StatusCode::BAD_REQUEST, "bad_request", message),
            ApiError::Toolset(err) => {
                let (status, code) = match &err {
                    ToolsetError::Unknown { .. } | ToolsetError::NotFound { .. } => {
                        (StatusCode::NOT_FOUND, "not_found")
                    }
                    ToolsetError::DanglingDefault { .. } | ToolsetError::ConfigOwned(_) => {
                        (StatusCode::CONFLICT, "conflict")
                    }
                    ToolsetError::Invalid(_) | ToolsetError::TooMany(_) => (StatusCode::BAD_REQUEST, "bad_request"),
                    ToolsetError::NotAdmin => (StatusCode::FORBIDDEN, "forbidden"),
                    ToolsetError::Store(err) => {
                        tracing::warn!(error = %err, "a toolset could not be stored");
                        (StatusCode::INTERNAL_SERVER_ERROR, "internal")
                    }
                };
                let message = match &err {
                    ToolsetError::Store(_) => "the toolset store failed; see the satellite's log".to_owned(),
                    other => other.to_string(),
                };
                (status, code, message)
            }
        };
        let mut response =
            warp::reply::with_status(warp::reply::json(&json!({"error": code, "message": message})), status)
                .into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<ToolsetError> for ApiError {
    fn from(err: ToolsetError) -> Self {
        ApiError::Toolset(err)
    }
}

/// The routes under `/api/toolsets`.
pub fn routes(deps: ToolsetDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer: warp clones a route's filters (and so what they capture) for every request it tries it on.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    let auth = warp::header::optional::<String>("authorization");
    let base = warp::path("api").and(warp::path("toolsets"));
    let list = base.and(warp::path::end()).and(super::allow::get()).and(with.clone()).and(auth).then(get_list);
    let put_default = base
        .and(warp::path!("default"))
        .and(super::allow::put())
        .and(with.clone())
        .and(auth)
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .then(put_default);
    let get_one = base.and(warp::path!(String)).and(super::allow::get()).and(with.clone()).and(auth).then(get_one);
    let put_one = base
        .and(warp::path!(String))
        .and(super::allow::put())
        .and(with.clone())
        .and(auth)
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .then(put_one);
    let delete_one = base
        .and(warp::path!(String))
        .and(super::allow::delete())
        .and(with)
        .and(auth)
        .and(warp::query::<HashMap<String, String>>())
        .then(delete_one);
    list.or(put_default).unify().or(get_one).unify().or(put_one).unify().or(delete_one).unify()
}

/// `GET /api/toolsets`.
async fn get_list(deps: Arc<ToolsetDeps>, authorization: Option<String>) -> Response {
    respond(async { list(&deps, &caller(&deps, authorization).await?) }.await)
}

/// `PUT /api/toolsets/default`.
async fn put_default(deps: Arc<ToolsetDeps>, authorization: Option<String>, body: bytes::Bytes) -> Response {
    respond(
        async {
            let caller = writer(&deps, authorization).await?;
            let body: PutDefault = parse(&body)?;
            deps.toolsets.set_default(&caller, body.name.as_deref()).await?;
            Ok((StatusCode::OK, json!({"default": body.name})))
        }
        .await,
    )
}

/// `GET /api/toolsets/{name}`.
async fn get_one(name: String, deps: Arc<ToolsetDeps>, authorization: Option<String>) -> Response {
    respond(
        async {
            let caller = caller(&deps, authorization).await?;
            let toolset = deps
                .toolsets
                .resolve(&caller, Some(&name))?
                .ok_or_else(|| ApiError::BadRequest("\"all\" is every tool, not a toolset".into()))?;
            Ok((StatusCode::OK, preview(&deps, &caller, &toolset)))
        }
        .await,
    )
}

/// `PUT /api/toolsets/{name}`.
async fn put_one(name: String, deps: Arc<ToolsetDeps>, authorization: Option<String>, body: bytes::Bytes) -> Response {
    respond(
        async {
            let caller = writer(&deps, authorization).await?;
            let body: PutToolset = parse(&body)?;
            let scope = scope_of(body.scope.as_deref())?;
            let (toolset, created) = deps.toolsets.put(&caller, scope, &name, body.description, body.tools).await?;
            tracing::info!(team_id = %caller.team, user_id = %caller.user, toolset = %name, scope = scope.as_str(), "toolset saved");
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok((status, preview(&deps, &caller, &toolset)))
        }
        .await,
    )
}

/// `DELETE /api/toolsets/{name}?scope=`.
async fn delete_one(
    name: String,
    deps: Arc<ToolsetDeps>,
    authorization: Option<String>,
    query: HashMap<String, String>,
) -> Response {
    respond(
        async {
            let caller = writer(&deps, authorization).await?;
            let scope = scope_of(query.get("scope").map(String::as_str))?;
            deps.toolsets.delete(&caller, scope, &name).await?;
            tracing::info!(team_id = %caller.team, user_id = %caller.user, toolset = %name, scope = scope.as_str(), "toolset deleted");
            Ok((StatusCode::OK, json!({"deleted": name, "scope": scope.as_str()})))
        }
        .await,
    )
}

fn respond(outcome: Result<(StatusCode, Value), ApiError>) -> Response {
    match outcome {
        Ok((status, body)) => {
            let mut response = warp::reply::with_status(warp::reply::json(&body), status).into_response();
            response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
            response
        }
        Err(err) => err.into_response(),
    }
}

async fn caller(deps: &ToolsetDeps, authorization: Option<String>) -> Result<Principal, ApiError> {
    let caller = deps.auth.authenticate_request(authorization.as_deref()).await.map_err(ApiError::Auth)?;
    caller.require(SCOPE_READ).map_err(ApiError::Auth)?;
    Ok(caller)
}

/// A caller who may change toolsets: a token with the execute scope (a read-only token only reads).
async fn writer(deps: &ToolsetDeps, authorization: Option<String>) -> Result<Principal, ApiError> {
    let caller = caller(deps, authorization).await?;
    caller.require(SCOPE_EXECUTE).map_err(ApiError::Auth)?;
    Ok(caller)
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|err| ApiError::BadRequest(format!("the body is not valid: {err}")))
}

fn scope_of(scope: Option<&str>) -> Result<ToolsetScope, ApiError> {
    match scope {
        None | Some("user") => Ok(ToolsetScope::User),
        Some("team") => Ok(ToolsetScope::Team),
        Some(other) => Err(ApiError::BadRequest(format!("scope must be \"user\" or \"team\", not {other:?}"))),
    }
}

fn list(deps: &ToolsetDeps, caller: &Principal) -> Result<(StatusCode, Value), ApiError> {
    let listing = deps.toolsets.list(caller);
    let toolsets: Vec<Value> = listing.toolsets.iter().map(entry).collect();
    Ok((StatusCode::OK, json!({"toolsets": toolsets, "default": listing.default})))
}

fn entry(listed: &Listed) -> Value {
    let mut value = definition(&listed.toolset);
    value["updated_at"] = json!(listed.updated_at);
    value["updated_by"] = json!(listed.updated_by);
    value["shadowed"] = json!(listed.shadowed);
    value
}

fn definition(toolset: &Toolset) -> Value {
    json!({
        "name": toolset.name,
        "description": toolset.description,
        "tools": toolset.patterns,
        "scope": toolset.scope.as_str(),
        "source": toolset.source.as_str(),
    })
}

/// A toolset with the tools it takes from the caller's instances now (whatever their status), so a pattern
/// can be checked before a session depends on it.
fn preview(deps: &ToolsetDeps, caller: &Principal, toolset: &Toolset) -> Value {
    let mut matched = Vec::new();
    let mut servers = Vec::new();
    for instance in deps.manager.instances_for(&caller.user, &caller.team) {
        let spec = instance.spec();
        servers.push(json!({"server": spec.server_slug, "status": instance.state().as_str()}));
        for tool in instance.catalog().iter().flat_map(|c| c.tools.iter()) {
            if toolset.matches(&spec.server_slug, tool.name()) {
                matched.push(tool_path(&spec.server_slug, tool.name()));
            }
        }
    }
    matched.sort();
    let mut value = definition(toolset);
    value["matched_tools"] = json!(matched);
    value["servers"] = json!(servers);
    value
}
