//! Toolsets defined through the API and each member's default toolset (migration 0006), as the `ToolsetRows`
//! repository. Rows only: what a toolset means is `model::toolset`'s business, which one a caller gets is
//! `toolsets`'.

use sqlx::Row;

use super::sql::TxConnection;
use super::{Db, StoreError};

/// One stored toolset; `owner` is the member's user id, or `None` for a team toolset.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsetRow {
    pub team_id: String,
    pub owner: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub patterns: Vec<String>,
    pub updated_at: String,
    pub updated_by: String,
}

/// A member's default toolset.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultRow {
    pub team_id: String,
    pub user_id: String,
    pub name: String,
}

/// The stored toolsets and members' defaults; cheap to clone.
#[derive(Debug, Clone)]
pub struct ToolsetRows {
    pub(super) db: Db,
}

impl ToolsetRows {
    /// Every stored toolset (read once at start; the registry keeps them in memory).
    pub async fn load_toolsets(&self) -> Result<(Vec<ToolsetRow>, Vec<DefaultRow>), StoreError> {
        let rows = sqlx::query(
            "SELECT team_id, owner, name, description, patterns, updated_at, updated_by FROM toolsets ORDER BY team_id, owner, name",
        )
        .fetch_all(&self.db.pool)
        .await?;
        let mut toolsets = Vec::with_capacity(rows.len());
        for row in rows {
            let owner: String = row.try_get("owner")?;
            let patterns: String = row.try_get("patterns")?;
            toolsets.push(ToolsetRow {
                team_id: row.try_get("team_id")?,
                owner: Some(owner).filter(|o| !o.is_empty()),
                name: row.try_get("name")?,
                description: row.try_get("description")?,
                patterns: serde_json::from_str(&patterns)?,
                updated_at: row.try_get("updated_at")?,
                updated_by: row.try_get("updated_by")?,
            });
        }
        let defaults = sqlx::query("SELECT team_id, user_id, name FROM toolset_defaults")
            .fetch_all(&self.db.pool)
            .await?
            .into_iter()
            .map(|row| {
                Ok(DefaultRow {
                    team_id: row.try_get("team_id")?,
                    user_id: row.try_get("user_id")?,
                    name: row.try_get("name")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok((toolsets, defaults))
    }

    /// Create or replace a toolset.
    pub async fn put_toolset(&self, row: &ToolsetRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO toolsets (team_id, owner, name, description, patterns, updated_at, updated_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (team_id, owner, name) DO UPDATE SET description = excluded.description,
               patterns = excluded.patterns, updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        )
        .bind(&row.team_id)
        .bind(row.owner.as_deref().unwrap_or(""))
        .bind(&row.name)
        .bind(&row.description)
        .bind(serde_json::to_string(&row.patterns)?)
        .bind(&row.updated_at)
        .bind(&row.updated_by)
        .execute(&self.db.pool)
        .await?;
        Ok(())
    }

    /// Delete a toolset; the defaults that named it and can no longer resolve it are cleared in the same
    /// transaction (a member's own toolset: their default; a team toolset: every member's default that no own
    /// toolset of the same name still answers). Returns whether it existed.
    pub async fn delete_toolset(&self, team_id: &str, owner: Option<&str>, name: &str) -> Result<bool, StoreError> {
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        let deleted = sqlx::query("DELETE FROM toolsets WHERE team_id = $1 AND owner = $2 AND name = $3")
            .bind(team_id)
            .bind(owner.unwrap_or(""))
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query(
            "DELETE FROM toolset_defaults WHERE team_id = $1 AND name = $2 AND ($3 = '' OR user_id = $3)
               AND NOT EXISTS (SELECT 1 FROM toolsets t WHERE t.team_id = $1 AND t.name = $2
                               AND (t.owner = '' OR t.owner = toolset_defaults.user_id))",
        )
        .bind(team_id)
        .bind(name)
        .bind(owner.unwrap_or(""))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        conn.done();
        Ok(deleted > 0)
    }

    /// Set (`Some`) or clear (`None`) a member's default toolset.
    pub async fn set_default_toolset(
        &self,
        team_id: &str,
        user_id: &str,
        name: Option<&str>,
        at: &str,
    ) -> Result<(), StoreError> {
        match name {
            Some(name) => {
                sqlx::query(
                    "INSERT INTO toolset_defaults (team_id, user_id, name, updated_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (team_id, user_id) DO UPDATE SET name = excluded.name, updated_at = excluded.updated_at",
                )
                .bind(team_id)
                .bind(user_id)
                .bind(name)
                .bind(at)
                .execute(&self.db.pool)
                .await?;
            }
            None => {
                sqlx::query("DELETE FROM toolset_defaults WHERE team_id = $1 AND user_id = $2")
                    .bind(team_id)
                    .bind(user_id)
                    .execute(&self.db.pool)
                    .await?;
            }
        }
        Ok(())
    }
}
