//! The admin surface (docs/analytics.md): the JSON API under `/api/analytics` (described by
//! `proto/analytics.openapi.json`), its SVG charts, and the `/admin` page whose assets are compiled in.
//!
//! Every API route authenticates the caller as an admin (`Authenticator::authenticate_admin`): a satellite admin
//! token reads every team, a team admin only their own team (asking for another is 403, never an empty answer).
//! Errors are `{"error", "message"}` with the status that says why.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use warp::http::{header, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::analytics::{chart, report, Recorder};
use crate::auth::{AdminScope, AuthError, Authenticator};
use crate::instances::InstanceManager;
use crate::model::iso;
use crate::store::analytics::{Grouping, RowFilter};
use crate::store::{AnalyticsSums, Catalogs, Outbox, Volume};

const DEFAULT_LIMIT: u64 = 50;
const MAX_LIMIT: u64 = 500;

/// What the admin routes read.
#[derive(Clone)]
pub struct AnalyticsDeps {
    pub sums: AnalyticsSums,
    pub catalogs: Catalogs,
    pub outbox: Outbox,
    pub volume: Volume,
    pub recorder: Recorder,
    pub auth: Authenticator,
    pub manager: InstanceManager,
}

/// Why an admin request was refused.
#[derive(Debug, thiserror::Error)]
enum ApiError {
    #[error("{0}")]
    Auth(AuthError),
    #[error("team admins read only their own team ({0})")]
    OtherTeam(String),
    #[error("{0}")]
    BadQuery(String),
    #[error("the analytics store failed; see the satellite's log")]
    Store,
}

impl ApiError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ApiError::Auth(AuthError::Missing | AuthError::Invalid(_)) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Auth(AuthError::InsufficientScope(_) | AuthError::NotAdmin | AuthError::NotMember)
            | ApiError::OtherTeam(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::Auth(AuthError::Unavailable(_)) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::BadQuery(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Store => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let mut response =
            warp::reply::with_status(warp::reply::json(&json!({"error": code, "message": self.to_string()})), status)
                .into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(super::oauth::RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// A query after validation: whose rows, which page.
struct Query {
    filter: RowFilter,
    limit: u64,
    offset: u64,
    bucket: Grouping,
    scope: AdminScope,
}

fn parse_time(name: &str, value: &str) -> Result<String, ApiError> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| iso(t.with_timezone(&Utc)))
        .map_err(|_| ApiError::BadQuery(format!("{name} must be an RFC 3339 time such as 2026-11-23T00:00:00Z")))
}

fn parse_count(name: &str, value: &str, max: u64) -> Result<u64, ApiError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| ApiError::BadQuery(format!("{name} must be a whole number from 0 to {max}")))
}

fn query(params: &HashMap<String, String>, scope: AdminScope) -> Result<Query, ApiError> {
    let text = |name: &str| params.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut filter = RowFilter {
        team_id: text("team_id").map(str::to_owned),
        user_id: text("user_id").map(str::to_owned),
        installation_id: text("installation_id").map(str::to_owned),
        from: text("from").map(|v| parse_time("from", v)).transpose()?,
        to: text("to").map(|v| parse_time("to", v)).transpose()?,
    };
    if let AdminScope::Team(team) = &scope {
        match &filter.team_id {
            Some(asked) if asked != team.as_str() => return Err(ApiError::OtherTeam(team.to_string())),
            _ => filter.team_id = Some(team.to_string()),
        }
    }
    let limit = text("limit").map(|v| parse_count("limit", v, MAX_LIMIT)).transpose()?.unwrap_or(DEFAULT_LIMIT).max(1);
    let offset = text("offset").map(|v| parse_count("offset", v, u64::from(u32::MAX))).transpose()?.unwrap_or(0);
    let bucket = match text("bucket") {
        None | Some("day") => Grouping::TimePrefix(10),
        Some("hour") => Grouping::TimePrefix(13),
        Some(_) => return Err(ApiError::BadQuery("bucket must be \"day\" or \"hour\"".into())),
    };
    Ok(Query { filter, limit, offset, bucket, scope })
}

fn store_failed(err: crate::store::StoreError) -> ApiError {
    tracing::warn!(error = %err, "an analytics query failed");
    ApiError::Store
}

fn json_reply<T: Serialize>(body: &T) -> Response {
    let mut response = warp::reply::json(body).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    response
}

fn filter_json(q: &Query) -> serde_json::Value {
    json!({
        "scope": match &q.scope { AdminScope::AllTeams => "all_teams".to_owned(), AdminScope::Team(t) => format!("team:{t}") },
        "team_id": q.filter.team_id, "user_id": q.filter.user_id, "installation_id": q.filter.installation_id,
        "from": q.filter.from, "to": q.filter.to,
    })
}

/// One instance as the overview shows it.
#[derive(Serialize)]
struct InstanceRow {
    process_id: String,
    team_id: String,
    user_id: String,
    installation_id: String,
    server_slug: String,
    status: &'static str,
    message: Option<String>,
    since: String,
    tools: u64,
}

/// The caller's admin scope, or the refusal to send (401/403).
async fn admin(deps: &AnalyticsDeps, authorization: Option<String>) -> Result<AdminScope, Response> {
    deps.auth.authenticate_admin(authorization.as_deref()).await.map_err(|err| ApiError::Auth(err).into_response())
}

async fn answer(
    deps: Arc<AnalyticsDeps>,
    route: String,
    authorization: Option<String>,
    params: HashMap<String, String>,
) -> Response {
    let scope = match admin(&deps, authorization).await {
        Ok(scope) => scope,
        Err(refused) => return refused,
    };
    match route_answer(&deps, &route, scope, &params).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn route_answer(
    deps: &AnalyticsDeps,
    route: &str,
    scope: AdminScope,
    params: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let q = query(params, scope)?;
    let store = &deps.sums;
    let (f, limit, offset) = (&q.filter, q.limit, q.offset);
    Ok(match route {
        "summary" => summary(deps, &q).await?,
        "timeseries" => json_reply(&report::activity(store, f, q.bucket, limit, offset).await.map_err(store_failed)?),
        "users" => json_reply(&report::activity(store, f, Grouping::User, limit, offset).await.map_err(store_failed)?),
        "sessions" => {
            json_reply(&report::activity(store, f, Grouping::Session, limit, offset).await.map_err(store_failed)?)
        }
        "servers" => json_reply(&report::servers(store, f, limit, offset).await.map_err(store_failed)?),
        "tools" => {
            let (items, total) = store.tool_calls(f, limit, offset).await.map_err(store_failed)?;
            json_reply(&report::Page::new(items, total, limit, offset))
        }
        "failures" => {
            let (items, total) = store.recent_failures(f, limit, offset).await.map_err(store_failed)?;
            json_reply(&report::Page::new(items, total, limit, offset))
        }
        "instances" => json_reply(&instances(deps, &q)),
        "charts/savings.svg" => savings_chart(store, &q).await?,
        "charts/servers.svg" => servers_chart(store, f).await?,
        other => return Err(ApiError::BadQuery(format!("no analytics route {other:?}"))),
    })
}

/// `summary`: the totals of the rows in scope, with the filter that chose them.
async fn summary(deps: &AnalyticsDeps, q: &Query) -> Result<Response, ApiError> {
    let summary = report::summary(&deps.sums, &q.filter, deps.recorder.meta()).await.map_err(store_failed)?;
    Ok(json_reply(&json!({
        "generated_at": iso(Utc::now()),
        "filter": filter_json(q),
        "schema_only": summary.schema_only,
        "realized": summary.realized,
        "calls": summary.calls,
        "discovers": summary.discovers,
    })))
}

/// `charts/savings.svg`: the tokens sent per bucket (the last 60), through a plain proxy and through the router.
async fn savings_chart(store: &AnalyticsSums, q: &Query) -> Result<Response, ApiError> {
    let page = report::activity(store, &q.filter, q.bucket, 60, 0).await.map_err(store_failed)?;
    let mut rows = page.items;
    rows.reverse();
    let labels: Vec<String> = rows.iter().map(|r| r.key.clone()).collect();
    let svg = chart::columns(
        "Tokens sent: plain proxy vs hierarchical router",
        &labels,
        &[
            chart::Series {
                name: "plain proxy",
                color: "#c0504d",
                values: rows.iter().map(|r| r.realized.proxy_tokens).collect(),
            },
            chart::Series {
                name: "router",
                color: "#4f81bd",
                values: rows.iter().map(|r| r.realized.received_tokens).collect(),
            },
        ],
    );
    Ok(svg_reply(svg))
}

/// `charts/servers.svg`: the tokens it takes to list each server's tools (the 15 costliest).
async fn servers_chart(store: &AnalyticsSums, f: &RowFilter) -> Result<Response, ApiError> {
    let page = report::servers(store, f, 15, 0).await.map_err(store_failed)?;
    // Two installations of one server (two teams, say) are told apart by their installation id.
    let shared = |slug: &str| page.items.iter().filter(|s| s.server_slug == slug).count() > 1;
    let rows: Vec<(String, u64)> = page
        .items
        .iter()
        .map(|s| match shared(&s.server_slug) {
            true => (format!("{} ({})", s.server_slug, s.installation_id), s.tool_tokens),
            false => (s.server_slug.clone(), s.tool_tokens),
        })
        .collect();
    Ok(svg_reply(chart::bars("Tokens to list each server's tools", &rows, "#4f81bd")))
}

fn svg_reply(svg: String) -> Response {
    let mut response = warp::reply::with_header(svg, header::CONTENT_TYPE, "image/svg+xml").into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    response
}

/// Instances in scope now, by status, with a page of them (failing ones first).
fn instances(deps: &AnalyticsDeps, q: &Query) -> serde_json::Value {
    let f = &q.filter;
    let mut rows: Vec<InstanceRow> = deps
        .manager
        .instances()
        .into_iter()
        .filter(|i| {
            let s = i.spec();
            f.team_id.as_deref().is_none_or(|t| s.team_id.as_str() == t)
                && f.user_id.as_deref().is_none_or(|u| s.user_id.as_str() == u)
                && f.installation_id.as_deref().is_none_or(|x| s.installation_id.as_str() == x)
        })
        .map(|i| {
            let (s, st) = (i.spec(), i.status());
            InstanceRow {
                process_id: s.process_id.0.clone(),
                team_id: s.team_id.0.clone(),
                user_id: s.user_id.0.clone(),
                installation_id: s.installation_id.0.clone(),
                server_slug: s.server_slug.clone(),
                status: st.status.as_str(),
                message: st.message.clone(),
                since: iso(st.updated_at),
                tools: i.catalog().map(|c| c.tools.len() as u64).unwrap_or(0),
            }
        })
        .collect();
    let mut by_status: BTreeMap<&'static str, u64> = BTreeMap::new();
    for row in &rows {
        *by_status.entry(row.status).or_default() += 1;
    }
    rows.sort_by(|a, b| {
        (a.status == "online").cmp(&(b.status == "online")).then_with(|| a.process_id.cmp(&b.process_id))
    });
    let total = rows.len() as u64;
    let items: Vec<InstanceRow> = rows.into_iter().skip(q.offset as usize).take(q.limit as usize).collect();
    let page = report::Page::new(items, total, q.limit, q.offset);
    json!({"by_status": by_status, "items": page.items, "total": page.total, "limit": page.limit,
           "offset": page.offset, "next_offset": page.next_offset})
}

/// `/api/analytics/...` and `/admin`.
pub fn routes(deps: AnalyticsDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer: warp clones a route's filters (and so what they capture) for every request it tries it on.
    let deps = Arc::new(deps);
    let accept_deps = deps.clone();
    let refresh_deps = deps.clone();
    let deps_for_tools = deps.clone();
    let with = warp::any().map(move || deps.clone());
    let api = warp::path("api")
        .and(warp::path("analytics"))
        .and(warp::path::tail())
        .and(super::allow::get())
        .and(with)
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::query::<HashMap<String, String>>())
        .then(|tail: warp::path::Tail, deps: Arc<AnalyticsDeps>, authorization: Option<String>, params| {
            answer(deps, tail.as_str().trim_end_matches('/').to_owned(), authorization, params)
        });
    let accept = warp::path!("api" / "tools" / "accept")
        .and(super::allow::post())
        .and(warp::any().map(move || accept_deps.clone()))
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::body::content_length_limit(16 * 1024))
        .and(warp::body::json::<AcceptTool>())
        .then(accept_tool);
    let refresh = warp::path!("api" / "tools" / "refresh")
        .and(super::allow::post())
        .and(warp::any().map(move || refresh_deps.clone()))
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::body::content_length_limit(16 * 1024))
        .and(warp::body::json::<RefreshTools>())
        .then(refresh_tools);
    let tools_deps = deps_for_tools;
    let tools = warp::path!("api" / "tools" / String)
        .and(super::allow::get())
        .and(warp::any().map(move || tools_deps.clone()))
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::query::<HashMap<String, String>>())
        .then(tool_records);
    api.or(super::admin_page::routes()).unify().or(accept).unify().or(refresh).unify().or(tools).unify()
}

/// `GET /api/tools/history` (what re-discoveries found changed, newest first; `installation_id`, `limit`,
/// `offset`) and `GET /api/tools/held` (drifted tools waiting for an admin): admins only, a team admin sees
/// their own team's.
async fn tool_records(
    what: String,
    deps: Arc<AnalyticsDeps>,
    authorization: Option<String>,
    params: HashMap<String, String>,
) -> Response {
    let scope = match admin(&deps, authorization).await {
        Ok(scope) => scope,
        Err(refused) => return refused,
    };
    let team = match &scope {
        AdminScope::AllTeams => None,
        AdminScope::Team(team) => Some(team.as_str()),
    };
    let outcome = match what.as_str() {
        "history" => tool_history(&deps, team, &params).await,
        "held" => held_tools(&deps, team).await,
        _ => Err(ApiError::BadQuery("unknown route: use /api/tools/history or /api/tools/held".into())),
    };
    match outcome {
        Ok(body) => json_reply(&body),
        Err(err) => err.into_response(),
    }
}

async fn tool_history(
    deps: &AnalyticsDeps,
    team: Option<&str>,
    params: &HashMap<String, String>,
) -> Result<serde_json::Value, ApiError> {
    let text = |name: &str| params.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let limit = text("limit").map(|v| parse_count("limit", v, MAX_LIMIT)).transpose()?.unwrap_or(DEFAULT_LIMIT).max(1);
    let offset = text("offset").map(|v| parse_count("offset", v, u64::from(u32::MAX))).transpose()?.unwrap_or(0);
    let changes =
        deps.catalogs.tool_changes(team, text("installation_id"), limit, offset).await.map_err(store_failed)?;
    Ok(json!({"changes": changes, "limit": limit, "offset": offset}))
}

async fn held_tools(deps: &AnalyticsDeps, team: Option<&str>) -> Result<serde_json::Value, ApiError> {
    let held = deps.catalogs.held_tools().await.map_err(store_failed)?;
    let instances = deps.manager.instances();
    let team_of = |installation: &str| {
        instances.iter().find(|i| i.spec().installation_id.as_str() == installation).map(|i| i.spec().team_id.0.clone())
    };
    let held: Vec<serde_json::Value> = held
        .into_iter()
        .filter_map(|h| {
            let owner = team_of(&h.installation_id);
            if team.is_some_and(|t| owner.as_deref() != Some(t)) {
                return None;
            }
            Some(json!({"installation_id": h.installation_id, "tool_name": h.tool_name, "process_id": h.process_id,
                        "held_at": h.held_at, "team_id": owner}))
        })
        .collect();
    Ok(json!({"held": held}))
}

/// `POST /api/tools/refresh` body: which instances to discover again; nothing named is every instance the
/// admin may see.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RefreshTools {
    installation_id: Option<String>,
    user_id: Option<String>,
}

/// An admin has the satellite discover instances again now (one installation, one member's, or all of their
/// scope): the answer says which were discovered again and which were not running.
async fn refresh_tools(deps: Arc<AnalyticsDeps>, authorization: Option<String>, body: RefreshTools) -> Response {
    let scope = match admin(&deps, authorization).await {
        Ok(scope) => scope,
        Err(refused) => return refused,
    };
    let instances: Vec<_> = deps
        .manager
        .instances()
        .into_iter()
        .filter(|i| match &scope {
            AdminScope::AllTeams => true,
            AdminScope::Team(team) => &i.spec().team_id == team,
        })
        .filter(|i| body.installation_id.as_deref().is_none_or(|id| i.spec().installation_id.as_str() == id))
        .filter(|i| body.user_id.as_deref().is_none_or(|id| i.spec().user_id.as_str() == id))
        .collect();
    if instances.is_empty() && (body.installation_id.is_some() || body.user_id.is_some()) {
        return ApiError::BadQuery("no instance of yours matches installation_id/user_id".into()).into_response();
    }
    let report = deps.manager.refresh_tools(instances).await;
    tracing::info!(refreshed = report.refreshed.len(), skipped = report.skipped.len(), "an admin refreshed tools");
    json_reply(&report.to_json())
}

/// `POST /api/tools/accept` body: a held tool (drifted, `hold_drifted_tools`) an admin has reviewed.
#[derive(Debug, serde::Deserialize)]
struct AcceptTool {
    installation_id: String,
    tool_name: String,
}

/// An admin accepts a held tool's change: it is back in discover and calls for the whole installation.
/// A team admin may accept only their own team's tools.
async fn accept_tool(deps: Arc<AnalyticsDeps>, authorization: Option<String>, body: AcceptTool) -> Response {
    let scope = match admin(&deps, authorization).await {
        Ok(scope) => scope,
        Err(refused) => return refused,
    };
    let installation = crate::model::InstallationId(body.installation_id.clone());
    let team = deps
        .manager
        .of_installation(&installation, None)
        .ok()
        .and_then(|i| i.first().map(|i| i.spec().team_id.clone()));
    let Some(team) = team else {
        return ApiError::BadQuery(format!("no installation {:?} on this satellite", body.installation_id))
            .into_response();
    };
    if let AdminScope::Team(own) = &scope {
        if own != &team {
            return ApiError::OtherTeam(own.0.clone()).into_response();
        }
    }
    let instances = deps.manager.set_tool_status(&installation, &body.tool_name, false).await;
    tracing::info!(installation_id = %body.installation_id, tool = %body.tool_name, "an admin accepted a changed tool");
    warp::reply::json(&json!({
        "accepted": true,
        "installation_id": body.installation_id,
        "tool_name": body.tool_name,
        "instances": instances,
    }))
    .into_response()
}

#[cfg(test)]
#[path = "analytics_tests.rs"]
mod tests;
