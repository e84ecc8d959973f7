//! The database's migrations, compiled into the binary from `migrations/` without sqlx's macros (whose build
//! compiles sqlx's SQLite and PostgreSQL drivers a second time, for the compiler: issue 74's build time). Each
//! file is read as `sqlx migrate` reads a directory: `<version>_<description>.sql`, simple (no down step), its
//! checksum the SHA-384 of its text, so a database migrated by an earlier build is recognised. A test checks
//! these lists against the directories.

use std::borrow::Cow;

use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};

/// SQLite's migrations, in order.
pub(super) const SQLITE: Embedded = Embedded(&[
    ("0001_catalog_and_status.sql", include_str!("../../../../migrations/sqlite/0001_catalog_and_status.sql")),
    ("0002_event_outbox.sql", include_str!("../../../../migrations/sqlite/0002_event_outbox.sql")),
    ("0003_event_outbox_held.sql", include_str!("../../../../migrations/sqlite/0003_event_outbox_held.sql")),
    ("0004_analytics.sql", include_str!("../../../../migrations/sqlite/0004_analytics.sql")),
    ("0005_tool_changes.sql", include_str!("../../../../migrations/sqlite/0005_tool_changes.sql")),
    ("0006_toolsets.sql", include_str!("../../../../migrations/sqlite/0006_toolsets.sql")),
    ("0007_tool_holds.sql", include_str!("../../../../migrations/sqlite/0007_tool_holds.sql")),
    ("0008_outbox_claims.sql", include_str!("../../../../migrations/sqlite/0008_outbox_claims.sql")),
    ("0009_replicas.sql", include_str!("../../../../migrations/sqlite/0009_replicas.sql")),
    (
        "0010_outbox_without_type_index.sql",
        include_str!("../../../../migrations/sqlite/0010_outbox_without_type_index.sql"),
    ),
    ("0011_analytics_call_counts.sql", include_str!("../../../../migrations/sqlite/0011_analytics_call_counts.sql")),
    (
        "0012_analytics_listing_counts.sql",
        include_str!("../../../../migrations/sqlite/0012_analytics_listing_counts.sql"),
    ),
    ("0013_limit_usage.sql", include_str!("../../../../migrations/sqlite/0013_limit_usage.sql")),
]);

/// PostgreSQL's migrations, in order.
pub(super) const POSTGRES: Embedded = Embedded(&[
    ("0001_catalog_and_status.sql", include_str!("../../../../migrations/postgres/0001_catalog_and_status.sql")),
    ("0002_event_outbox.sql", include_str!("../../../../migrations/postgres/0002_event_outbox.sql")),
    ("0003_event_outbox_held.sql", include_str!("../../../../migrations/postgres/0003_event_outbox_held.sql")),
    ("0004_analytics.sql", include_str!("../../../../migrations/postgres/0004_analytics.sql")),
    ("0005_tool_changes.sql", include_str!("../../../../migrations/postgres/0005_tool_changes.sql")),
    ("0006_toolsets.sql", include_str!("../../../../migrations/postgres/0006_toolsets.sql")),
    ("0007_tool_holds.sql", include_str!("../../../../migrations/postgres/0007_tool_holds.sql")),
    ("0008_outbox_claims.sql", include_str!("../../../../migrations/postgres/0008_outbox_claims.sql")),
    ("0009_replicas.sql", include_str!("../../../../migrations/postgres/0009_replicas.sql")),
    (
        "0010_outbox_without_type_index.sql",
        include_str!("../../../../migrations/postgres/0010_outbox_without_type_index.sql"),
    ),
    ("0011_analytics_call_counts.sql", include_str!("../../../../migrations/postgres/0011_analytics_call_counts.sql")),
    (
        "0012_analytics_listing_counts.sql",
        include_str!("../../../../migrations/postgres/0012_analytics_listing_counts.sql"),
    ),
    ("0013_limit_usage.sql", include_str!("../../../../migrations/postgres/0013_limit_usage.sql")),
]);

/// Migration files as (file name, text).
#[derive(Debug, Clone, Copy)]
pub(super) struct Embedded(&'static [(&'static str, &'static str)]);

impl Embedded {
    pub(super) async fn migrator(self) -> Result<Migrator, sqlx::migrate::MigrateError> {
        Migrator::new(self).await
    }

    fn migrations(self) -> Result<Vec<Migration>, BoxDynError> {
        self.0
            .iter()
            .map(|(name, sql)| {
                let (version, rest) = name.split_once('_').ok_or_else(|| format!("migration {name}: no version"))?;
                let version: i64 =
                    version.parse().map_err(|_| format!("migration {name}: the version is not a number"))?;
                let description = rest.trim_end_matches(".sql").replace('_', " ");
                let no_tx = sql.starts_with("-- no-transaction");
                Ok(Migration::new(version, Cow::Owned(description), MigrationType::Simple, Cow::Borrowed(*sql), no_tx))
            })
            .collect()
    }
}

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move { self.migrations() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every file of each directory is compiled in, with the version, description and checksum `sqlx migrate`
    /// gives it, so a database an earlier build migrated (with `sqlx::migrate!`) is recognised.
    #[tokio::test]
    async fn the_compiled_in_migrations_are_the_directories() {
        for (embedded, dir) in [(SQLITE, "migrations/sqlite"), (POSTGRES, "migrations/postgres")] {
            let ours = embedded.migrator().await.expect("embedded migrations resolve");
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir);
            let theirs = Migrator::new(path.as_path()).await.expect("the directory resolves");
            let summary = |m: &Migrator| -> Vec<_> {
                m.iter().map(|m| (m.version, m.description.to_string(), m.checksum.to_vec(), m.no_tx)).collect()
            };
            assert_eq!(summary(&ours), summary(&theirs), "{dir}");
            assert!(!summary(&ours).is_empty(), "{dir} has migrations");
        }
    }
}
