//! Opening the database, migrated: a PostgreSQL pool, the SQLite file in the data directory (WAL, incremental
//! auto-vacuum, each connection's pragmas), or, when the data volume refuses that file, SQLite in memory.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::{SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AnyPool, ConnectOptions, Connection, Executor};
use tracing::{info, warn};

use super::{migrations, Db, Engine, Store, StoreError, Volume};
use crate::config::{mask_url_password, Database};

impl Store {
    /// An in-memory SQLite database on one connection (one connection is one database, kept for the satellite's
    /// life), migrated like the file.
    pub(super) async fn open_in_memory() -> Result<Store, StoreError> {
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
            db: Db { pool, engine: Engine::Sqlite },
            described: "in memory (the data volume refused the database file)".into(),
            url: None,
            volume: Volume { reserve: None, in_memory: true },
        })
    }

    /// The configured database: PostgreSQL at `database.url`, else SQLite in `data_dir`.
    pub(super) async fn open_engine(data_dir: &Path, database: &Database) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        match &database.url {
            Some(url) => Self::open_postgres(url.expose_secret(), database.max_connections).await,
            None => Self::open_sqlite(data_dir, database.max_connections).await,
        }
    }

    async fn open_postgres(url: &str, max_connections: Option<u32>) -> Result<Store, StoreError> {
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections.unwrap_or(8))
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        migrations::POSTGRES.migrator().await?.run(&pool).await?;
        Ok(Store {
            db: Db { pool, engine: Engine::Postgres },
            described: mask_url_password(url),
            url: Some(std::sync::Arc::new(SecretString::from(url.to_owned()))),
            volume: Volume::default(),
        })
    }

    async fn open_sqlite(data_dir: &Path, max_connections: Option<u32>) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| StoreError::DataDir { path: data_dir.display().to_string(), source })?;
        let file = data_dir.join("satellite.db");
        prepare_sqlite_file(&file).await?;
        let pool = sqlite_pool(&sqlite_url(&file)?, max_connections.unwrap_or(4)).await?;
        migrations::SQLITE.migrator().await?.run(&pool).await?;
        Ok(Store {
            db: Db { pool, engine: Engine::Sqlite },
            described: file.display().to_string(),
            url: None,
            volume: Volume::default(),
        })
    }
}

/// WAL and incremental auto-vacuum are properties of the file: set once on a connection of its own, they hold for
/// every later one. Auto-vacuum must be chosen before the first table (sqlx sets it before the journal mode); a
/// file made before it had none and is converted here.
async fn prepare_sqlite_file(file: &Path) -> Result<(), StoreError> {
    let mut first = SqliteConnectOptions::from_str("sqlite://")?
        .filename(file)
        .create_if_missing(true)
        .auto_vacuum(SqliteAutoVacuum::Incremental)
        .journal_mode(SqliteJournalMode::Wal)
        .connect()
        .await?;
    convert_to_incremental_vacuum(&mut first, file).await?;
    first.close().await?;
    Ok(())
}

/// The pool on the SQLite file at `url`, each connection with its pragmas.
async fn sqlite_pool(url: &str, max_connections: u32) -> Result<AnyPool, StoreError> {
    let pool = AnyPoolOptions::new()
        .max_connections(max_connections)
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
        .connect(url)
        .await?;
    Ok(pool)
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

/// Whether opening the database failed because its volume refuses the file (read-only, full, an I/O error), not
/// because of what is in it: then the satellite runs on an in-memory database rather than not at all.
pub(super) fn volume_refused(err: &StoreError) -> bool {
    if let StoreError::DataDir { source, .. } = err {
        return matches!(source.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem);
    }
    let text = err.to_string().to_lowercase();
    ["read-only", "readonly", "disk is full", "disk i/o error", "unable to open database"]
        .iter()
        .any(|s| text.contains(s))
}

/// A `sqlite://` URL for `file`, percent-encoding what a URL would misread (`?`, `#`, `%`, spaces). A path that
/// is not UTF-8 cannot be written in a URL and is refused rather than changed.
fn sqlite_url(file: &Path) -> Result<String, StoreError> {
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'?').add(b'#').add(b'%');
    let path = file.to_str().ok_or_else(|| StoreError::DataDir {
        path: file.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path is not UTF-8"),
    })?;
    Ok(format!("sqlite://{}?mode=rwc", percent_encoding::utf8_percent_encode(path, ESCAPED)))
}
