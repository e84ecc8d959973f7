//! The satellite's database through sqlx: the pool, migrations, and the repositories. The only place SQL
//! lives. Two engines behind one API (sqlx's `Any` driver): the embedded SQLite database in the data directory
//! (the default) or a PostgreSQL server shared by several replicas (`DATABASE_URL`, docs/scale-out.md). The SQL
//! is written once in the dialect both accept (`$n` parameters, `ON CONFLICT`, `CAST(SUM(…) AS BIGINT)`);
//! where the engines differ (`Engine`), the repository picks the statement.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::sqlite::{SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AnyPool, ConnectOptions, Connection, Executor};

use tracing::{info, warn};

use crate::config::{mask_url_password, Database};

pub mod analytics;
mod catalog;
mod events;
mod migrations;
mod replicas;
pub mod reserve;
mod sql;
mod status;
pub mod toolsets;

pub use catalog::{CatalogOwner, HeldTool, ToolChangeRow};
pub use events::{BytesPruned, DiskUsage, NewEvent, OutboxSummary, StoredEvent};
pub use replicas::{AdvisoryLock, ReplicaSignal, SharedIdentity};
pub use status::StatusRecord;

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

/// Handle to the satellite's database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    engine: Engine,
    /// The database, for logs: the SQLite file, or the PostgreSQL URL with its password masked.
    described: String,
    /// PostgreSQL: the URL, for the connections advisory locks are held on (outside the pool).
    url: Option<std::sync::Arc<SecretString>>,
    /// SQLite: the disk reserve on the data volume (`reserve`).
    reserve: Option<std::sync::Arc<reserve::Reserve>>,
    /// The data volume refused the database file: this store is in memory, and nothing survives a stop.
    in_memory: bool,
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
            Err(err) if volume_refused(&err) => {
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
            store.reserve = Some(reserve);
        }
        Ok(store)
    }

    /// The disk reserve of the SQLite data volume, when there is one.
    pub fn reserve(&self) -> Option<&reserve::Reserve> {
        self.reserve.as_deref()
    }

    /// Whether the data volume refused the database file and this store is in memory.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// An in-memory SQLite database on one connection (one connection is one database, kept for the satellite's
    /// life), migrated like the file.
    async fn open_in_memory() -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .after_connect(|conn, _| {
                Box::pin(async move { conn.execute("PRAGMA foreign_keys = ON").await.map(|_| ()) })
            })
            .connect("sqlite::memory:")
            .await?;
        migrations::SQLITE.migrator().await?.run(&pool).await?;
        Ok(Store {
            pool,
            engine: Engine::Sqlite,
            described: "in memory (the data volume refused the database file)".into(),
            url: None,
            reserve: None,
            in_memory: true,
        })
    }

    async fn open_engine(data_dir: &Path, database: &Database) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        match &database.url {
            Some(url) => {
                let url = url.expose_secret();
                let pool = AnyPoolOptions::new()
                    .max_connections(database.max_connections.unwrap_or(8))
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(url)
                    .await?;
                migrations::POSTGRES.migrator().await?.run(&pool).await?;
                Ok(Store {
                    pool,
                    engine: Engine::Postgres,
                    described: mask_url_password(url),
                    url: Some(std::sync::Arc::new(SecretString::from(url.to_owned()))),
                    reserve: None,
                    in_memory: false,
                })
            }
            None => {
                std::fs::create_dir_all(data_dir)
                    .map_err(|source| StoreError::DataDir { path: data_dir.display().to_string(), source })?;
                let file = data_dir.join("satellite.db");
                // WAL and incremental auto-vacuum are properties of the file: set once on a connection of its
                // own, they hold for every later one. Auto-vacuum must be chosen before the first table (sqlx sets
                // it before the journal mode); a file made before it had none and is converted here.
                let mut first = SqliteConnectOptions::from_str("sqlite://")?
                    .filename(&file)
                    .create_if_missing(true)
                    .auto_vacuum(SqliteAutoVacuum::Incremental)
                    .journal_mode(SqliteJournalMode::Wal)
                    .connect()
                    .await?;
                convert_to_incremental_vacuum(&mut first, &file).await?;
                first.close().await?;
                let url = sqlite_url(&file)?;
                let pool = AnyPoolOptions::new()
                    .max_connections(database.max_connections.unwrap_or(4))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // A connection's page cache is private memory that only grows (2 MiB each by default):
                            // with the 4,500-tool corpus the pool's caches held 7-12 MiB of pages the OS page
                            // cache holds anyway (docs/performance-history.md, 2026-11-25). 256 KiB keeps the b-trees'
                            // upper pages, which is what the per-call inserts and catalog reads touch.
                            conn.execute(
                                "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000; \
                                 PRAGMA cache_size = -256",
                            )
                            .await
                            .map(|_| ())
                        })
                    })
                    .connect(&url)
                    .await?;
                migrations::SQLITE.migrator().await?.run(&pool).await?;
                Ok(Store {
                    pool,
                    engine: Engine::Sqlite,
                    described: file.display().to_string(),
                    url: None,
                    reserve: None,
                    in_memory: false,
                })
            }
        }
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
            let closed = tokio::time::timeout_at(deadline, self.pool.close()).await.is_ok();
            let open = self.pool.size();
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
        self.engine
    }

    /// Whether other satellites (replicas) may share this database: PostgreSQL. The replica machinery (shared
    /// identity, leader lock, recorded commands, the toolsets and holds re-read) runs only then.
    pub fn shared(&self) -> bool {
        self.engine == Engine::Postgres
    }

    /// `sqlite <file>` or `postgres <url without password>`, for the start-up log and `check-config`.
    pub fn describe(&self) -> String {
        match self.engine {
            Engine::Sqlite => format!("sqlite {}", self.described),
            Engine::Postgres => format!("postgres {}", self.described),
        }
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Deletes outbox rows behind the outbox's back: the gap a crashed writer or an operator leaves, for the
    /// uploader's tests in the crates above (`test-support`).
    #[cfg(any(test, feature = "test-support"))]
    pub async fn delete_events_for_tests(&self, seqs: &[i64]) -> Result<(), StoreError> {
        let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&format!("DELETE FROM event_outbox WHERE seq IN ({list})")).execute(&self.pool).await?;
        Ok(())
    }
}

/// A SQLite file created before the satellite chose incremental auto-vacuum never gives pages back to the file
/// system: pruned events leave free pages the file keeps. `VACUUM` converts it (rewriting the file, so it needs as
/// much free disk again and time in proportion); done at start for files up to `CONVERT_MAX_BYTES`, left to the
/// operator with a warning above that (docs/operations.md).
async fn convert_to_incremental_vacuum(conn: &mut sqlx::SqliteConnection, file: &Path) -> Result<(), StoreError> {
    /// `PRAGMA auto_vacuum`'s value for INCREMENTAL.
    const INCREMENTAL: i64 = 2;
    let mode: i64 = sqlx::Row::try_get(&conn.fetch_one("PRAGMA auto_vacuum").await?, 0)?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    // With its WAL: a VACUUM checkpoints it into the file first.
    let wal = file.with_extension("db-wal");
    let size = [file, wal.as_path()].iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum::<u64>();
    if size > CONVERT_MAX_BYTES {
        warn!(
            file = %file.display(),
            size,
            "database: this file gives no freed space back to the disk; stop the satellite and run \
             `sqlite3 <file> 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM;'` once"
        );
        return Ok(());
    }
    // Best effort: a disk too full for the rewrite, or a lock a backup holds, must not stop the satellite; the
    // file then keeps its free pages until a later start converts it.
    match conn.execute("PRAGMA auto_vacuum = INCREMENTAL; VACUUM").await {
        Ok(_) => info!(file = %file.display(), size, "database: converted to incremental auto-vacuum"),
        Err(err) => warn!(file = %file.display(), size, error = %err,
            "database: converting to incremental auto-vacuum failed; freed space stays in the file until a later start converts it"),
    }
    Ok(())
}

/// The largest SQLite file converted to incremental auto-vacuum at start (see `convert_to_incremental_vacuum`).
const CONVERT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// A `sqlite://` URL for `file`, percent-encoding what a URL would misread (`?`, `#`, `%`, spaces). A path that
/// is not UTF-8 cannot be written in a URL and is refused rather than changed.
/// Whether opening the database failed because its volume refuses the file (read-only, full, an I/O error), not
/// because of what is in it: then the satellite runs on an in-memory database rather than not at all.
fn volume_refused(err: &StoreError) -> bool {
    if let StoreError::DataDir { source, .. } = err {
        return matches!(source.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem);
    }
    let text = err.to_string().to_lowercase();
    ["read-only", "readonly", "disk is full", "disk i/o error", "unable to open database"]
        .iter()
        .any(|s| text.contains(s))
}

fn sqlite_url(file: &Path) -> Result<String, StoreError> {
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'?').add(b'#').add(b'%');
    let path = file.to_str().ok_or_else(|| StoreError::DataDir {
        path: file.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path is not UTF-8"),
    })?;
    Ok(format!("sqlite://{}?mode=rwc", percent_encoding::utf8_percent_encode(path, ESCAPED)))
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
