//! What replicas sharing one PostgreSQL database coordinate through it (`Replicas`, docs/scale-out.md): the one
//! backend identity, the commands the leader ran that every replica must run too, and advisory locks (who
//! registers, who leads). Rows only: what a command means is `backend::managed`'s business.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::{AnyConnection, Connection, Executor, Row};

use super::sql::TxConnection;
use super::{Db, Engine, StoreError};

/// How long opening a lock's own connection may take.
const LOCK_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The managed satellite's credentials as the replicas share them.
#[derive(Debug, Clone)]
pub struct SharedIdentity {
    pub satellite_id: String,
    pub api_key: SecretString,
    pub registered_at: String,
    pub last_verified: String,
}

/// A command the leader ran, for the other replicas to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSignal {
    pub id: i64,
    pub origin: String,
    pub command: serde_json::Value,
}

/// An advisory lock held by a connection of its own: released when dropped, when the replica dies (the server
/// ends the session) or when the database goes away.
pub struct AdvisoryLock {
    conn: AnyConnection,
}

impl AdvisoryLock {
    /// Whether the session holding the lock still answers; a lock whose session broke is gone.
    pub async fn alive(&mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(5), self.conn.ping()).await.is_ok_and(|r| r.is_ok())
    }

    pub async fn release(self) {
        let _ = self.conn.close().await;
    }
}

/// What replicas sharing the database coordinate through; cheap to clone.
#[derive(Debug, Clone)]
pub struct Replicas {
    pub(super) db: Db,
    /// PostgreSQL: the URL, for the connections advisory locks are held on (outside the pool).
    pub(super) url: Option<std::sync::Arc<SecretString>>,
}

impl Replicas {
    /// Whether other satellites (replicas) may share this database: PostgreSQL. The replica machinery (shared
    /// identity, leader lock, recorded commands, the toolsets and holds re-read) runs only then.
    pub fn shared(&self) -> bool {
        self.db.engine == Engine::Postgres
    }

    pub async fn shared_identity(&self, name: &str) -> Result<Option<SharedIdentity>, StoreError> {
        let row = sqlx::query(
            "SELECT satellite_id, api_key, registered_at, last_verified FROM satellite_identity WHERE satellite_name = $1",
        )
        .bind(name)
        .fetch_optional(&self.db.pool)
        .await?;
        row.map(|row| {
            Ok(SharedIdentity {
                satellite_id: row.try_get("satellite_id")?,
                api_key: SecretString::from(row.try_get::<String, _>("api_key")?),
                registered_at: row.try_get("registered_at")?,
                last_verified: row.try_get("last_verified")?,
            })
        })
        .transpose()
    }

    pub async fn save_shared_identity(&self, name: &str, identity: &SharedIdentity) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO satellite_identity (satellite_name, satellite_id, api_key, registered_at, last_verified)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (satellite_name) DO UPDATE SET satellite_id = excluded.satellite_id,
               api_key = excluded.api_key, registered_at = excluded.registered_at,
               last_verified = excluded.last_verified",
        )
        .bind(name)
        .bind(&identity.satellite_id)
        .bind(identity.api_key.expose_secret())
        .bind(&identity.registered_at)
        .bind(&identity.last_verified)
        .execute(&self.db.pool)
        .await?;
        Ok(())
    }

    pub async fn clear_shared_identity(&self, name: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM satellite_identity WHERE satellite_name = $1")
            .bind(name)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Record a command the leader ran; signals older than `keep_after` (ISO time) are dropped meanwhile.
    pub async fn push_signal(
        &self,
        origin: &str,
        command: &serde_json::Value,
        at: &str,
        keep_after: &str,
    ) -> Result<(), StoreError> {
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        sqlx::query("INSERT INTO replica_signals (origin, command, at) VALUES ($1, $2, $3)")
            .bind(origin)
            .bind(command.to_string())
            .bind(at)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM replica_signals WHERE at < $1").bind(keep_after).execute(&mut *tx).await?;
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    /// Signals after `after_id`, oldest first.
    pub async fn signals_after(&self, after_id: i64) -> Result<Vec<ReplicaSignal>, StoreError> {
        let rows = sqlx::query("SELECT id, origin, command FROM replica_signals WHERE id > $1 ORDER BY id LIMIT 100")
            .bind(after_id)
            .fetch_all(&self.db.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let command: String = row.try_get("command")?;
                Ok(ReplicaSignal {
                    id: row.try_get("id")?,
                    origin: row.try_get("origin")?,
                    command: serde_json::from_str(&command)?,
                })
            })
            .collect()
    }

    /// The newest signal's id (0 when none).
    pub async fn last_signal_id(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT MAX(id) AS id FROM replica_signals").fetch_one(&self.db.pool).await?;
        Ok(row.try_get::<Option<i64>, _>("id")?.unwrap_or(0))
    }

    /// Take the PostgreSQL advisory lock `key` on a connection of its own: waiting for it (`wait`), or only if
    /// it is free (`None` when another session holds it). `None` on SQLite, which has one process and no such
    /// locks.
    pub async fn advisory_lock(&self, key: i64, wait: bool) -> Result<Option<AdvisoryLock>, StoreError> {
        let (Engine::Postgres, Some(url)) = (self.db.engine, &self.url) else { return Ok(None) };
        let mut conn = tokio::time::timeout(LOCK_CONNECT_TIMEOUT, AnyConnection::connect(url.expose_secret()))
            .await
            .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no connection for the lock in 10 s"))
        })??;
        if wait {
            conn.execute(sqlx::query("SELECT pg_advisory_lock($1)").bind(key)).await?;
            return Ok(Some(AdvisoryLock { conn }));
        }
        let row = conn.fetch_one(sqlx::query("SELECT pg_try_advisory_lock($1) AS got").bind(key)).await?;
        if row.try_get::<bool, _>("got")? {
            Ok(Some(AdvisoryLock { conn }))
        } else {
            let _ = conn.close().await;
            Ok(None)
        }
    }
}
