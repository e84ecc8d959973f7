//! The analytics API on real data: real discoveries of the demo server and server-everything, real sessions and
//! calls through `/mcp` in both eras, real SQLite. Every figure is checked against what the test counts itself
//! from what the servers listed and what the clients received; every answer is validated against
//! proto/analytics.openapi.json; every route refuses members and other teams' admins.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use satellite::config::sha256_hex;
use satellite::model::{Catalog, InstanceStatus};
use serde_json::{json, Value};

use crate::common::*;

const ADMIN: &str = "satellite-admin-token-0123456789";
const ROUTES: [&str; 10] = [
    "summary",
    "timeseries",
    "users",
    "sessions",
    "servers",
    "tools",
    "failures",
    "instances",
    "charts/savings.svg",
    "charts/servers.svg",
];
const DEADLINE: Duration = Duration::from_secs(60);

fn token(user: &str) -> String {
    format!("{user}-bearer-token-0123")
}

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let everything = toml_str(&node_bin("mcp-server-everything").to_string_lossy());
    let mut file = format!(
        "[auth]\nadmin_token_sha256 = [\"{}\"]\n[sandbox]\nallowed_commands = [{exe}, {everything}]\n\
         [[teams]]\nid = \"acme\"\n[[teams]]\nid = \"globex\"\n",
        sha256_hex(ADMIN)
    );
    for (user, team, role) in [("alice", "acme", "admin"), ("bob", "acme", "member"), ("carol", "globex", "admin")] {
        file += &format!(
            "[[users]]\nid = \"{user}\"\nteams = [\"{team}\"]\nrole = \"{role}\"\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&token(user))
        );
    }
    file +=
        &format!("[[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n");
    file += &format!(
        "[[servers]]\nslug = \"everything\"\ntransport = \"stdio\"\ncommand = {everything}\nargs = [\"stdio\"]\n"
    );
    for (id, team, server, users) in [
        ("d-acme", "acme", "demo", &["alice", "bob"][..]),
        ("e-acme", "acme", "everything", &["alice"][..]),
        ("d-globex", "globex", "demo", &["carol"][..]),
    ] {
        file += &format!("[[installations]]\nid = \"{id}\"\nteam = \"{team}\"\nserver = \"{server}\"\n");
        // Every member of the team gets an instance unless their tier disables it.
        for (user, member_of) in [("alice", "acme"), ("bob", "acme"), ("carol", "globex")] {
            if member_of == team && !users.contains(&user) {
                file += &format!("[installations.users.{user}]\nenabled = false\n");
            }
        }
    }
    file
}

/// Tokens of one tool, counted here: the SB §15 text (whose bytes tests/tokens.rs checks against the npm
/// reference) through a fresh o200k_base encoder.
fn tool_tokens(bpe: &tiktoken_rs::CoreBPE, name: &str, description: &str, schema: &Value) -> u64 {
    bpe.encode_ordinary(&satellite::tokens::tool_text(name, Some(description), schema)).len() as u64
}

fn catalog_tokens(bpe: &tiktoken_rs::CoreBPE, catalog: &Catalog) -> u64 {
    catalog.tools.iter().map(|t| tool_tokens(bpe, t.name(), t.description(), &t.input_schema())).sum()
}

struct Api {
    base: String,
    http: reqwest::Client,
    openapi: Value,
}

impl Api {
    async fn get(&self, route: &str, token: Option<&str>, query: &[(&str, &str)]) -> (StatusCode, String) {
        let mut request = self.http.get(format!("{}/api/analytics/{route}", self.base)).query(query);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        (status, response.text().await.unwrap_or_default())
    }

    /// A JSON answer, checked against the OpenAPI schema of its route and status.
    async fn json(&self, route: &str, token: &str, query: &[(&str, &str)]) -> Value {
        let (status, text) = self.get(route, Some(token), query).await;
        assert_eq!(status, StatusCode::OK, "{route}: {text}");
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{route}: {e}: {text}"));
        self.conforms(route, "200", &body);
        body
    }

    fn conforms(&self, route: &str, status: &str, body: &Value) {
        let path = format!("/api/analytics/{route}");
        let schema =
            self.openapi["paths"][&path]["get"]["responses"][status]["content"]["application/json"]["schema"].clone();
        assert!(!schema.is_null(), "proto/analytics.openapi.json has no {status} JSON schema for {path}");
        let mut root = schema;
        root["components"] = self.openapi["components"].clone();
        let validator = jsonschema::validator_for(&root).expect("valid schema");
        let errors = crate::common::fake_backend::schema_errors(&validator, body);
        assert!(errors.is_empty(), "{path} {status} does not match proto/analytics.openapi.json: {errors:?}\n{body}");
    }
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a count: {value}"))
}

fn document(reply: &Value) -> Value {
    serde_json::from_str(reply["result"]["content"][0]["text"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

#[tokio::test]
async fn the_figures_are_what_the_sessions_were_sent_and_only_admins_of_the_team_read_them() {
    let sat = TestSatellite::start(&config()).await;
    sat.wait_ready().await;
    wait_until(DEADLINE, "all four instances online", || {
        let all = sat.satellite.manager().instances();
        let done = all.len() == 4 && all.iter().all(|i| i.status().status == InstanceStatus::Online);
        async move { done.then_some(()) }
    })
    .await;
    let api = Api {
        base: sat.base_url(),
        http: reqwest::Client::new(),
        openapi: serde_json::from_str(
            &std::fs::read_to_string(repo_path("proto/analytics.openapi.json")).expect("openapi document"),
        )
        .expect("openapi JSON"),
    };

    // What each caller can see, counted here from what the servers listed.
    let bpe = tiktoken_rs::o200k_base().expect("encoder");
    let mut visible: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut by_installation: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for instance in sat.satellite.manager().instances() {
        let spec = instance.spec();
        let tokens = catalog_tokens(&bpe, &instance.catalog().expect("catalog"));
        *visible.entry((spec.team_id.0.clone(), spec.user_id.0.clone())).or_default() += tokens;
        by_installation.entry(spec.installation_id.0.clone()).or_default().push(tokens);
    }
    let seen = |team: &str, user: &str| visible[&(team.to_owned(), user.to_owned())];
    let (alice_sees, bob_sees) = (seen("acme", "alice"), seen("acme", "bob"));
    assert!(alice_sees > bob_sees && bob_sees > 0);

    // Alice, handshake era: two listings of an unchanged set, a discover and three calls.
    let alice = Caller::connect(&sat, "/mcp", Some(&token("alice"))).await;
    let (_, listed) = alice.call("tools/list", json!({})).await;
    let meta_tools = listed["result"]["tools"].as_array().expect("tools").clone();
    assert_eq!(meta_tools.len(), 4);
    let meta_tokens: u64 = meta_tools
        .iter()
        .map(|t| {
            tool_tokens(
                &bpe,
                t["name"].as_str().unwrap_or(""),
                t["description"].as_str().unwrap_or(""),
                &t["inputSchema"],
            )
        })
        .sum();
    alice.call("tools/list", json!({})).await;
    // A budget answer (the default since issue 72): the realized figures count the tokens of its text as sent.
    let found = alice.tool("discover_mcp_tools", json!({"query": "echo", "budget_tokens": 1000})).await;
    let found_text = found["result"]["content"][0]["text"].as_str().expect("discover text").to_owned();
    let found_tokens = bpe.encode_ordinary(&found_text).len() as u64;
    let results: Vec<String> = document(&found)["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["tool_path"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(results.contains(&"demo:echo".to_owned()), "{results:?}");
    let expected_hits = 1;
    for (path, arguments) in
        [("demo:echo", json!({"text": "hi"})), ("demo:fail", json!({})), ("demo:add", json!({"a": 1, "b": 2}))]
    {
        let reply = alice.execute(path, arguments).await;
        assert!(reply["result"].is_object(), "{path}: {reply}");
    }

    // Alice, 2026-07-28: two stateless listings, each of which a stateless proxy would answer in full.
    let stateless = Caller::new(&sat, "/mcp", Some(&token("alice")));
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    for id in [1, 2] {
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/list","params":{"_meta": meta}});
        let (status, _, reply) = stateless.post_modern(&body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(reply["result"]["tools"].as_array().map(Vec::len), Some(4));
    }

    // Bob lists once and calls once without a discover; Carol (another team) lists and discovers.
    let bob = Caller::connect(&sat, "/mcp", Some(&token("bob"))).await;
    bob.call("tools/list", json!({})).await;
    bob.execute("demo:echo", json!({"text": "x"})).await;
    let carol = Caller::connect(&sat, "/mcp", Some(&token("carol"))).await;
    carol.call("tools/list", json!({})).await;
    carol.tool("discover_mcp_tools", json!({"query": "add"})).await;

    // The writer batches: wait until everything is in, Carol's discover in the other team included.
    let alice_token = token("alice");
    let summary = wait_until(DEADLINE, "every fact recorded", || {
        let (api, alice_token) = (&api, &alice_token);
        async move {
            let s = api.json("summary", alice_token, &[]).await;
            let everyone = api.json("summary", ADMIN, &[]).await;
            let done = u(&s["calls"]["total"]) == 4
                && u(&s["realized"]["listings"]) == 5
                && u(&everyone["discovers"]["total"]) == 2;
            done.then_some(s)
        }
    })
    .await;

    // Schema-only: acme's stored catalogs against the meta-tools.
    let schema = &summary["schema_only"];
    assert_eq!(summary["filter"]["scope"], "team:acme");
    assert_eq!((u(&schema["callers"]), u(&schema["instances"]), u(&schema["servers"])), (2, 3, 2));
    assert_eq!(u(&schema["tool_tokens"]), alice_sees + bob_sees);
    assert_eq!(u(&schema["meta_tool_tokens"]), meta_tokens);
    assert_eq!(u(&schema["meta_tools"]), 4);
    let per_caller = (alice_sees + bob_sees) as f64 / 2.0;
    assert_eq!(schema["tool_tokens_per_caller"].as_f64(), Some(per_caller));
    assert_eq!(schema["saved_tokens_per_listing"].as_f64(), Some(per_caller - meta_tokens as f64));
    let per_result = found_tokens as f64 / results.len() as f64;
    assert_eq!(u(&schema["tools_fit_router"]), ((200_000 - meta_tokens) as f64 / per_result).floor() as u64);
    let tools = u(&schema["tools"]) as f64;
    assert_eq!(u(&schema["tools_fit_direct"]), (200_000.0 / ((alice_sees + bob_sees) as f64 / tools)).floor() as u64);

    // Realized: alice's session once (the set did not change), her two stateless listings, bob's session.
    let realized = &summary["realized"];
    let proxy = alice_sees + 2 * alice_sees + bob_sees;
    let received = 5 * meta_tokens + found_tokens;
    assert_eq!(u(&realized["sessions"]), 3);
    assert_eq!(u(&realized["listing_tokens"]), 5 * meta_tokens);
    assert_eq!(u(&realized["discover_tokens"]), found_tokens);
    assert_eq!(u(&realized["received_tokens"]), received);
    assert_eq!(u(&realized["proxy_tokens"]), proxy);
    assert_eq!(realized["saved_tokens"].as_i64(), Some(proxy as i64 - received as i64));

    // Calls and discovers: one tool error, one discover of acme's, followed by a call of one of its results.
    assert_eq!((u(&summary["calls"]["errors"]), u(&summary["calls"]["tool_errors"])), (0, 1));
    assert_eq!(summary["calls"]["error_rate"].as_f64(), Some(0.25));
    assert_eq!((u(&summary["discovers"]["total"]), u(&summary["discovers"]["hits"])), (1, expected_hits));

    // Per user, per session, per tool, per server, over time.
    let users = api.json("users", &alice_token, &[]).await;
    let row = |user: &str| {
        users["items"].as_array().and_then(|rows| rows.iter().find(|r| r["user_id"] == user)).cloned().expect("row")
    };
    assert_eq!(u(&users["total"]), 2, "carol is another team's");
    assert_eq!(u(&row("alice")["realized"]["proxy_tokens"]), 3 * alice_sees);
    assert_eq!(u(&row("bob")["realized"]["proxy_tokens"]), bob_sees);
    assert_eq!(u(&row("bob")["discovers"]["total"]), 0);
    let sessions = api.json("sessions", &alice_token, &[("limit", "2")]).await;
    assert_eq!((u(&sessions["total"]), sessions["items"].as_array().map(Vec::len)), (3, Some(2)));
    assert_eq!(u(&sessions["next_offset"]), 2);
    let rest = api.json("sessions", &alice_token, &[("limit", "2"), ("offset", "2")]).await;
    assert!(rest["next_offset"].is_null() && rest["items"].as_array().map(Vec::len) == Some(1));
    let tools = api.json("tools", &alice_token, &[]).await;
    let echo = tools["items"].as_array().and_then(|t| t.iter().find(|t| t["tool_name"] == "echo")).expect("echo");
    assert_eq!((u(&echo["calls"]), u(&echo["from_discover"])), (2, 1));
    let servers = api.json("servers", &alice_token, &[]).await;
    let first = &servers["items"][0];
    assert_eq!(first["installation_id"], "e-acme", "server-everything costs more than the demo");
    assert_eq!(u(&first["tool_tokens"]), by_installation["e-acme"][0]);
    assert_eq!(u(&servers["items"][1]["instances"]), 2);
    let series = api.json("timeseries", &alice_token, &[("bucket", "hour")]).await;
    let sum = |field: &str| -> u64 {
        series["items"].as_array().expect("items").iter().map(|r| u(&r["realized"][field])).sum()
    };
    assert_eq!((sum("proxy_tokens"), sum("received_tokens")), (proxy, received));
    let instances = api.json("instances", &alice_token, &[]).await;
    assert_eq!(instances["by_status"], json!({"online": 3}));
    let failures = api.json("failures", &alice_token, &[]).await;
    assert!(failures["items"]
        .as_array()
        .expect("items")
        .iter()
        .any(|f| f["kind"] == "call" && f["detail"].as_str().is_some_and(|d| d.starts_with("fail"))));
    let installation = api.json("summary", &alice_token, &[("installation_id", "d-acme")]).await;
    assert_eq!(u(&installation["calls"]["total"]), 4);
    assert_eq!(u(&installation["schema_only"]["tool_tokens"]), by_installation["d-acme"].iter().sum::<u64>());

    // The satellite admin token reads every team; a filter narrows it.
    let all = api.json("summary", ADMIN, &[]).await;
    assert_eq!((all["filter"]["scope"].as_str(), u(&all["schema_only"]["callers"])), (Some("all_teams"), 3));
    assert_eq!(u(&all["discovers"]["total"]), 2);
    let globex = api.json("summary", ADMIN, &[("team_id", "globex")]).await;
    assert_eq!((u(&globex["calls"]["total"]), u(&globex["discovers"]["total"])), (0, 1));
    let carol_own = api.json("summary", &token("carol"), &[]).await;
    assert_eq!(carol_own["realized"], globex["realized"]);

    // Refusals on every route: no token, an unknown one, a member, another team's admin, a bad value.
    for route in ROUTES {
        for (who, query, expected) in [
            (None, &[][..], StatusCode::UNAUTHORIZED),
            (Some("not-a-known-token-at-all".to_owned()), &[][..], StatusCode::UNAUTHORIZED),
            (Some(token("bob")), &[][..], StatusCode::FORBIDDEN),
            (Some(token("carol")), &[("team_id", "acme")][..], StatusCode::FORBIDDEN),
            (Some(alice_token.clone()), &[("from", "last tuesday")][..], StatusCode::BAD_REQUEST),
        ] {
            let (status, text) = api.get(route, who.as_deref(), query).await;
            assert_eq!(status, expected, "{route} as {who:?} {query:?}: {text}");
            let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{route}: {e}: {text}"));
            api.conforms(route, expected.as_str(), &body);
        }
    }

    // The charts carry the API's numbers.
    let (status, svg) = api.get("charts/servers.svg", Some(&alice_token), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let bars: Vec<u64> =
        svg.split("data-value=\"").skip(1).filter_map(|s| s.split('"').next().and_then(|v| v.parse().ok())).collect();
    let expected: Vec<u64> = servers["items"].as_array().expect("items").iter().map(|s| u(&s["tool_tokens"])).collect();
    assert_eq!(bars, expected);
    sat.satellite.shutdown().await;
}

#[tokio::test]
async fn recorded_facts_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config();
    let sat = TestSatellite::start_in(dir, &config).await;
    sat.wait_ready().await;
    wait_until(DEADLINE, "demo instances online", || {
        let up =
            sat.satellite.manager().instances().iter().filter(|i| i.status().status == InstanceStatus::Online).count();
        async move { (up == 4).then_some(()) }
    })
    .await;
    let bob = Caller::connect(&sat, "/mcp", Some(&token("bob"))).await;
    bob.call("tools/list", json!({})).await;
    bob.execute("demo:add", json!({"a": 1, "b": 1})).await;
    // Shutdown drains the writer: nothing queued is lost.
    let TestSatellite { satellite, dir, .. } = sat;
    assert!(satellite.shutdown().await);
    let sat = TestSatellite::start_in(dir, &config).await;
    sat.wait_ready().await;
    let api_base = sat.base_url();
    let (status, text) = (async {
        let r = reqwest::Client::new()
            .get(format!("{api_base}/api/analytics/summary"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("request");
        (r.status(), r.text().await.unwrap_or_default())
    })
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let summary: Value = serde_json::from_str(&text).expect("json");
    assert_eq!((u(&summary["calls"]["total"]), u(&summary["realized"]["listings"])), (1, 1), "{summary}");
    // Catalogs stored by the first run carry their counts: nothing is uncounted after a restart.
    assert_eq!(u(&summary["schema_only"]["uncounted_instances"]), 0);
    assert!(u(&summary["schema_only"]["tool_tokens"]) > 0);
    sat.satellite.shutdown().await;
}

/// Managed mode: the backend's introspection names the caller's `team_role`; a `team_admin` reads their own
/// team's figures, a `team_user` and another team's admin are refused.
#[tokio::test]
async fn managed_team_admins_read_their_own_team_from_introspection() {
    use crate::common::fake_backend::{FakeBackend, TokenInfo};
    use satellite::backend::wire::ConfigResponse;
    use satellite::control::McpServerEntry;

    let remote = HttpServer::demo(&[]).await;
    let entry = |team: &str, user: &str| McpServerEntry {
        installation_id: format!("demo-{team}"),
        team_id: team.into(),
        team_slug: team.into(),
        server_name: "Demo".into(),
        server_slug: Some("demo".into()),
        installation_name: "Demo".into(),
        transport_type: Some("http".into()),
        url: Some(remote.url("/mcp").to_string()),
        enabled: Some(true),
        user_id: user.into(),
        ..Default::default()
    };
    let backend = FakeBackend::start().await;
    backend.set_config(&ConfigResponse::from_entries([
        ("demo-acme-alice", entry("acme", "alice")),
        ("demo-acme-bob", entry("acme", "bob")),
        ("demo-globex-carol", entry("globex", "carol")),
    ]));
    let mut tokens = BTreeMap::new();
    for (user, team, role) in
        [("alice", "acme", "team_admin"), ("bob", "acme", "team_user"), ("carol", "globex", "team_admin")]
    {
        let mut info = TokenInfo::new(user, team);
        info.team_role = role.into();
        backend.add_token(&token(user), info);
        tokens.insert(user, token(user));
    }
    let sat = TestSatellite::managed(
        &backend.url(),
        FakeBackend::REGISTRATION_TOKEN,
        tempfile::tempdir().expect("dir"),
        |_| {},
    )
    .await
    .expect("managed satellite starts");
    wait_until(DEADLINE, "the three remote instances online", || {
        let all = sat.satellite.manager().instances();
        let done = all.len() == 3 && all.iter().all(|i| i.status().status == InstanceStatus::Online);
        async move { done.then_some(()) }
    })
    .await;
    let bob = Caller::connect(&sat, "/mcp", Some(&tokens["bob"])).await;
    bob.call("tools/list", json!({})).await;
    bob.execute("demo:echo", json!({"text": "managed"})).await;

    let http = reqwest::Client::new();
    let get = |who: &str, query: &'static [(&'static str, &'static str)]| {
        let request =
            http.get(format!("{}/api/analytics/summary", sat.base_url())).bearer_auth(tokens[who].clone()).query(query);
        async move {
            let response = request.send().await.expect("request");
            let status = response.status();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let summary = wait_until(DEADLINE, "bob's call in acme's figures", || {
        let pending = get("alice", &[]);
        async move {
            let (status, body) = pending.await;
            assert_eq!(status, StatusCode::OK, "{body}");
            (body["calls"]["total"] == 1).then_some(body)
        }
    })
    .await;
    assert_eq!(summary["filter"]["scope"], "team:acme");
    assert_eq!(u(&summary["schema_only"]["callers"]), 2);
    assert_eq!(u(&summary["realized"]["listings"]), 1);
    assert_eq!(get("bob", &[]).await.0, StatusCode::FORBIDDEN, "a team_user is not an admin");
    assert_eq!(get("carol", &[("team_id", "acme")]).await.0, StatusCode::FORBIDDEN, "another team's admin");
    let (status, carol) = get("carol", &[]).await;
    assert_eq!((status, u(&carol["calls"]["total"]), u(&carol["schema_only"]["callers"])), (StatusCode::OK, 0, 1));
    sat.satellite.shutdown().await;
}
