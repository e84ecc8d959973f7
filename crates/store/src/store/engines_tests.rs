//! Every repository function on both engines (issue 18): the same calls give the same answers on SQLite and on
//! PostgreSQL, and the event outbox's claims keep replicas from sending an event twice.

use std::collections::HashSet;

use chrono::{TimeZone, Utc};
use serde_json::json;

use super::analytics::{AnalyticsRow, CallRow, DiscoverRow, Grouping, ListingRow, RowFilter, RowKey};
use super::testing::both_engines;
use super::toolsets::ToolsetRow;
use super::*;
use crate::model::{Catalog, ChangeKind, InstanceStatus, ToolChange, ToolDef};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn catalog() -> Catalog {
    let tools = ["echo", "add"]
        .iter()
        .filter_map(|name| {
            ToolDef::from_listing(
                &json!({"name": name, "description": format!("{name} it"), "inputSchema": {"type": "object"}}),
            )
        })
        .collect();
    Catalog {
        tools,
        resources: vec![],
        templates: vec![],
        discovered_at: Utc.with_ymd_and_hms(2026, 11, 20, 10, 0, 0).single().unwrap_or_default(),
        tool_tokens: vec![12, 30],
        fallbacks: vec![],
        header_tools: Default::default(),
        names: Default::default(),
    }
}

fn key(at: &str, user: &str) -> RowKey {
    RowKey { at: at.into(), team_id: "t1".into(), user_id: user.into(), session: format!("s-{user}") }
}

/// Everything a store answers after the same writes, as one JSON document to compare across engines.
async fn exercise(store: &Store) -> Result<serde_json::Value, Box<dyn std::error::Error + Send + Sync>> {
    let spec = crate::model::sample_spec();
    let owner = CatalogOwner::from(&spec);
    store.catalogs().save_catalog(&owner, &catalog()).await?;
    store.catalogs().save_catalog(&owner, &catalog()).await?; // replaced whole, not doubled
    let catalogs = store.catalogs().load_catalogs().await?;
    let loaded = &catalogs[&spec.process_id];
    let changes = [
        ToolChange {
            name: "echo".into(),
            kind: ChangeKind::Updated,
            parts: vec!["description".into()],
            old_hash: Some("a".into()),
            new_hash: Some("b".into()),
        },
        ToolChange {
            name: "gone".into(),
            kind: ChangeKind::Removed,
            parts: vec![],
            old_hash: Some("c".into()),
            new_hash: None,
        },
    ];
    store.catalogs().record_tool_changes(&owner, &changes, &HashSet::from(["echo".to_owned()])).await?;
    store.catalogs().hold_tools("i1", "demo-acme-u1-i1", &["echo", "add"]).await?;
    store.catalogs().hold_tools("i1", "demo-acme-u1-i1", &["echo"]).await?; // already held: kept once
    let released = store.catalogs().release_hold("i1", "add").await?;
    let released_again = store.catalogs().release_hold("i1", "add").await?;
    let at = |minute: u32| Utc.with_ymd_and_hms(2026, 11, 20, 10, minute, 0).single().unwrap_or_default();
    for (minute, status) in [(1, InstanceStatus::Connecting), (2, InstanceStatus::Online), (3, InstanceStatus::Error)] {
        store.statuses().record_status(&spec, status, Some("why"), at(minute), None).await?;
    }
    let row = |kind: ListingRow| AnalyticsRow::Listing(kind);
    store
        .analytics_rows()
        .insert_analytics(&[
            row(ListingRow {
                key: key("2026-11-20T10:00:00.000Z", "u1"),
                router: "hierarchical",
                process_id: None,
                installation_id: None,
                listings: 1,
                tools_shown: 4,
                shown_tokens: 400,
                tools_visible: 40,
                visible_tokens: 4000,
                proxy_tokens: 4000,
            }),
            AnalyticsRow::Discover(DiscoverRow {
                key: key("2026-11-20T10:01:00.000Z", "u1"),
                discover_key: "d1".into(),
                results: 3,
                result_tokens: 90,
            }),
            AnalyticsRow::Call(CallRow {
                key: key("2026-11-20T10:02:00.000Z", "u1"),
                router: "hierarchical",
                process_id: "demo-acme-u1-i1".into(),
                installation_id: "i1".into(),
                server_slug: "demo".into(),
                tool_name: "echo".into(),
                outcome: "ok",
                // Three like calls merged (analytics::Recorder::call): they count three, averaging 4 ms.
                calls: 3,
                duration_ms: 12,
                discover_key: Some("d1".into()),
            }),
            AnalyticsRow::Call(CallRow {
                key: key("2026-11-21T10:02:00.000Z", "u2"),
                router: "instance",
                process_id: "demo-acme-u1-i1".into(),
                installation_id: "i1".into(),
                server_slug: "demo".into(),
                tool_name: "add".into(),
                outcome: "error",
                calls: 1,
                duration_ms: 7,
                discover_key: None,
            }),
        ])
        .await?;
    let all = RowFilter::default();
    let (total, _) = store.analytics_sums().activity(&all, Grouping::Total, 10, 0).await?;
    let (by_user, users) = store.analytics_sums().activity(&all, Grouping::User, 10, 0).await?;
    let (by_day, days) = store.analytics_sums().activity(&all, Grouping::TimePrefix(10), 10, 0).await?;
    let one_install = RowFilter { installation_id: Some("i1".into()), ..RowFilter::default() };
    let (installed, _) = store.analytics_sums().activity(&one_install, Grouping::Session, 10, 0).await?;
    let (tools, tool_count) = store.analytics_sums().tool_calls(&all, 10, 0).await?;
    let costs = store.analytics_sums().catalog_costs(&all).await?;
    let (failures, failure_count) = store.analytics_sums().recent_failures(&all, 10, 0).await?;
    let called =
        store.catalogs().called_since("demo-acme-u1-i1", &["echo", "add", "none"], "2026-11-20T10:02:00.000Z").await?;
    let mut called: Vec<String> = called.into_iter().collect();
    called.sort();
    store
        .toolsets()
        .put_toolset(&ToolsetRow {
            team_id: "t1".into(),
            owner: None,
            name: "web".into(),
            description: Some("d".into()),
            patterns: vec!["demo:*".into()],
            updated_at: "2026-11-20T10:00:00.000Z".into(),
            updated_by: "admin".into(),
        })
        .await?;
    store.toolsets().set_default_toolset("t1", "u1", Some("web"), "2026-11-20T10:00:00.000Z").await?;
    store.toolsets().set_default_toolset("t1", "u1", Some("web"), "2026-11-20T10:05:00.000Z").await?;
    let (toolsets, defaults) = store.toolsets().load_toolsets().await?;
    let deleted = store.toolsets().delete_toolset("t1", None, "web").await?;
    let (_, defaults_after) = store.toolsets().load_toolsets().await?;
    let events: Vec<NewEvent<'_>> = (1..=5)
        .map(|day| NewEvent {
            event_type: "mcp.tool.executed",
            emitted_at: format!("2026-11-{day:02}T00:00:00.000Z"),
            data: json!({"day": day}).to_string().into(),
            process_id: Some("demo-acme-u1-i1"),
            held: None,
        })
        .collect();
    store.outbox().append_events(&events).await?;
    store.outbox().hold_event(1, "test").await?;
    let summary = store.outbox().outbox_summary().await?;
    let last_seq = store.outbox().outbox_last_seq().await?;
    let typed = store.outbox().events(Some("mcp.tool.executed"), 2, 10).await?.len();
    let untyped = store.outbox().events(None, 0, 10).await?.len();
    let pruned_before = store.outbox().prune_events_before("2026-11-02T00:00:00.000Z").await?;
    let pruned = store.outbox().prune_events(2).await?;
    let pruned_analytics = store.analytics_rows().prune_analytics("2026-11-21T00:00:00.000Z").await?;
    store.catalogs().delete_catalog(&spec.process_id).await?;
    let usage = store.limit_usage();
    let mut quota = Vec::new();
    for want in [1, 3, 4, 1] {
        quota.push(usage.take("r", "t1/u1", "2026-12-06", want, 5).await?);
    }
    usage.give_back("r", "t1/u1", "2026-12-06").await?;
    quota.push(usage.take("r", "t1/u1", "2026-12-06", 2, 5).await?);
    usage.take("r", "t1/u1", "2026-12-05", 1, 5).await?;
    let forgotten = usage.forget_before("2026-12-06").await?;
    let quota_left = usage.taken("r", "t1/u1", "2026-12-06").await?;
    Ok(json!({
        "quota": [quota, vec![forgotten, quota_left]],
        "catalog": {"tools": loaded.tools.iter().map(|t| t.name()).collect::<Vec<_>>(), "tokens": loaded.tool_tokens,
                    "discovered_at": loaded.discovered_at.to_rfc3339()},
        // Without the times the satellite stamps (`now`).
        "history": store.catalogs().tool_history("demo-acme-u1-i1", 10).await?.into_iter()
            .map(|(_, tool, change, parts, drifted)| json!([tool, change, parts, drifted])).collect::<Vec<_>>(),
        "changes": store.catalogs().tool_changes(Some("t1"), None, 10, 0).await?.into_iter()
            .map(|c| json!([c.tool_name, c.change, c.parts, c.drifted, c.installation_id])).collect::<Vec<_>>(),
        "no_changes": store.catalogs().tool_changes(Some("t2"), None, 10, 0).await?.len(),
        "held": store.catalogs().held_tools().await?.iter().map(|h| (&h.installation_id, &h.tool_name)).collect::<Vec<_>>(),
        "released": [released, released_again],
        "statuses": store.statuses().status_history(&spec.process_id).await?.iter().map(|s| (&s.status, &s.message, &s.at)).collect::<Vec<_>>(),
        "total": [total[0].listings, total[0].shown_tokens, total[0].proxy_tokens, total[0].discovers,
                  total[0].discover_hits, total[0].calls, total[0].call_errors, total[0].sessions],
        "by_user": [users, by_user.len() as u64], "user_groups": by_user.iter().map(|g| &g.group).collect::<Vec<_>>(),
        "by_day": [days, by_day.len() as u64], "installed_sessions": installed.len(),
        "tools": tools.iter().map(|t| (&t.tool_name, t.calls, t.errors, t.from_discover, t.avg_duration_ms)).collect::<Vec<_>>(),
        "tool_count": tool_count,
        "costs": costs.iter().map(|c| (&c.process_id, c.tools, c.tokens)).collect::<Vec<_>>(),
        "failures": [failure_count, failures.len() as u64],
        "failure_kinds": failures.iter().map(|f| f.kind).collect::<Vec<_>>(),
        "called": called,
        "toolsets": toolsets.iter().map(|t| (&t.name, &t.owner, &t.patterns)).collect::<Vec<_>>(),
        "defaults": defaults.iter().map(|d| (&d.user_id, &d.name)).collect::<Vec<_>>(),
        "deleted": deleted, "defaults_after": defaults_after.len(),
        "outbox": [summary.count, summary.held, last_seq, typed as i64, untyped as i64, pruned_before as i64, pruned as i64],
        "oldest": summary.oldest_emitted_at,
        "pruned_analytics": pruned_analytics,
        "catalogs_left": store.catalogs().load_catalogs().await?.len(),
    }))
}

#[tokio::test]
async fn every_repository_call_answers_the_same_on_sqlite_and_postgres() -> TestResult {
    let (_dir, stores) = both_engines().await?;
    let mut answers = Vec::new();
    for (engine, store) in &stores {
        let answer = exercise(store).await.map_err(|err| format!("{engine}: {err}"))?;
        answers.push((engine, answer));
    }
    let (_, sqlite) = &answers[0];
    // What the calls mean, checked once (on SQLite) ...
    assert_eq!(sqlite["catalog"]["tools"], json!(["echo", "add"]));
    assert_eq!(sqlite["catalog"]["tokens"], json!([12, 30]));
    assert_eq!(sqlite["held"], json!([["i1", "echo"]]));
    assert_eq!(sqlite["released"], json!([true, false]));
    assert_eq!(sqlite["total"], json!([1, 400, 4000, 1, 1, 4, 1, 2]));
    assert_eq!(sqlite["user_groups"], json!(["t1\u{1f}u2", "t1\u{1f}u1"]));
    assert_eq!(sqlite["tools"], json!([["echo", 3, 0, 3, 4.0], ["add", 1, 1, 0, 7.0]]));
    assert_eq!(sqlite["costs"], json!([["demo-acme-u1-i1", 2, 42]]));
    assert_eq!(sqlite["failures"], json!([2, 2]), "one failed call and one error status");
    assert_eq!(sqlite["called"], json!(["add", "echo"]));
    assert_eq!(sqlite["history"][1][3], json!(true), "echo drifted (newest first: gone, echo)");
    assert_eq!(sqlite["outbox"], json!([5, 1, 5, 3, 5, 1, 2]));
    assert_eq!(sqlite["deleted"], json!(true));
    assert_eq!(sqlite["defaults_after"], json!(0), "the default naming the deleted toolset is cleared");
    assert_eq!(sqlite["pruned_analytics"], json!(3));
    assert_eq!(sqlite["catalogs_left"], json!(0));
    assert_eq!(sqlite["quota"], json!([[1, 3, 1, 0, 1], [1, 5]]), "1, 3, the last 1 of 5, none, one given back");
    // ... and PostgreSQL answers exactly the same.
    for (engine, answer) in &answers[1..] {
        assert_eq!(answer, sqlite, "{engine} differs from sqlite");
    }
    Ok(())
}

/// `n` events numbered by their `data.i`.
fn numbered(n: usize) -> Vec<NewEvent<'static>> {
    (0..n)
        .map(|i| NewEvent {
            event_type: "mcp.tool.executed",
            emitted_at: "2026-11-20T00:00:00.000Z".into(),
            data: json!({"i": i}).to_string().into(),
            process_id: None,
            held: None,
        })
        .collect()
}

#[tokio::test]
async fn claimed_events_go_to_one_replica_and_a_lapsed_claim_to_the_next() -> TestResult {
    let (_dir, stores) = both_engines().await?;
    for (engine, store) in &stores {
        store.outbox().append_events(&numbered(10)).await?;
        let seqs = |events: &[StoredEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
        let a = store.outbox().claim_events("a", 4, 60_000, Some(1_000)).await?;
        let b = store.outbox().claim_events("b", 4, 60_000, Some(1_000)).await?;
        assert_eq!(seqs(&a), [1, 2, 3, 4], "{engine}: the oldest to the first claimer");
        assert_eq!(seqs(&b), [5, 6, 7, 8], "{engine}: the next claimer passes over a live claim");
        assert_eq!(
            store.outbox().delete_claimed("b", &[1, 2, 3, 4, 5, 6, 7, 8]).await?,
            4,
            "{engine}: b deletes only its own claim"
        );
        // a dies; its lease lapses at 61 s; c finds a's batch then, not before.
        let early = store.outbox().claim_events("c", 4, 60_000, Some(30_000)).await?;
        assert_eq!(seqs(&early), [9, 10], "{engine}: a's claim is live at 30 s");
        let late = store.outbox().claim_events("c", 10, 60_000, Some(62_000)).await?;
        assert_eq!(seqs(&late), [1, 2, 3, 4, 9, 10], "{engine}: a lapsed claim is taken over, c's own kept");
        assert_eq!(
            store.outbox().delete_claimed("a", &[1, 2, 3, 4, 9, 10]).await?,
            0,
            "{engine}: a late a deletes nothing c holds"
        );
        assert_eq!(store.outbox().release_claims("c").await?, 6);
        assert_eq!(seqs(&store.outbox().claim_events("d", 10, 60_000, Some(62_000)).await?), [1, 2, 3, 4, 9, 10]);
        // On the database's own clock: a live lease of a minute is not taken, a lapsed one is.
        store.outbox().release_claims("d").await?;
        assert_eq!(store.outbox().claim_events("e", 10, 60_000, None).await?.len(), 6, "{engine}");
        assert!(store.outbox().claim_events("f", 10, 60_000, None).await?.is_empty(), "{engine}: e's lease is live");
        let far = chrono::Utc::now().timestamp_millis() + 120_000;
        assert_eq!(store.outbox().claim_events("f", 10, 60_000, Some(far)).await?.len(), 6, "{engine}: lapsed by then");
        // SQLite has one process: claims found at an uploader's start are a dead run's, released at once.
        let released = store.outbox().release_stale_claims().await?;
        assert_eq!(released, if *engine == "sqlite" { 6 } else { 0 }, "{engine}");
        store.close().await;
    }
    Ok(())
}

/// Eight claimers racing on PostgreSQL (`FOR UPDATE SKIP LOCKED`): every event is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claimers_on_postgres_never_share_an_event() -> TestResult {
    let (_dir, stores) = both_engines().await?;
    let Some((_, store)) = stores.into_iter().find(|(engine, _)| *engine == "postgres") else {
        return Err("no postgres store".into());
    };
    store.outbox().append_events(&numbered(2_000)).await?;
    let mut claimers = Vec::new();
    for n in 0..8 {
        let store = store.clone();
        claimers.push(tokio::spawn(async move {
            let owner = format!("replica-{n}");
            let mut mine = Vec::new();
            loop {
                let batch = store.outbox().claim_events(&owner, 25, 60_000, None).await?;
                if batch.is_empty() {
                    break;
                }
                let seqs: Vec<i64> = batch.iter().map(|e| e.seq).collect();
                store.outbox().delete_claimed(&owner, &seqs).await?;
                mine.extend(seqs);
            }
            Ok::<_, StoreError>(mine)
        }));
    }
    let mut seen = Vec::new();
    for claimer in claimers {
        seen.extend(claimer.await??);
    }
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(seen.len(), 2_000, "every event claimed");
    assert_eq!(unique.len(), 2_000, "none claimed twice");
    assert_eq!(store.outbox().event_count().await?, 0);
    assert_eq!(store.outbox().event_seq_span().await?, 0, "an empty outbox spans nothing");
    Ok(())
}

/// A batch written as several statements is all or nothing: when its second statement fails, the rows the first
/// one wrote are gone too, on both engines (a half-written batch would be retried and its first rows doubled).
#[tokio::test]
async fn a_batch_whose_second_statement_fails_leaves_no_row() -> TestResult {
    let (_dir, stores) = both_engines().await?;
    for (engine, store) in &stores {
        sqlx::query("CREATE TABLE batch_probe (n BIGINT PRIMARY KEY)").execute(store.pool()).await?;
        let head = "INSERT INTO batch_probe (n)";
        let mut statements = sql::Sql::inserts(store.engine(), head, &[1_i64, 2], |n| vec![sql::Bind::Int(*n)]);
        statements.extend(sql::Sql::inserts(store.engine(), head, &[3_i64, 1], |n| vec![sql::Bind::Int(*n)]));
        assert_eq!(statements.len(), 2, "{engine}: two statements");
        let failed = sql::execute_all(store.pool(), &statements).await;
        assert!(failed.is_err(), "{engine}: the second statement repeats a key and fails");
        let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM batch_probe").fetch_one(store.pool()).await?;
        assert_eq!(rows, 0, "{engine}: the first statement's rows are rolled back with it");
        // The same batch without the repeat lands whole.
        let good = sql::Sql::inserts(store.engine(), head, &[1_i64, 2, 3], |n| vec![sql::Bind::Int(*n)]);
        sql::execute_all(store.pool(), &good).await?;
        let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM batch_probe").fetch_one(store.pool()).await?;
        assert_eq!(rows, 3, "{engine}");
        store.close().await;
    }
    Ok(())
}

#[tokio::test]
async fn every_sqlite_connection_keeps_a_small_page_cache_and_enforces_foreign_keys() -> TestResult {
    use sqlx::{Executor as _, Row as _};
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path()).await?;
    // All four of the pool's connections at once, so none is checked twice.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(store.pool().acquire().await?);
    }
    for conn in &mut held {
        let cache: i64 = conn.fetch_one("PRAGMA cache_size").await?.try_get(0)?;
        assert_eq!(cache, -256, "a 256 KiB page cache, not the 2 MiB default");
        let foreign_keys: i64 = conn.fetch_one("PRAGMA foreign_keys").await?.try_get(0)?;
        assert_eq!(foreign_keys, 1);
    }
    Ok(())
}

/// The outbox held to a byte bound on both engines: the oldest go, the newest stay, and what stays fits. The
/// payloads are random hex, so PostgreSQL's compression does not make them small.
#[tokio::test]
async fn the_outbox_is_held_to_its_bytes_on_both_engines() -> TestResult {
    const MAX: u64 = 1024 * 1024;
    let (_dir, stores) = both_engines().await?;
    for (engine, store) in stores {
        for chunk in (0..300).collect::<Vec<u32>>().chunks(50) {
            let rows: Vec<NewEvent<'_>> = chunk
                .iter()
                .map(|n| {
                    let pad: String = (0..625).map(|_| format!("{:016x}", rand::random::<u64>())).collect();
                    NewEvent {
                        event_type: "mcp.request.logs",
                        emitted_at: "2026-11-29T00:00:00.000Z".into(),
                        data: json!({"n": n, "pad": pad}).to_string().into(),
                        process_id: None,
                        held: None,
                    }
                })
                .collect();
            store.outbox().append_events(&rows).await?;
        }
        assert!(store.outbox().disk_usage().await?.used > 3 * MAX, "{engine}: 3 MB written");
        let pruned = store.outbox().prune_events_to_bytes(MAX).await?.events;
        let left = store.outbox().events(None, 0, 1000).await?;
        assert_eq!(pruned as usize + left.len(), 300, "{engine}");
        assert!((1..=95).contains(&left.len()), "{engine}: {} events left", left.len());
        assert_eq!(left.last().map(|e| e.data["n"].clone()), Some(json!(299)), "{engine}: the newest stay");
        let kept: usize = left.iter().map(|e| e.data.to_string().len()).sum();
        assert!(kept as u64 <= MAX, "{engine}: {kept} bytes of payloads left");
        assert!(
            store.outbox().outbox_bytes().await? <= MAX,
            "{engine}: {} bytes of outbox left",
            store.outbox().outbox_bytes().await?
        );
        store.close().await;
    }
    Ok(())
}

/// A file made before incremental auto-vacuum (none: freed pages stayed in the file for good) is converted when
/// the store opens it, its rows kept; a new file is made so.
#[tokio::test]
async fn sqlite_files_old_and_new_give_freed_pages_back() -> TestResult {
    use sqlx::{ConnectOptions as _, Connection as _, Executor as _, Row as _};
    let dir = tempfile::tempdir()?;
    let fresh = Store::open(dir.path()).await?;
    let mode: i64 = fresh.pool().acquire().await?.fetch_one("PRAGMA auto_vacuum").await?.try_get(0)?;
    assert_eq!(mode, 2, "a new file is made incremental");
    fresh.close().await;

    let old = tempfile::tempdir()?;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(old.path().join("satellite.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .connect()
        .await?;
    conn.execute("CREATE TABLE kept (v TEXT); INSERT INTO kept VALUES ('still here')").await?;
    let mode: i64 = conn.fetch_one("PRAGMA auto_vacuum").await?.try_get(0)?;
    assert_eq!(mode, 0, "sqlite's default: none");
    conn.close().await?;
    let store = Store::open(old.path()).await?;
    let mut conn = store.pool().acquire().await?;
    let mode: i64 = conn.fetch_one("PRAGMA auto_vacuum").await?.try_get(0)?;
    assert_eq!(mode, 2, "converted when opened");
    let kept: String = conn.fetch_one("SELECT v FROM kept").await?.try_get(0)?;
    assert_eq!(kept, "still here");
    Ok(())
}

/// Shutdown's last step closes the database, and a data directory copied after it (a backup, a move to another
/// host, the restart tests) must hold everything in `satellite.db`. A connection still on its way back to the
/// pool when the close begins (its release ping in flight: the last query of shutdown does exactly this) must be
/// closed too: sqlx 0.8's `Pool::close` returns once the permits are back and can leave it idle, its WAL
/// un-checkpointed until the last handle drops.
#[tokio::test]
async fn closing_the_store_closes_a_connection_that_was_still_being_returned() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path()).await?;
    store
        .outbox()
        .append_events(&[NewEvent {
            event_type: "mcp.server.status_changed",
            emitted_at: "2026-11-28T00:00:00Z".into(),
            data: r#"{"n":1}"#.into(),
            process_id: None,
            held: None,
        }])
        .await?;
    assert_eq!(store.outbox().event_count().await?, 1);
    // Dropping the connection spawned its return; let that task run up to its ping before closing.
    tokio::task::yield_now().await;
    assert!(store.close().await, "every connection closed");
    assert_eq!(store.pool().size(), 0);
    for leftover in ["satellite.db-wal", "satellite.db-shm"] {
        assert!(!dir.path().join(leftover).exists(), "{leftover} is left: the last connection is not closed");
    }
    // The database file alone has the event.
    let copy = tempfile::tempdir()?;
    std::fs::copy(dir.path().join("satellite.db"), copy.path().join("satellite.db"))?;
    let reopened = Store::open(copy.path()).await?;
    assert_eq!(reopened.outbox().event_count().await?, 1);
    reopened.close().await;
    Ok(())
}

/// Connections a stuck task never gives back do not hang the close (and so the stop): it is left open after
/// the deadline, and the close returns.
#[tokio::test]
async fn closing_the_store_gives_up_on_a_connection_that_is_never_returned() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path()).await?;
    // All four of the pool's connections, so none is idle: sqlx's close then waits for them all.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(store.pool().acquire().await?);
    }
    let closed = tokio::time::timeout(Duration::from_secs(30), store.close_within(Duration::from_millis(100)))
        .await
        .map_err(|_| "the close waited for connections that are never returned")?;
    assert!(!closed, "the close says what it left open");
    assert_eq!(store.pool().size(), 4, "the held connections are the ones left");
    drop(held);
    Ok(())
}

/// A transaction SQLite ends itself (as on a full disk; here a trigger's `RAISE(ROLLBACK)` stands in) leaves no
/// connection believing it is still inside one. Before, sqlx's failed ROLLBACK left its count at one: the
/// connection's next transaction was a `SAVEPOINT`, whose rollback left a real transaction open, so what was
/// written after it was never committed (another connection saw none of it) and the write lock was held for good.
#[tokio::test]
async fn a_transaction_sqlite_ended_itself_leaves_the_connection_usable() -> TestResult {
    use sqlx::ConnectOptions as _;
    let dir = tempfile::tempdir()?;
    // One connection, so every write below goes through the one that failed.
    let store = Store::connect(dir.path(), &Database { url: None, max_connections: Some(1) }).await?;
    sqlx::query(
        "CREATE TRIGGER full_disk BEFORE INSERT ON event_outbox WHEN NEW.event_type = 'test.full' \
         BEGIN SELECT RAISE(ROLLBACK, 'a stand-in for a full disk'); END",
    )
    .execute(store.pool())
    .await?;
    sqlx::query(
        "CREATE TRIGGER refused BEFORE INSERT ON event_outbox WHEN NEW.event_type = 'test.refused' \
         BEGIN SELECT RAISE(ABORT, 'one statement refused'); END",
    )
    .execute(store.pool())
    .await?;
    // Two statements, so one transaction (`execute_all`), as a status change and its event are written.
    let batch = |types: [&str; 2]| {
        types.map(|t| {
            sql::Sql::new(format!(
                "INSERT INTO event_outbox (event_type, emitted_at, data) VALUES ('{t}', '2026-12-04T00:00:00.000Z', '{{}}')"
            ))
        })
    };
    // SQLite rolls the whole transaction back itself...
    assert!(sql::execute_all(store.pool(), &batch(["test.ok", "test.full"])).await.is_err());
    // ...then a transaction that fails the ordinary way, rolled back by the satellite...
    assert!(sql::execute_all(store.pool(), &batch(["test.ok", "test.refused"])).await.is_err());
    // ...and the next one is committed: another connection sees it and can write.
    sql::execute_all(store.pool(), &batch(["test.kept", "test.kept"])).await?;
    let mut outside =
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.path().join("satellite.db")).connect().await?;
    let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_outbox WHERE event_type = 'test.kept'")
        .fetch_one(&mut outside)
        .await?;
    assert_eq!(kept, 2, "the batch after the failures was committed");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut outside).await?;
    sqlx::query("ROLLBACK").execute(&mut outside).await?;
    Ok(())
}
