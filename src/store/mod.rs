//! SQLite through sqlx: the pool, migrations, and the repositories. The only
//! place SQL lives.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

pub mod analytics;
mod catalog;
mod events;
mod status;
pub mod toolsets;

pub use catalog::{CatalogOwner, HeldTool, ToolChangeRow};
pub use events::{NewEvent, OutboxSummary, StoredEvent};
pub use status::StatusRecord;

/// Status rows kept per instance.
pub const STATUS_HISTORY_KEPT: i64 = 200;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored json is corrupt: {0}")]
    Json(#[from] serde_json::Error),
}

/// Handle to the satellite's database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Open (creating) `satellite.db` in `data_dir`, in WAL mode with a busy timeout, and migrate it.
    pub async fn open(data_dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| StoreError::DataDir { path: data_dir.display().to_string(), source })?;
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(data_dir.join("satellite.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}
