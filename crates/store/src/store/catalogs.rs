//! Discovered catalogs (`Catalogs`): one row per instance plus one per tool, the changes each re-discovery
//! found (the instances' tool history), and the drifted tools held until an admin accepts them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::sql::TxConnection;
use super::{Db, StoreError};
use crate::model::{
    Catalog, InstanceSpec, ListingBuilder, PreparedTool, ProcessId, ResourceDef, TemplateDef, ToolChange,
};

/// Whose catalog a row is.
#[derive(Debug, Clone)]
pub struct CatalogOwner {
    pub process_id: String,
    pub team_id: String,
    pub user_id: String,
    pub installation_id: String,
    pub server_slug: String,
}

impl From<&InstanceSpec> for CatalogOwner {
    fn from(spec: &InstanceSpec) -> Self {
        Self {
            process_id: spec.process_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            user_id: spec.user_id.0.clone(),
            installation_id: spec.installation_id.0.clone(),
            server_slug: spec.server_slug.clone(),
        }
    }
}

/// The stored catalogs, their tool history and the held tools; cheap to clone.
#[derive(Debug, Clone)]
pub struct Catalogs {
    pub(super) db: Db,
}

impl Catalogs {
    /// Replace an instance's catalog in one transaction.
    pub async fn save_catalog(&self, owner: &CatalogOwner, catalog: &Catalog) -> Result<(), StoreError> {
        let resources = Value::Array(catalog.resources.iter().map(|r| r.definition.clone()).collect()).to_string();
        let templates = Value::Array(catalog.templates.iter().map(|t| t.definition.clone()).collect()).to_string();
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        sqlx::query("DELETE FROM catalog_tools WHERE process_id = $1")
            .bind(&owner.process_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO instance_catalog (process_id, team_id, user_id, installation_id, server_slug, discovered_at, resources, resource_templates)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (process_id) DO UPDATE SET team_id = excluded.team_id, user_id = excluded.user_id,
                installation_id = excluded.installation_id, server_slug = excluded.server_slug,
                discovered_at = excluded.discovered_at, resources = excluded.resources,
                resource_templates = excluded.resource_templates",
        )
        .bind(&owner.process_id)
        .bind(&owner.team_id)
        .bind(&owner.user_id)
        .bind(&owner.installation_id)
        .bind(&owner.server_slug)
        .bind(catalog.discovered_at.to_rfc3339())
        .bind(resources)
        .bind(templates)
        .execute(&mut *tx)
        .await?;
        for (position, tool) in catalog.tools.iter().enumerate() {
            sqlx::query("INSERT INTO catalog_tools (process_id, position, name, definition, content_hash, tokens) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(&owner.process_id)
                .bind(position as i64)
                .bind(tool.name())
                .bind(tool.definition_text())
                .bind(tool.content_hash())
                .bind(catalog.tool_tokens.get(position).map(|n| i64::from(*n)))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    pub async fn delete_catalog(&self, process_id: &ProcessId) -> Result<(), StoreError> {
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        sqlx::query("DELETE FROM catalog_tools WHERE process_id = $1")
            .bind(process_id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM instance_catalog WHERE process_id = $1")
            .bind(process_id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    /// Every stored catalog, by process id.
    pub async fn load_catalogs(&self) -> Result<HashMap<ProcessId, Catalog>, StoreError> {
        let rows = sqlx::query("SELECT process_id, discovered_at, resources, resource_templates FROM instance_catalog")
            .fetch_all(&self.db.pool)
            .await?;
        let mut catalogs = rows.iter().map(catalog_without_tools).collect::<Result<HashMap<_, _>, _>>()?;
        self.load_tools(&mut catalogs).await?;
        Ok(catalogs)
    }

    /// Every stored tool into its catalog in `catalogs`, with its token count.
    async fn load_tools(&self, catalogs: &mut HashMap<ProcessId, Catalog>) -> Result<(), StoreError> {
        // Read row by row: every stored tool's row alive at once would be the whole store's definitions twice over.
        let mut tools =
            sqlx::query("SELECT process_id, definition, tokens FROM catalog_tools ORDER BY process_id, position")
                .fetch(&self.db.pool);
        let mut uncounted = std::collections::HashSet::new();
        // Each catalog's tools are made into one listing as soon as its rows (ordered by process id) are read.
        let mut reading: Option<(ProcessId, ListingBuilder)> = None;
        while let Some(row) = tools.try_next().await? {
            let process_id = ProcessId(row.try_get("process_id")?);
            let definition: Value = serde_json::from_str(&row.try_get::<String, _>("definition")?)?;
            let tokens: Option<i64> = row.try_get("tokens")?;
            if reading.as_ref().is_some_and(|(id, _)| *id != process_id) {
                finish_listing(reading.take(), catalogs);
            }
            if let (Some(catalog), Ok(tool)) = (catalogs.get_mut(&process_id), PreparedTool::new(definition)) {
                reading.get_or_insert_with(|| (process_id.clone(), ListingBuilder::default())).1.push(tool);
                match tokens.and_then(|n| u32::try_from(n).ok()) {
                    Some(n) => catalog.tool_tokens.push(n),
                    None => {
                        uncounted.insert(process_id.clone());
                    }
                }
            }
        }
        finish_listing(reading.take(), catalogs);
        // Rows saved before token counts were stored: the whole catalog is counted again by its owner.
        for id in uncounted {
            if let Some(catalog) = catalogs.get_mut(&id) {
                catalog.tool_tokens.clear();
            }
        }
        Ok(())
    }

    /// Keep the changes one re-discovery found (the instance's tool history); `drifted` names the tools whose
    /// meaning changed after a recent call.
    pub async fn record_tool_changes(
        &self,
        owner: &CatalogOwner,
        changes: &[ToolChange],
        drifted: &std::collections::HashSet<String>,
    ) -> Result<(), StoreError> {
        let at = crate::model::iso(Utc::now());
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        for change in changes {
            sqlx::query(
                "INSERT INTO tool_changes (at, process_id, team_id, installation_id, server_slug, tool_name, change,
                 parts, old_hash, new_hash, drifted) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(&at)
            .bind(&owner.process_id)
            .bind(&owner.team_id)
            .bind(&owner.installation_id)
            .bind(&owner.server_slug)
            .bind(&change.name)
            .bind(change.kind.as_str())
            .bind(serde_json::to_string(&change.parts)?)
            .bind(&change.old_hash)
            .bind(&change.new_hash)
            .bind(i64::from(drifted.contains(&change.name)))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    /// An instance's tool history, newest first: (at, tool, change, parts, drifted).
    pub async fn tool_history(
        &self,
        process_id: &str,
        limit: u32,
    ) -> Result<Vec<(String, String, String, Vec<String>, bool)>, StoreError> {
        let rows = sqlx::query(
            "SELECT at, tool_name, change, parts, drifted FROM tool_changes WHERE process_id = $1
             ORDER BY id DESC LIMIT $2",
        )
        .bind(process_id)
        .bind(i64::from(limit))
        .fetch_all(&self.db.pool)
        .await?;
        let mut history = Vec::with_capacity(rows.len());
        for row in rows {
            let parts: Vec<String> = serde_json::from_str(&row.try_get::<String, _>("parts")?).unwrap_or_default();
            history.push((
                row.try_get("at")?,
                row.try_get("tool_name")?,
                row.try_get("change")?,
                parts,
                super::flag(&row, "drifted")?,
            ));
        }
        Ok(history)
    }

    /// Which of `tools` the instance's users called since `since` (ISO time), from the analytics calls.
    pub async fn called_since(
        &self,
        process_id: &str,
        tools: &[&str],
        since: &str,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let mut called = std::collections::HashSet::new();
        for tool in tools {
            let row = sqlx::query(
                "SELECT 1 FROM analytics_calls WHERE process_id = $1 AND tool_name = $2 AND at >= $3 LIMIT 1",
            )
            .bind(process_id)
            .bind(*tool)
            .bind(since)
            .fetch_optional(&self.db.pool)
            .await?;
            if row.is_some() {
                called.insert((*tool).to_owned());
            }
        }
        Ok(called)
    }
}

/// A stored catalog's row: its resources and templates, its tools still to be read (`Catalogs::load_tools`).
fn catalog_without_tools(row: &AnyRow) -> Result<(ProcessId, Catalog), StoreError> {
    let process_id: String = row.try_get("process_id")?;
    let discovered_at: String = row.try_get("discovered_at")?;
    let discovered_at =
        DateTime::parse_from_rfc3339(&discovered_at).map(|t| t.with_timezone(&Utc)).unwrap_or_else(|_| Utc::now());
    let resources: Vec<Value> = serde_json::from_str(&row.try_get::<String, _>("resources")?)?;
    let templates: Vec<Value> = serde_json::from_str(&row.try_get::<String, _>("resource_templates")?)?;
    let catalog = Catalog {
        fallbacks: Vec::new(),
        header_tools: Default::default(),
        names: Default::default(),
        tools: Vec::new(),
        resources: resources.iter().filter_map(ResourceDef::from_listing).collect(),
        templates: templates.iter().filter_map(TemplateDef::from_listing).collect(),
        discovered_at,
        tool_tokens: Vec::new(),
    };
    Ok((ProcessId(process_id), catalog))
}

/// The tools read for the catalog of `reading`, made into its listing.
fn finish_listing(reading: Option<(ProcessId, ListingBuilder)>, catalogs: &mut HashMap<ProcessId, Catalog>) {
    if let Some((process_id, listing)) = reading {
        if let Some(catalog) = catalogs.get_mut(&process_id) {
            catalog.tools = listing.finish();
        }
    }
}

/// One row of an installation's tool history, for the admin API.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolChangeRow {
    pub at: String,
    pub process_id: String,
    pub team_id: String,
    pub installation_id: String,
    pub server_slug: String,
    pub tool_name: String,
    pub change: String,
    pub parts: Vec<String>,
    pub drifted: bool,
}

/// A drifted tool held until an admin accepts it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeldTool {
    pub installation_id: String,
    pub tool_name: String,
    pub process_id: String,
    pub held_at: String,
}

impl Catalogs {
    /// Hold drifted tools of an installation (already held ones keep their first date).
    pub async fn hold_tools(&self, installation_id: &str, process_id: &str, tools: &[&str]) -> Result<(), StoreError> {
        let at = crate::model::iso(Utc::now());
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        for tool in tools {
            sqlx::query(
                "INSERT INTO tool_holds (installation_id, tool_name, process_id, held_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (installation_id, tool_name) DO NOTHING",
            )
            .bind(installation_id)
            .bind(*tool)
            .bind(process_id)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    /// Release a held tool; whether it was held.
    pub async fn release_hold(&self, installation_id: &str, tool: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM tool_holds WHERE installation_id = $1 AND tool_name = $2")
            .bind(installation_id)
            .bind(tool)
            .execute(&self.db.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Release every hold of an installation (it was uninstalled).
    pub async fn release_holds_of(&self, installation_id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM tool_holds WHERE installation_id = $1")
            .bind(installation_id)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Every held tool, oldest first.
    pub async fn held_tools(&self) -> Result<Vec<HeldTool>, StoreError> {
        let rows = sqlx::query(
            "SELECT installation_id, tool_name, process_id, held_at FROM tool_holds ORDER BY held_at, tool_name",
        )
        .fetch_all(&self.db.pool)
        .await?;
        rows.into_iter()
            .map(|row| {
                Ok(HeldTool {
                    installation_id: row.try_get("installation_id")?,
                    tool_name: row.try_get("tool_name")?,
                    process_id: row.try_get("process_id")?,
                    held_at: row.try_get("held_at")?,
                })
            })
            .collect()
    }

    /// The newest tool changes, optionally of one team and one installation, newest first.
    pub async fn tool_changes(
        &self,
        team_id: Option<&str>,
        installation_id: Option<&str>,
        limit: u64,
        offset: u64,
    ) -> Result<Vec<ToolChangeRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT at, process_id, team_id, installation_id, server_slug, tool_name, change, parts, drifted
             FROM tool_changes WHERE ($1 IS NULL OR team_id = $1) AND ($2 IS NULL OR installation_id = $2)
             ORDER BY id DESC LIMIT $3 OFFSET $4",
        )
        .bind(team_id)
        .bind(installation_id)
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_all(&self.db.pool)
        .await?;
        rows.into_iter()
            .map(|row| {
                Ok(ToolChangeRow {
                    at: row.try_get("at")?,
                    process_id: row.try_get("process_id")?,
                    team_id: row.try_get("team_id")?,
                    installation_id: row.try_get("installation_id")?,
                    server_slug: row.try_get("server_slug")?,
                    tool_name: row.try_get("tool_name")?,
                    change: row.try_get("change")?,
                    parts: serde_json::from_str(&row.try_get::<String, _>("parts")?).unwrap_or_default(),
                    drifted: super::flag(&row, "drifted")?,
                })
            })
            .collect()
    }
}
