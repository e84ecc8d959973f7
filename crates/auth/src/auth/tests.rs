//! Unit tests of `auth`: static tokens, JWTs verified locally.

use super::*;
use crate::config::parse_file;
use crate::control::standalone::from_file;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "0123456789abcdef0123456789abcdef-secret";

fn authenticator() -> Authenticator {
    authenticator_with("audience = \"http://localhost:3001/mcp\"")
}

/// The test directory, with `audience_line` in its `[auth.jwt]`.
fn authenticator_with(audience_line: &str) -> Authenticator {
    let file = format!(
        r#"
[auth.jwt]
algorithm = "HS256"
secret = "{SECRET}"
{audience_line}
[[teams]]
id = "acme"
[[teams]]
id = "globex"
[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{}"]
[[users]]
id = "bob"
teams = ["acme", "globex"]
[[users.tokens]]
sha256 = "{}"
team = "globex"
scopes = ["mcp:read"]
[[users.tokens]]
sha256 = "{}"
team = "acme"
"#,
        sha256_hex("alice-token"),
        sha256_hex("bob-globex-token"),
        sha256_hex(DOTTED)
    );
    Authenticator::new(from_file(&parse_file(&file).unwrap()).unwrap().directory)
}

/// A static token with two dots, shaped like a JWT.
const DOTTED: &str = "static.token.with-two-dots";

#[test]
fn static_tokens_with_dots_are_not_mistaken_for_jwts() {
    let auth = authenticator();
    let bob = auth.authenticate(Some(&format!("Bearer {DOTTED}"))).expect("a static token, dots and all");
    assert_eq!((bob.user.0.as_str(), bob.team.0.as_str()), ("bob", "acme"));
    assert!(auth.authenticate(Some("Bearer not.a.jwt")).is_err(), "unknown and not a valid JWT");
}

fn jwt(claims: serde_json::Value) -> String {
    encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[test]
fn static_tokens_name_user_team_and_scopes() {
    let auth = authenticator();
    let alice = auth.authenticate(Some("Bearer alice-token")).unwrap();
    assert_eq!((alice.user.as_str(), alice.team.as_str()), ("alice", "acme"));
    assert!(alice.has_scope(SCOPE_EXECUTE));
    let bob = auth.authenticate(Some("bearer bob-globex-token")).unwrap();
    assert_eq!(bob.team.as_str(), "globex");
    assert_eq!(bob.require(SCOPE_EXECUTE), Err(AuthError::InsufficientScope(SCOPE_EXECUTE.into())));
    assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
    assert_eq!(auth.authenticate(Some("Basic abc")), Err(AuthError::Missing));
    assert!(matches!(auth.authenticate(Some("Bearer nope")), Err(AuthError::Invalid(_))));
}

#[test]
fn jwts_are_verified_locally() {
    let auth = authenticator();
    let aud = "http://localhost:3001/mcp";
    let good = jwt(json!({"sub": "alice", "team": "acme", "aud": aud, "exp": now() + 60, "scope": "mcp:read"}));
    let alice = auth.authenticate(Some(&format!("Bearer {good}"))).unwrap();
    assert_eq!((alice.user.as_str(), alice.team.as_str()), ("alice", "acme"));
    assert_eq!(alice.scopes, ["mcp:read"]);
    let cases = [
        (json!({"sub": "c", "team": "acme", "aud": aud, "exp": now() - 120}), "expired"),
        (json!({"sub": "c", "team": "acme", "aud": aud, "exp": now() + 60, "nbf": now() + 3600}), "not yet valid"),
        (json!({"sub": "c", "team": "acme", "aud": "other", "exp": now() + 60}), "wrong audience"),
        (json!({"sub": "c", "team": "nope", "aud": aud, "exp": now() + 60}), "unknown team"),
        (json!({"sub": "c", "aud": aud, "exp": now() + 60}), "missing team claim"),
    ];
    for (claims, why) in cases {
        let token = jwt(claims);
        assert_eq!(
            auth.authenticate(Some(&format!("Bearer {token}"))),
            Err(AuthError::Invalid(format!("Invalid token: {why}")))
        );
    }
    let forged = encode(
        &Header::default(),
        &json!({"sub": "c", "team": "acme", "aud": aud, "exp": now() + 60}),
        &EncodingKey::from_secret(b"another-secret-another-secret-xx"),
    )
    .unwrap();
    assert!(
        matches!(auth.authenticate(Some(&format!("Bearer {forged}"))), Err(AuthError::Invalid(m)) if m.contains("bad signature"))
    );
}

/// A configured audience and issuer are ones a token must name: a token that leaves either claim out is
/// refused, as one naming another is. Before, jsonwebtoken checked them only when present.
#[test]
fn a_configured_audience_and_issuer_must_be_named() {
    let auth = authenticator_with("audience = \"https://sat.example/mcp\"\nissuer = \"https://issuer.example\"");
    let bearer = |without: &str| {
        let mut claims = json!({"sub": "alice", "team": "acme", "exp": now() + 60,
            "aud": "https://sat.example/mcp", "iss": "https://issuer.example"});
        if let Some(claims) = claims.as_object_mut() {
            claims.remove(without);
        }
        format!("Bearer {}", jwt(claims))
    };
    assert!(auth.authenticate(Some(&bearer("none"))).is_ok(), "both named");
    for claim in ["aud", "iss"] {
        let refused = auth.authenticate(Some(&bearer(claim)));
        assert!(
            matches!(&refused, Err(AuthError::Invalid(m)) if m.contains(&format!("missing {claim} claim"))),
            "{claim}: {refused:?}"
        );
    }
    let nobody = jwt(json!({"sub": "", "team": "acme", "exp": now() + 60,
        "aud": "https://sat.example/mcp", "iss": "https://issuer.example"}));
    assert_eq!(
        auth.authenticate(Some(&format!("Bearer {nobody}"))),
        Err(AuthError::Invalid("Invalid token: empty sub claim".into()))
    );
}

/// With no audience configured, a JWT that names another service is refused (SB §5.5, OQ-14); one naming
/// none, or naming the satellite among others, is accepted. Before, any `aud` passed.
#[test]
fn without_a_configured_audience_a_jwt_for_another_service_is_refused() {
    let auth = authenticator_with("");
    let bearer = |aud: Option<serde_json::Value>| {
        let mut claims = json!({"sub": "alice", "team": "acme", "exp": now() + 60});
        if let Some(aud) = aud {
            claims["aud"] = aud;
        }
        format!("Bearer {}", jwt(claims))
    };
    assert!(auth.authenticate(Some(&bearer(None))).is_ok(), "no aud");
    let both = json!(["https://other.example", crate::config::BACKEND_AUDIENCE]);
    assert!(auth.authenticate(Some(&bearer(Some(both)))).is_ok(), "names the satellite among others");
    for other in [json!("https://other.example"), json!(["https://other.example"])] {
        let refused = auth.authenticate(Some(&bearer(Some(other.clone()))));
        assert!(matches!(&refused, Err(AuthError::Invalid(m)) if m.contains("wrong audience")), "{other}: {refused:?}");
    }
}

/// A verified token names a user the directory knows (else 401 `invalid_token`), in a team that user is a member
/// of (else 403), as a static token does. Before, any `sub` of the trusted issuer got a session, in any team the
/// file declares.
#[test]
fn a_jwt_names_a_known_user_in_one_of_their_teams() {
    let auth = authenticator();
    let bearer = |sub: &str, team: &str| {
        let claims = json!({"sub": sub, "team": team, "aud": "http://localhost:3001/mcp", "exp": now() + 60});
        format!("Bearer {}", jwt(claims))
    };
    assert_eq!(
        auth.authenticate(Some(&bearer("carol", "acme"))),
        Err(AuthError::Invalid("Invalid token: unknown user".into()))
    );
    assert_eq!(auth.authenticate(Some(&bearer("alice", "globex"))), Err(AuthError::NotMember));
    let bob = auth.authenticate(Some(&bearer("bob", "globex"))).expect("bob is in globex");
    assert_eq!((bob.user.as_str(), bob.team.as_str()), ("bob", "globex"));
}
