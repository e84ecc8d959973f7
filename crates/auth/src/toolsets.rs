//! Which toolsets exist and which one a caller's request uses (issue 17, docs/toolsets.md).
//!
//! Toolsets come from two places: the standalone config file (`[[toolsets]]`, each user's `default_toolset`;
//! replaced on every reload) and the API (`/api/toolsets`, stored in SQLite; in managed mode that is the only
//! place, kept per user and team on this satellite). A name resolves for a caller to their own toolset first,
//! then their team's. A request selects one with `?toolset=NAME` on the endpoint URL; with none selected the
//! caller's default applies (their stored default, else the config file's); `?toolset=all` selects every tool.
//! A name that does not resolve is an error the client sees, never an empty or a silently full view.
//!
//! Everything is kept in memory and read without touching the database. Writes are serialised: each goes to
//! the database first, then the stored toolsets are reloaded (writes are rare); a toolset whose row did not
//! change keeps its `Arc`, so the router's cached views through it (compared by pointer) stay valid and one
//! member's write never makes another team's views rebuild.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::Utc;
use parking_lot::RwLock;

use crate::auth::{Principal, Role};
use crate::model::toolset::{ConfiguredToolsets, ToolsetDefError};
use crate::model::{iso, TeamId, Toolset, ToolsetScope, ToolsetSource, UserId};
use crate::store::toolsets::ToolsetRow;
use crate::store::{StoreError, ToolsetRows};

/// The name that selects no toolset (every tool), even over a default.
pub const ALL: &str = "all";

/// Toolsets one member may store, and one team: everything a client can make the satellite keep is bounded.
pub const MAX_PER_USER: usize = 100;
pub const MAX_PER_TEAM: usize = 500;

/// Why a toolset could not be selected or changed.
#[derive(Debug, thiserror::Error)]
pub enum ToolsetError {
    #[error("Unknown toolset '{name}'. {}", available_sentence(available))]
    Unknown { name: String, available: Vec<String> },
    #[error("Your default toolset '{name}' no longer exists. Select another with ?toolset=NAME (or ?toolset=all for every tool), or change the default with PUT /api/toolsets/default.")]
    DanglingDefault { name: String },
    #[error("{0}")]
    Invalid(#[from] ToolsetDefError),
    #[error("only a team admin may change the team's toolsets")]
    NotAdmin,
    #[error("toolset '{0}' is defined in the config file; change it there")]
    ConfigOwned(String),
    #[error("no {scope} toolset '{name}'")]
    NotFound { scope: &'static str, name: String },
    #[error("at most {0} toolsets here; delete one first")]
    TooMany(usize),
    #[error("the toolset store failed: {0}")]
    Store(#[from] StoreError),
}

fn available_sentence(available: &[String]) -> String {
    if available.is_empty() {
        "You have no toolsets; define one with PUT /api/toolsets/NAME, or use ?toolset=all for every tool.".into()
    } else {
        format!("Your toolsets: {} (or \"all\" for every tool).", available.join(", "))
    }
}

/// A toolset as the API lists it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub toolset: Arc<Toolset>,
    pub updated_at: Option<String>,
    pub updated_by: Option<String>,
    /// Hidden behind the caller's own toolset of the same name.
    pub shadowed: bool,
}

/// The caller's toolsets and default, for `GET /api/toolsets`.
#[derive(Debug, Clone)]
pub struct Listing {
    pub toolsets: Vec<Listed>,
    pub default: Option<String>,
}

/// A stored toolset with who last wrote it.
#[derive(Debug, Clone)]
struct Stored {
    toolset: Arc<Toolset>,
    updated_at: String,
    updated_by: String,
}

/// Stored toolsets of one team: the team's (`None`) and each member's own.
type StoredKey = (TeamId, Option<UserId>);

#[derive(Default)]
struct State {
    configured: ConfiguredToolsets,
    stored: HashMap<StoredKey, BTreeMap<String, Stored>>,
    /// Each member's stored default, by team then user (looked up on every request without cloning ids).
    defaults: HashMap<TeamId, HashMap<UserId, String>>,
}

/// The registry; cheap to clone.
#[derive(Clone)]
pub struct Toolsets {
    inner: Arc<Inner>,
}

struct Inner {
    store: ToolsetRows,
    state: RwLock<State>,
    /// Held from a write to the database until its reload is in memory, so two writers never swap in their
    /// snapshots out of order (and the per-member limit is checked against the latest).
    writing: tokio::sync::Mutex<()>,
}

impl Toolsets {
    /// The registry with what the database holds and what the config file says.
    pub async fn load(store: ToolsetRows, configured: ConfiguredToolsets) -> Result<Toolsets, StoreError> {
        let toolsets = Toolsets {
            inner: Arc::new(Inner {
                store,
                state: RwLock::new(State { configured, ..State::default() }),
                writing: tokio::sync::Mutex::new(()),
            }),
        };
        toolsets.reload().await?;
        Ok(toolsets)
    }

    /// The config file was (re)loaded. A stored toolset whose name the file now also defines keeps existing and
    /// is still found first (its owner can delete it, not change it), and that is said.
    pub fn set_configured(&self, configured: ConfiguredToolsets) {
        let mut state = self.inner.state.write();
        for ((team, owner), toolsets) in &state.stored {
            for name in toolsets.keys().filter(|name| configured.names_in_team(team, owner.as_ref(), name)) {
                tracing::warn!(team_id = %team, toolset = %name, "the config file now defines a toolset with the name of one stored through the API; the stored one is still found first and can only be deleted (DELETE /api/toolsets/NAME) to use the file's");
            }
        }
        state.configured = configured;
    }

    /// Read the stored toolsets again: what another replica on the same database wrote (docs/scale-out.md).
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let _writing = self.inner.writing.lock().await;
        self.reload().await
    }

    async fn reload(&self) -> Result<(), StoreError> {
        let (rows, defaults) = self.inner.store.load_toolsets().await?;
        let previous = self.inner.state.read().stored.clone();
        let mut stored: HashMap<StoredKey, BTreeMap<String, Stored>> = HashMap::new();
        for row in rows {
            let key = (TeamId(row.team_id.clone()), row.owner.clone().map(UserId));
            // Unchanged since the last load: the same `Arc`, so views built through it stay cached.
            let same = previous.get(&key).and_then(|m| m.get(&row.name)).filter(|s| {
                s.updated_at == row.updated_at
                    && s.toolset.patterns == row.patterns
                    && s.toolset.description == row.description
            });
            if let Some(same) = same {
                stored.entry(key).or_default().insert(row.name, same.clone());
                continue;
            }
            let scope = if row.owner.is_some() { ToolsetScope::User } else { ToolsetScope::Team };
            match Toolset::new(&row.name, row.description, row.patterns, scope, ToolsetSource::Api) {
                Ok(toolset) => {
                    let entry =
                        Stored { toolset: Arc::new(toolset), updated_at: row.updated_at, updated_by: row.updated_by };
                    stored.entry(key).or_default().insert(row.name, entry);
                }
                // Written through the same validation; only a hand-edited database gets here.
                Err(err) => {
                    tracing::warn!(team_id = %row.team_id, toolset = %row.name, error = %err, "a stored toolset is not valid; ignoring it")
                }
            }
        }
        let mut by_team: HashMap<TeamId, HashMap<UserId, String>> = HashMap::new();
        for d in defaults {
            by_team.entry(TeamId(d.team_id)).or_default().insert(UserId(d.user_id), d.name);
        }
        let mut state = self.inner.state.write();
        state.stored = stored;
        state.defaults = by_team;
        Ok(())
    }

    /// The toolset a request uses: the one it selects (`Some(name)`), else the caller's default; `Ok(None)`
    /// is every tool.
    pub fn resolve(&self, caller: &Principal, requested: Option<&str>) -> Result<Option<Arc<Toolset>>, ToolsetError> {
        let state = self.inner.state.read();
        let requested = requested.map(str::trim).filter(|n| !n.is_empty());
        match requested {
            Some(name) if name.eq_ignore_ascii_case(ALL) => Ok(None),
            Some(name) => state.find(&caller.team, &caller.user, name).map(Some).ok_or_else(|| ToolsetError::Unknown {
                // Echoed in the error: a name no toolset can have is cut to what one may be.
                name: name.chars().take(crate::model::toolset::MAX_NAME_LEN + 1).collect(),
                available: state.names(&caller.team, &caller.user),
            }),
            None => match state.default_of(&caller.team, &caller.user) {
                None => Ok(None),
                Some(name) => state
                    .find(&caller.team, &caller.user, name)
                    .map(Some)
                    .ok_or_else(|| ToolsetError::DanglingDefault { name: name.to_owned() }),
            },
        }
    }

    /// Every toolset the caller can select, own first, and their default.
    pub fn list(&self, caller: &Principal) -> Listing {
        let state = self.inner.state.read();
        let (team, user) = (&caller.team, &caller.user);
        let mut toolsets = Vec::new();
        let own_names: Vec<String> = state.own(team, user).map(|l| l.toolset.name.clone()).collect();
        toolsets.extend(state.own(team, user));
        for mut listed in state.team(team) {
            listed.shadowed = own_names.contains(&listed.toolset.name);
            toolsets.push(listed);
        }
        Listing { toolsets, default: state.default_of(team, user).map(str::to_owned) }
    }

    /// Create or replace a toolset of the caller (`User`) or of their team (`Team`, team admins only).
    /// Returns the toolset and whether it is new.
    pub async fn put(
        &self,
        caller: &Principal,
        scope: ToolsetScope,
        name: &str,
        description: Option<String>,
        patterns: Vec<String>,
    ) -> Result<(Arc<Toolset>, bool), ToolsetError> {
        self.may_write(caller, scope, name, true)?;
        let toolset = Toolset::new(name, description, patterns, scope, ToolsetSource::Api)?;
        let _writing = self.inner.writing.lock().await;
        let owner = (scope == ToolsetScope::User).then(|| caller.user.0.clone());
        let key = (caller.team.clone(), owner.clone().map(UserId));
        let (created, held) = {
            let state = self.inner.state.read();
            let stored = state.stored.get(&key);
            (!stored.is_some_and(|m| m.contains_key(name)), stored.map_or(0, BTreeMap::len))
        };
        let limit = if scope == ToolsetScope::User { MAX_PER_USER } else { MAX_PER_TEAM };
        if created && held >= limit {
            return Err(ToolsetError::TooMany(limit));
        }
        let row = ToolsetRow {
            team_id: caller.team.0.clone(),
            owner,
            name: name.to_owned(),
            description: toolset.description.clone(),
            patterns: toolset.patterns.clone(),
            updated_at: iso(Utc::now()),
            updated_by: caller.user.0.clone(),
        };
        self.inner.store.put_toolset(&row).await?;
        self.reload().await?;
        Ok((Arc::new(toolset), created))
    }

    /// Delete a stored toolset; defaults that named it and no longer resolve are cleared with it.
    pub async fn delete(&self, caller: &Principal, scope: ToolsetScope, name: &str) -> Result<(), ToolsetError> {
        self.may_write(caller, scope, name, false)?;
        let _writing = self.inner.writing.lock().await;
        let owner = (scope == ToolsetScope::User).then_some(caller.user.as_str());
        if !self.inner.store.delete_toolset(caller.team.as_str(), owner, name).await? {
            return Err(ToolsetError::NotFound { scope: scope.as_str(), name: name.to_owned() });
        }
        self.reload().await?;
        Ok(())
    }

    /// Set (`Some`, a name the caller can select) or clear (`None`) the caller's default toolset.
    pub async fn set_default(&self, caller: &Principal, name: Option<&str>) -> Result<(), ToolsetError> {
        let _writing = self.inner.writing.lock().await;
        if let Some(name) = name {
            let state = self.inner.state.read();
            if state.find(&caller.team, &caller.user, name).is_none() {
                return Err(ToolsetError::Unknown {
                    name: name.to_owned(),
                    available: state.names(&caller.team, &caller.user),
                });
            }
        }
        self.inner
            .store
            .set_default_toolset(caller.team.as_str(), caller.user.as_str(), name, &iso(Utc::now()))
            .await?;
        self.reload().await?;
        Ok(())
    }

    /// Whether the caller may write (`creating`: create or replace; else delete) a toolset of `scope`: team
    /// toolsets are a team admin's, and a name the config file gives the caller (the team's, or their own) is
    /// the file's to change; deleting a stored one the file came to share a name with is always allowed.
    fn may_write(
        &self,
        caller: &Principal,
        scope: ToolsetScope,
        name: &str,
        creating: bool,
    ) -> Result<(), ToolsetError> {
        if scope == ToolsetScope::Team && caller.role != Role::TeamAdmin {
            return Err(ToolsetError::NotAdmin);
        }
        crate::model::toolset::check_name(name)?;
        if creating && self.inner.state.read().configured.names_in_team(&caller.team, Some(&caller.user), name) {
            return Err(ToolsetError::ConfigOwned(name.to_owned()));
        }
        Ok(())
    }
}

impl State {
    /// Own before team; within each, the database (API) and the file never share a name (see `may_write`).
    fn find(&self, team: &TeamId, user: &UserId, name: &str) -> Option<Arc<Toolset>> {
        let stored = |owner: Option<&UserId>| {
            self.stored.get(&(team.clone(), owner.cloned())).and_then(|m| m.get(name)).map(|s| s.toolset.clone())
        };
        let configured = self.configured.find(team, user, name).cloned();
        let configured_own = configured.clone().filter(|t| t.scope == ToolsetScope::User);
        stored(Some(user)).or(configured_own).or_else(|| stored(None)).or(configured)
    }

    fn default_of(&self, team: &TeamId, user: &UserId) -> Option<&str> {
        self.defaults
            .get(team)
            .and_then(|users| users.get(user))
            .or_else(|| self.configured.defaults.get(user))
            .map(String::as_str)
    }

    fn own<'a>(&'a self, team: &'a TeamId, user: &'a UserId) -> impl Iterator<Item = Listed> + 'a {
        let stored = self.stored.get(&(team.clone(), Some(user.clone()))).into_iter().flat_map(|m| m.values());
        let configured = self
            .configured
            .toolsets
            .iter()
            .filter(move |c| c.user.as_ref() == Some(user) && c.team.as_ref().is_none_or(|t| t == team));
        stored.map(Stored::listed).chain(configured.map(|c| Listed::configured(&c.toolset)))
    }

    fn team<'a>(&'a self, team: &'a TeamId) -> impl Iterator<Item = Listed> + 'a {
        let stored = self.stored.get(&(team.clone(), None)).into_iter().flat_map(|m| m.values());
        let configured = self
            .configured
            .toolsets
            .iter()
            .filter(move |c| c.user.is_none() && c.team.as_ref().is_none_or(|t| t == team));
        stored.map(Stored::listed).chain(configured.map(|c| Listed::configured(&c.toolset)))
    }

    fn names(&self, team: &TeamId, user: &UserId) -> Vec<String> {
        let mut names: Vec<String> =
            self.own(team, user).chain(self.team(team)).map(|l| l.toolset.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }
}

impl Stored {
    fn listed(&self) -> Listed {
        Listed {
            toolset: self.toolset.clone(),
            updated_at: Some(self.updated_at.clone()),
            updated_by: Some(self.updated_by.clone()),
            shadowed: false,
        }
    }
}

impl Listed {
    fn configured(toolset: &Arc<Toolset>) -> Listed {
        Listed { toolset: toolset.clone(), updated_at: None, updated_by: None, shadowed: false }
    }
}
