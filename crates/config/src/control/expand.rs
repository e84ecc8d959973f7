//! One installation as one team member's instance: its `mcp_servers` entry, with the three-tier merge of BP §7.4
//! (the server's template, the team's installation, the member's own tier).

use std::collections::BTreeMap;

use url::Url;

use super::directory::{check_id, check_sha256, Team};
use super::snapshot::{set_query, EntrySettings, McpServerEntry, SecretMetadata};
use crate::config::file::{RawInstallation, RawServer, RawUserInstance};
use crate::config::{sha256_hex, ConfigError};
use crate::model::{InstallationId, ProcessId, TeamId, UserId};

/// The three-tier merge of arguments (BP §7.4): `(value, order)` from each
/// tier (template by index, team 100+index, user 200+index), empty values
/// dropped, stable-sorted by order.
pub fn merge_args(template: &[String], team: &[String], user: &[String]) -> Vec<String> {
    let mut ordered: Vec<(usize, &String)> = template
        .iter()
        .enumerate()
        .chain(team.iter().enumerate().map(|(i, v)| (100 + i, v)))
        .chain(user.iter().enumerate().map(|(i, v)| (200 + i, v)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    ordered.sort_by_key(|(order, _)| *order);
    ordered.into_iter().map(|(_, v)| v.clone()).collect()
}

/// Later tiers win.
pub fn merge_maps(tiers: &[&BTreeMap<String, String>]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for tier in tiers {
        out.extend(tier.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// One installation as one team member's instance: what its `mcp_servers` entry is made of.
pub(super) struct Member<'a> {
    pub(super) server: &'a RawServer,
    pub(super) installation: &'a RawInstallation,
    pub(super) team_id: &'a TeamId,
    pub(super) team: &'a Team,
    pub(super) user_id: &'a UserId,
    /// The member's own tier of the installation, when the file gives one.
    pub(super) tier: Option<&'a RawUserInstance>,
    /// The installation's place in the file (`installations[i]`), for errors.
    pub(super) key: &'a str,
}

impl Member<'_> {
    /// The member's `mcp_servers` entry, and the process id it is keyed by.
    pub(super) fn expand(&self) -> Result<(ProcessId, McpServerEntry), ConfigError> {
        let installation_id = InstallationId(self.installation.id.clone());
        let process_id = ProcessId::compose(&self.server.slug, &self.team.slug, self.user_id, &installation_id);
        let mut entry = self.entry();
        self.set_transport(&mut entry)?;
        self.set_instance(&mut entry, &process_id)?;
        Ok((process_id, entry))
    }

    /// The entry's names, switches and secret names: all but the transport's and the instance's own parts.
    fn entry(&self) -> McpServerEntry {
        let (server, installation, user_id) = (self.server, self.installation, self.user_id);
        McpServerEntry {
            installation_id: installation.id.clone(),
            team_id: self.team_id.0.clone(),
            team_slug: self.team.slug.clone(),
            server_name: server.name.clone().unwrap_or_else(|| server.slug.clone()),
            server_slug: Some(server.slug.clone()),
            installation_name: installation
                .name
                .clone()
                .unwrap_or_else(|| server.name.clone().unwrap_or_else(|| server.slug.clone())),
            transport_type: Some(server.transport.clone()),
            enabled: Some(installation.enabled && self.tier.map(|u| u.enabled).unwrap_or(true)),
            user_id: user_id.0.clone(),
            user_slug: Some(user_id.0.clone()),
            requires_oauth: Some(server.requires_oauth),
            settings: Some(EntrySettings { request_logging_enabled: Some(installation.request_logging) }),
            disabled_tools: (!installation.disabled_tools.is_empty()).then(|| installation.disabled_tools.clone()),
            declared_tools: (!server.tools.is_empty()).then(|| server.tools.clone()),
            rediscover_seconds: server.rediscover_seconds,
            secret_metadata: Some(SecretMetadata {
                query_params: server.secret_query.clone(),
                headers: server.secret_headers.clone(),
                env: server.secret_env.clone(),
            }),
            ..McpServerEntry::default()
        }
    }

    /// The command, arguments and environment of a stdio server, or the url, headers and timeout of a remote one,
    /// each merged over the template, team and user tiers.
    fn set_transport(&self, entry: &mut McpServerEntry) -> Result<(), ConfigError> {
        let server = self.server;
        let team_tier = self.installation.tier();
        let user_tier = self.tier.map(RawUserInstance::tier).unwrap_or_default();
        if server.transport == "stdio" {
            entry.command = server.command.clone();
            entry.args = Some(merge_args(&server.args, &team_tier.args, &user_tier.args));
            entry.env = merge_maps(&[&server.env, &team_tier.env, &user_tier.env]);
        } else {
            let base = server.url.as_deref().unwrap_or_default();
            let mut url = Url::parse(base)
                .map_err(|err| ConfigError::new(format!("{}.server", self.key), None, format!("invalid url: {err}")))?;
            set_query(&mut url, &team_tier.query);
            set_query(&mut url, &user_tier.query);
            entry.url = Some(url.to_string());
            entry.headers = merge_maps(&[&server.headers, &team_tier.headers, &user_tier.headers]);
            entry.timeout = Some(server.timeout_ms.unwrap_or(45_000) as f64);
        }
        Ok(())
    }

    /// The instance's path (the member's own, checked, else one made from the process id) and token hash.
    fn set_instance(&self, entry: &mut McpServerEntry, process_id: &ProcessId) -> Result<(), ConfigError> {
        let user_key = format!("{}.users.{}", self.key, self.user_id);
        entry.instance_path = Some(match self.tier.and_then(|u| u.instance_path.clone()) {
            Some(path) => {
                check_id(&path, &format!("{user_key}.instance_path"))?;
                path
            }
            // Stable across restarts, unique per instance.
            None => format!("{}-{}", self.server.slug, &sha256_hex(&process_id.0)[..10]),
        });
        if let Some(hash) = self.tier.and_then(|u| u.instance_token_sha256.as_ref()).map(|h| h.get_ref()) {
            check_sha256(hash, &format!("{user_key}.instance_token_sha256"))?;
            entry.instance_token_hash = Some(hash.to_ascii_lowercase());
        }
        Ok(())
    }
}
