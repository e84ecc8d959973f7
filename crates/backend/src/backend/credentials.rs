//! Stored satellite credentials (BP §2.4): `persistent_data/backend.key.json`,
//! pretty JSON, mode 0600; "clearing" writes the same keys with nulls. The
//! API key is a secret in memory and never appears in `Debug` output.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "backend.key.json";

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot create {path}: {source}")]
    Dir { path: String, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

/// Usable credentials.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub api_key: SecretString,
    pub satellite_id: String,
    pub satellite_name: String,
    pub registered_at: DateTime<Utc>,
    pub last_verified: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Default)]
struct OnDisk {
    api_key: Option<String>,
    satellite_id: Option<String>,
    satellite_name: Option<String>,
    registered_at: Option<String>,
    last_verified: Option<String>,
}

/// The credentials file in `dir`.
#[derive(Debug, Clone)]
pub struct CredentialStore {
    path: PathBuf,
}

impl CredentialStore {
    /// Create the directory if needed (BP §1 step 4: fatal when impossible).
    pub fn open(dir: &Path) -> Result<Self, CredentialsError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| CredentialsError::Dir { path: dir.display().to_string(), source })?;
        Ok(Self { path: dir.join(FILE_NAME) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stored credentials with a key and an id; anything missing, cleared or unreadable is `None`.
    pub fn load(&self) -> Option<Credentials> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let disk: OnDisk = serde_json::from_str(&text).ok()?;
        let parse = |s: Option<String>| s.and_then(|s| DateTime::parse_from_rfc3339(&s).ok()).map(|t| t.to_utc());
        let registered_at = parse(disk.registered_at).unwrap_or_else(Utc::now);
        Some(Credentials {
            api_key: SecretString::from(disk.api_key.filter(|k| !k.is_empty())?),
            satellite_id: disk.satellite_id.filter(|s| !s.is_empty())?,
            satellite_name: disk.satellite_name.unwrap_or_default(),
            registered_at,
            last_verified: parse(disk.last_verified).unwrap_or(registered_at),
        })
    }

    pub fn save(&self, credentials: &Credentials) -> Result<(), CredentialsError> {
        let iso = |t: DateTime<Utc>| crate::model::iso(t);
        self.write(&OnDisk {
            api_key: Some(credentials.api_key.expose_secret().to_owned()),
            satellite_id: Some(credentials.satellite_id.clone()),
            satellite_name: Some(credentials.satellite_name.clone()),
            registered_at: Some(iso(credentials.registered_at)),
            last_verified: Some(iso(credentials.last_verified)),
        })
    }

    /// Keep the file, null every value (BP §2.4).
    pub fn clear(&self) -> Result<(), CredentialsError> {
        self.write(&OnDisk::default())
    }

    fn write(&self, disk: &OnDisk) -> Result<(), CredentialsError> {
        let err = |source| CredentialsError::Write { path: self.path.display().to_string(), source };
        let text = serde_json::to_string_pretty(disk).map_err(|e| err(std::io::Error::other(e)))?;
        // Write a sibling with mode 0600, then rename over: never a half-written or world-readable key.
        let tmp = self.path.with_extension("json.tmp");
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(err)?;
        file.write_all(text.as_bytes()).and_then(|_| file.sync_all()).map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn saved_credentials_load_back_with_mode_0600_and_clearing_nulls_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = CredentialStore::open(&dir.path().join("persistent_data")).unwrap();
        assert!(store.load().is_none(), "no file yet");
        let now = Utc::now();
        let creds = Credentials {
            api_key: SecretString::from("deploystack_satellite_api_global_abc".to_owned()),
            satellite_id: "k6hm1j7sy2radj8".into(),
            satellite_name: "dev-satellite-001".into(),
            registered_at: now,
            last_verified: now,
        };
        store.save(&creds).unwrap();
        let mode = std::fs::metadata(store.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(text.contains("\n  \"api_key\": "), "pretty, 2-space indent: {text}");
        let loaded = store.load().expect("loads");
        assert_eq!(loaded.api_key.expose_secret(), "deploystack_satellite_api_global_abc");
        assert_eq!(loaded.satellite_id, "k6hm1j7sy2radj8");
        assert!(!format!("{loaded:?}").contains("abc"), "the key never shows in Debug output");

        store.clear().unwrap();
        let cleared: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(store.path()).unwrap()).unwrap();
        assert_eq!(cleared["api_key"], serde_json::Value::Null);
        assert_eq!(cleared["satellite_id"], serde_json::Value::Null);
        assert!(store.load().is_none());
    }

    #[test]
    fn a_corrupt_file_means_no_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let store = CredentialStore::open(dir.path()).unwrap();
        std::fs::write(store.path(), "{not json").unwrap();
        assert!(store.load().is_none());
    }
}
