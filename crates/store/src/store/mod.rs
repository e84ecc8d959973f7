//! The satellite's database through sqlx: the pool, migrations, and the repositories. The only place SQL
//! lives. Two engines behind one API (sqlx's `Any` driver): the embedded SQLite database in the data directory
//! (the default) or a PostgreSQL server shared by several replicas (`DATABASE_URL`, docs/scale-out.md). The SQL
//! is written once in the dialect both accept (`$n` parameters, `ON CONFLICT`, `CAST(SUM(…) AS BIGINT)`);
//! where the engines differ (`Engine`), the repository picks the statement.
//!
//! [`Store`] opens the database (`open`: the engines, the migrations, the in-memory fallback), closes it, and
//! hands out one repository per concern, each a small cloneable handle on the same pool, so a component holds
//! only the tables it works on:
//!
//! - [`Outbox`] (`outbox`): events appended, claimed by the replica that sends them, held, counted, pruned to
//!   their bounds; the emitter, the uploader and the history upkeep.
//! - [`StatusHistory`] (`status`): each instance's statuses, written with the event that reports the change.
//! - [`Catalogs`] (`catalogs`): the discovered catalogs, their tool history and the drifted tools held; the
//!   instance manager.
//! - [`ToolsetRows`] (`toolsets`): toolsets stored through the API and members' defaults; the toolsets registry.
//! - [`AnalyticsRows`] and [`AnalyticsSums`] (`analytics`): the analytics rows as the recorder writes them and the
//!   upkeep prunes them, and as the admin API sums them.
//! - [`Replicas`] (`replicas`): the shared identity, the leader's recorded commands and advisory locks.
//!
//! Beside them, [`Volume`] says what the data volume did to the database (refused the file, filled up), and
//! [`DataDirLock`] (`dir_lock`) keeps a second satellite off a data directory in use.

use std::path::Path;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Connection, Executor};

use tracing::warn;

use crate::config::Database;

pub mod analytics;
mod catalogs;
pub mod dir_lock;
mod limit_usage;
mod migrations;
mod open;
mod outbox;
mod replicas;
pub mod reserve;
mod sql;
mod status;
pub mod toolsets;
mod volume;

pub use analytics::{AnalyticsRows, AnalyticsSums};
pub use catalogs::{CatalogOwner, Catalogs, HeldTool, ToolChangeRow};
pub use dir_lock::{DataDirLock, DirLockError};
pub use limit_usage::LimitUsage;
pub use outbox::{BytesPruned, DiskUsage, NewEvent, Outbox, OutboxSummary, StoredEvent};
pub use replicas::{AdvisoryLock, ReplicaSignal, Replicas, SharedIdentity};
pub use status::{StatusHistory, StatusRecord};
pub use toolsets::ToolsetRows;
pub use volume::Volume;

/// How long `Store::close` waits for connections still in use, and how often it looks.
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(5);
const CLOSE_POLL: Duration = Duration::from_millis(2);

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

/// Which database engine a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// The pool and the engine behind it: what every repository works on. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) pool: AnyPool,
    pub(crate) engine: Engine,
}

/// The opened database: hands out the repositories; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    /// The database, for logs: the SQLite file, or the PostgreSQL URL with its password masked.
    described: String,
    /// PostgreSQL: the URL, for the connections advisory locks are held on (outside the pool).
    url: Option<std::sync::Arc<SecretString>>,
    /// What the data volume did to the database: its disk reserve, or whether it refused the file.
    volume: Volume,
}

impl Store {
    /// Open (creating) `satellite.db` in `data_dir`, in WAL mode with a busy timeout, and migrate it.
    pub async fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Self::connect(data_dir, &Database { url: None, max_connections: None }).await
    }

    /// Open the configured database (`DATABASE_URL`: PostgreSQL; else SQLite in `data_dir`) and migrate it.
    /// Migrations run under sqlx's migration lock, so replicas starting together apply each one once.
    pub async fn connect(data_dir: &Path, database: &Database) -> Result<Store, StoreError> {
        Self::connect_with_reserve(data_dir, database, 0).await
    }

    /// [`Store::connect`], SQLite keeping a disk reserve of `reserve_bytes` on the data volume (`reserve`): given
    /// back when the database cannot be opened (a full volume), and made when there is room.
    pub async fn connect_with_reserve(
        data_dir: &Path,
        database: &Database,
        reserve_bytes: u64,
    ) -> Result<Store, StoreError> {
        if database.url.is_some() {
            return Self::open_engine(data_dir, database).await;
        }
        let reserve = std::sync::Arc::new(reserve::Reserve::new(data_dir, reserve_bytes));
        let opened = match Self::open_engine(data_dir, database).await {
            Err(err) if reserve_bytes > 0 && reserve.release(&format!("the database could not be opened: {err}")) => {
                Self::open_engine(data_dir, database).await
            }
            opened => opened,
        };
        let mut store = match opened {
            Ok(store) => store,
            Err(err) if open::volume_refused(&err) => {
                tracing::error!(data_dir = %data_dir.display(), error = %err,
                    "the data volume refuses the database file (read-only or full): running on an in-memory database; \
                     calls are served, what is recorded is lost at the next stop; fix the volume and restart");
                return Self::open_in_memory().await;
            }
            Err(err) => return Err(err),
        };
        if reserve_bytes > 0 {
            let kept = reserve.clone();
            let _ = tokio::task::spawn_blocking(move || kept.keep()).await;
            store.volume.reserve = Some(reserve);
        }
        Ok(store)
    }

    /// What the data volume did to the database: its disk reserve, or whether it refused the file.
    pub fn volume(&self) -> Volume {
        self.volume.clone()
    }

    /// Connect to a PostgreSQL database once, without migrating it, and return its server version (for
    /// `check-config`); `None` for the embedded SQLite database, which needs no connection to check.
    pub async fn check(database: &Database) -> Result<Option<String>, StoreError> {
        let Some(url) = &database.url else { return Ok(None) };
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(url.expose_secret()).await?;
        let version: String = sqlx::Row::try_get(&conn.fetch_one("SELECT version() AS v").await?, "v")?;
        conn.close().await?;
        Ok(Some(version))
    }

    /// Close every connection: after this SQLite's WAL is checkpointed into `satellite.db` and its `-wal`/`-shm`
    /// files are gone, so the data directory can be copied or backed up as it is. A connection a stuck task still
    /// holds is given up on after `CLOSE_DEADLINE` (a warning), so a stop cannot hang here. Returns whether every
    /// connection was closed.
    ///
    /// sqlx 0.8's `Pool::close` can return while a connection is still on its way back to the pool (its release
    /// ping in flight; shutdown's last query leaves one so): closing an idle connection hands back a permit that
    /// connection no longer held, so the wait for "all permits back" ends early, and the returning connection then
    /// goes idle in the closed pool and stays open until the last handle drops. So the close is repeated, a few
    /// milliseconds apart, until no connection is left.
    pub async fn close(&self) -> bool {
        self.close_within(CLOSE_DEADLINE).await
    }

    async fn close_within(&self, deadline: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + deadline;
        loop {
            let closed = tokio::time::timeout_at(deadline, self.db.pool.close()).await.is_ok();
            let open = self.db.pool.size();
            if open == 0 {
                return true;
            }
            if !closed || tokio::time::Instant::now() >= deadline {
                warn!(open, "database: connections still in use when closing, left open");
                return false;
            }
            tokio::time::sleep(CLOSE_POLL).await;
        }
    }

    pub fn engine(&self) -> Engine {
        self.db.engine
    }

    /// Whether other satellites (replicas) may share this database: PostgreSQL (`Replicas::shared`).
    pub fn shared(&self) -> bool {
        self.db.engine == Engine::Postgres
    }

    /// `sqlite <file>` or `postgres <url without password>`, for the start-up log and `check-config`.
    pub fn describe(&self) -> String {
        match self.db.engine {
            Engine::Sqlite => format!("sqlite {}", self.described),
            Engine::Postgres => format!("postgres {}", self.described),
        }
    }

    /// The pool, for tests that reach the database behind the repositories' backs.
    #[cfg(test)]
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.db.pool
    }

    /// The event outbox.
    pub fn outbox(&self) -> Outbox {
        Outbox { db: self.db.clone() }
    }

    /// The analytics rows, as they are written and pruned.
    pub fn analytics_rows(&self) -> AnalyticsRows {
        AnalyticsRows { db: self.db.clone() }
    }

    /// The analytics rows, summed for the admin API.
    pub fn analytics_sums(&self) -> AnalyticsSums {
        AnalyticsSums { db: self.db.clone() }
    }

    /// The stored catalogs, their tool history and the held tools.
    pub fn catalogs(&self) -> Catalogs {
        Catalogs { db: self.db.clone() }
    }

    /// The toolsets stored through the API and members' defaults.
    pub fn toolsets(&self) -> ToolsetRows {
        ToolsetRows { db: self.db.clone() }
    }

    /// What replicas sharing the database coordinate through: the shared identity, the leader's recorded
    /// commands, advisory locks.
    pub fn replicas(&self) -> Replicas {
        Replicas { db: self.db.clone(), url: self.url.clone() }
    }

    /// The quotas' counters on tool calls.
    pub fn limit_usage(&self) -> LimitUsage {
        LimitUsage { db: self.db.clone() }
    }

    /// The instances' status history.
    pub fn statuses(&self) -> StatusHistory {
        StatusHistory { db: self.db.clone() }
    }
}

/// Read a column as an `i64`-backed flag (both engines store flags as integers).
pub(crate) fn flag(row: &AnyRow, column: &str) -> Result<bool, StoreError> {
    use sqlx::Row;
    Ok(row.try_get::<i64, _>(column)? != 0)
}

/// Databases for tests on both engines: a fresh database on the PostgreSQL server named by
/// `SATELLITE_TEST_POSTGRES_URL` (`scripts/postgres.sh` starts one; `scripts/test.sh` does), and, in unit
/// tests, one store per engine. Used by this crate's tests and by `tests/`.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// The variable naming the test PostgreSQL server (an admin URL: the tests create databases on it).
    pub const POSTGRES_URL: &str = "SATELLITE_TEST_POSTGRES_URL";

    /// A new, empty database on the test PostgreSQL server; its URL. Fails loudly when no server is named:
    /// these tests must run on both engines, not pass by skipping one.
    pub async fn fresh_postgres_url() -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
        let admin = std::env::var(POSTGRES_URL).map_err(|_| {
            format!("{POSTGRES_URL} is not set: start a server with `eval \"$(bash scripts/postgres.sh start)\"`")
        })?;
        sqlx::any::install_default_drivers();
        let name = format!("satellite_test_{:016x}", rand::random::<u64>());
        let mut conn = sqlx::AnyConnection::connect(&admin).await?;
        conn.execute(format!("CREATE DATABASE {name}").as_str()).await?;
        conn.close().await?;
        let mut url = url::Url::parse(&admin)?;
        url.set_path(&format!("/{name}"));
        Ok(url.to_string())
    }

    /// One store per engine: `[("sqlite", …), ("postgres", …)]`, and the temporary directory SQLite lives in.
    #[cfg(test)]
    pub async fn both_engines(
    ) -> Result<(tempfile::TempDir, Vec<(&'static str, Store)>), Box<dyn std::error::Error + Send + Sync>> {
        let dir = tempfile::tempdir()?;
        let sqlite = Store::open(dir.path()).await?;
        let postgres = Store::connect(
            dir.path(),
            &Database { url: Some(fresh_postgres_url().await?.into()), max_connections: Some(4) },
        )
        .await?;
        Ok((dir, vec![("sqlite", sqlite), ("postgres", postgres)]))
    }
}

#[cfg(test)]
#[path = "engines_tests.rs"]
mod engines_tests;
