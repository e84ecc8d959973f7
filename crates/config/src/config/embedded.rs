//! The embedded default's tokens (given in the environment or generated), and the token helpers it needs.

use super::*;

/// Tokens of the built-in demo user; generated when not given.
#[derive(Debug, Clone)]
pub struct EmbeddedDefault {
    pub demo_token: SecretString,
    pub demo_token_generated: bool,
    pub instance_token: SecretString,
    pub instance_token_generated: bool,
}

pub(super) fn embedded(env: &Env) -> Result<EmbeddedDefault, ConfigError> {
    let (demo_token, demo_token_generated) = match env::get(env, env::DEMO_TOKEN) {
        Some(token) if token.len() >= 16 => (token.to_owned(), false),
        Some(_) => {
            return Err(ConfigError::new("demo.token", Some(env::DEMO_TOKEN), "must be at least 16 characters"));
        }
        None => (random_hex(32), true),
    };
    let (instance_token, instance_token_generated) = match env::get(env, env::DEMO_INSTANCE_TOKEN) {
        Some(token) if is_instance_token(token) => (token.to_owned(), false),
        Some(_) => {
            return Err(ConfigError::new(
                "demo.instance_token",
                Some(env::DEMO_INSTANCE_TOKEN),
                "must be ds_inst_ followed by 64 hex characters",
            ));
        }
        None => (format!("ds_inst_{}", random_hex(32)), true),
    };
    Ok(EmbeddedDefault {
        demo_token: SecretString::from(demo_token),
        demo_token_generated,
        instance_token: SecretString::from(instance_token),
        instance_token_generated,
    })
}

/// `ds_inst_` followed by 64 lowercase hex characters.
pub fn is_instance_token(token: &str) -> bool {
    token
        .strip_prefix("ds_inst_")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

/// Lowercase hex SHA-256, the form in which tokens are stored.
pub fn sha256_hex(secret: &str) -> String {
    use sha2::Digest;
    // Into a buffer, not through `hex::encode`, whose character iterator cost more than the hash (it runs per
    // request, for every token checked).
    let mut digits = [0u8; 64];
    if hex::encode_to_slice(sha2::Sha256::digest(secret.as_bytes()), &mut digits).is_err() {
        return String::new(); // 32 bytes always fill 64 digits
    }
    String::from_utf8(digits.to_vec()).unwrap_or_default()
}

impl EmbeddedDefault {
    pub fn demo_token_hash(&self) -> String {
        sha256_hex(self.demo_token.expose_secret())
    }

    pub fn instance_token_hash(&self) -> String {
        sha256_hex(self.instance_token.expose_secret())
    }
}
