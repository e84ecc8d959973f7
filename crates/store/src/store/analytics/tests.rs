use super::*;
use crate::store::Store;

fn key(at: &str, user: &str) -> RowKey {
    RowKey { at: at.into(), team_id: "t".into(), user_id: user.into(), session: format!("s-{user}") }
}

fn call(at: &str, user: &str, outcome: &'static str) -> AnalyticsRow {
    AnalyticsRow::Call(CallRow {
        key: key(at, user),
        router: "hierarchical",
        process_id: "p".into(),
        installation_id: "i".into(),
        server_slug: "demo".into(),
        tool_name: "echo".into(),
        outcome,
        calls: 1,
        duration_ms: 3,
        discover_key: None,
    })
}

#[tokio::test]
async fn rows_before_the_cutoff_are_pruned_and_the_rest_still_sum() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path()).await?;
    store
        .analytics_rows()
        .insert_analytics(&[
            call("2020-01-01T00:00:00.000Z", "a", "ok"),
            call("2026-11-01T00:00:00.000Z", "a", "error"),
            call("2026-11-02T00:00:00.000Z", "b", "tool_error"),
        ])
        .await?;
    let (total, _) = store.analytics_sums().activity(&RowFilter::default(), Grouping::Total, 1, 0).await?;
    assert_eq!((total[0].calls, total[0].call_errors, total[0].tool_errors), (3, 1, 1));
    assert_eq!(store.analytics_rows().prune_analytics("2026-01-01T00:00:00.000Z").await?, 1);
    let filter = RowFilter { from: Some("2026-11-02T00:00:00.000Z".into()), ..RowFilter::default() };
    let (by_user, groups) = store.analytics_sums().activity(&filter, Grouping::User, 10, 0).await?;
    assert_eq!((groups, by_user[0].user_id.as_str(), by_user[0].calls), (1, "b", 1));
    let nobody = RowFilter { user_id: Some("z".into()), ..RowFilter::default() };
    let (none, groups) = store.analytics_sums().activity(&nobody, Grouping::Total, 1, 0).await?;
    assert_eq!((none.len(), groups), (0, 0), "no rows, no group");
    store.close().await;
    Ok(())
}
