//! Unit tests of `mod`.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn build(env_pairs: &[(&str, &str)], flags: Flags, file: &str) -> Result<Config, ConfigError> {
    let raw = parse_file(file)?;
    let path = (!file.is_empty()).then(|| PathBuf::from("satellite.toml"));
    Config::build(&env(env_pairs), &flags, path, &raw)
}

#[test]
fn precedence_is_defaults_file_env_flags() {
    let c = build(&[], Flags::default(), "").unwrap();
    assert_eq!(c.listen.port(), DEFAULT_PORT);
    let c = build(&[], Flags::default(), "[satellite]\nport = 4000\n").unwrap();
    assert_eq!(c.listen.port(), 4000);
    let c = build(&[("PORT", "5000")], Flags::default(), "[satellite]\nport = 4000\n").unwrap();
    assert_eq!(c.listen.port(), 5000);
    let flags = Flags { port: Some(6000), ..Flags::default() };
    let c = build(&[("PORT", "5000")], flags, "[satellite]\nport = 4000\n").unwrap();
    assert_eq!(c.listen.port(), 6000);
}

#[test]
fn errors_name_the_key_and_the_variable() {
    let err = build(&[("PORT", "http")], Flags::default(), "").unwrap_err();
    assert_eq!(err.to_string(), "invalid config PORT/satellite.port: \"http\" is not a port number");
    let err = build(&[], Flags::default(), "[satellite]\nprot = 1\n").unwrap_err();
    assert!(err.to_string().contains("unknown field `prot`"), "{err}");
    assert!(err.to_string().contains("line 2"), "{err}");
    assert!(!err.to_string().contains('\n'));
    let err = build(&[("SATELLITE_DEMO_INSTANCE_TOKEN", "ds_inst_short")], Flags::default(), "").unwrap_err();
    assert!(err.to_string().starts_with("invalid config SATELLITE_DEMO_INSTANCE_TOKEN/"), "{err}");
}

#[test]
fn embedded_default_generates_tokens_and_enables_debug() {
    let c = build(&[], Flags::default(), "").unwrap();
    assert!(c.debug_route);
    assert_eq!(c.listen.ip(), DEFAULT_HOST);
    let Mode::Standalone(StandaloneSource::Embedded(demo)) = &c.mode else { panic!("not embedded") };
    assert!(demo.demo_token_generated && demo.instance_token_generated);
    assert!(is_instance_token(demo.instance_token.expose_secret()));
    let redacted = c.redacted().to_string();
    assert!(!redacted.contains(demo.demo_token.expose_secret()));
    assert!(!redacted.contains(demo.instance_token.expose_secret()));
}

#[test]
fn embedded_default_beyond_loopback_needs_the_operators_tokens() {
    let err = build(&[("HOST", "0.0.0.0")], Flags::default(), "").unwrap_err();
    assert_eq!(err.env, Some(env::HOST));
    assert!(err.to_string().contains("SATELLITE_DEMO_TOKEN"), "{err}");
    let one = build(&[("HOST", "0.0.0.0"), ("SATELLITE_DEMO_TOKEN", "demo-token-0123456789")], Flags::default(), "");
    assert!(one.is_err(), "the generated instance token would still be printed");
    let instance = format!("ds_inst_{}", "a".repeat(64));
    let both = [
        ("HOST", "0.0.0.0"),
        ("SATELLITE_DEMO_TOKEN", "demo-token-0123456789"),
        ("SATELLITE_DEMO_INSTANCE_TOKEN", &instance),
    ];
    assert!(build(&both, Flags::default(), "").is_ok());
    assert!(build(&[("HOST", "::1")], Flags::default(), "").is_ok(), "loopback keeps the generated tokens");
}

#[test]
fn start_only_settings_are_the_satellite_and_sandbox_sections() {
    let running = start_only_settings("[satellite]\nport = 1\nlog_level = \"info\"\n[[teams]]\nid = \"t\"\n");
    assert_eq!(running.keys().collect::<Vec<_>>(), ["satellite.log_level", "satellite.port"]);
    let edited = start_only_settings(
        "[satellite]\nport = 2\nlog_level = \"info\"\n[sandbox]\nisolation = \"none\"\n[[teams]]\nid = \"u\"\n",
    );
    assert_eq!(changed_start_only_settings(&running, &edited), ["sandbox.isolation", "satellite.port"]);
    assert!(changed_start_only_settings(&running, &running).is_empty());
    assert!(start_only_settings("not toml [").is_empty());
}

#[test]
fn managed_mode_needs_a_valid_name_and_excludes_a_file() {
    let err = build(&[("DEPLOYSTACK_BACKEND_URL", "http://b:3000")], Flags::default(), "").unwrap_err();
    assert_eq!(err.env, Some(env::SATELLITE_NAME));
    let ok = build(
        &[("DEPLOYSTACK_BACKEND_URL", "http://b:3000"), ("DEPLOYSTACK_SATELLITE_NAME", "satellite-01")],
        Flags::default(),
        "",
    )
    .unwrap();
    assert!(matches!(ok.mode, Mode::Managed(_)));
    assert!(!ok.debug_route);
    let err = build(&[("DEPLOYSTACK_BACKEND_URL", "http://b:3000")], Flags::default(), "[satellite]\n").unwrap_err();
    assert_eq!(err.key, "mode");
}

#[test]
fn the_drift_window_is_days_from_the_file_or_the_environment_and_never_zero() -> Result<(), ConfigError> {
    let day = Duration::from_secs(86_400);
    assert_eq!(build(&[], Flags::default(), "")?.upstream.drift_window, day * 30);
    assert_eq!(build(&[], Flags::default(), "[satellite]\ndrift_window_days = 7\n")?.upstream.drift_window, day * 7);
    let env_wins =
        build(&[("SATELLITE_DRIFT_WINDOW_DAYS", "2")], Flags::default(), "[satellite]\ndrift_window_days = 7\n")?;
    assert_eq!(env_wins.upstream.drift_window, day * 2);
    for bad in ["0", "x", "4000"] {
        let err = build(&[("SATELLITE_DRIFT_WINDOW_DAYS", bad)], Flags::default(), "").err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("SATELLITE_DRIFT_WINDOW_DAYS/satellite.drift_window_days")),
            "{bad}: {err:?}"
        );
    }
    Ok(())
}

#[test]
fn database_urls_are_shown_without_their_passwords() {
    assert_eq!(mask_url_password("postgres://sat:s3cret@db:5432/sat"), "postgres://sat:***@db:5432/sat");
    let query = mask_url_password("postgres://sat@db/sat?sslmode=require&password=s3cret&sslpassword=k3y");
    assert!(!query.contains("s3cret") && !query.contains("k3y"), "{query}");
    assert!(query.contains("sslmode=require"), "{query}");
    assert_eq!(mask_url_password("postgres://sat@db/sat"), "postgres://sat@db/sat");
    assert_eq!(mask_url_password("not a url s3cret"), "[unparseable url]");
}

/// A value written with the wrong type is not echoed in the error (it may be a secret in the wrong place); where
/// and what kind it is, and the file's own key names, are.
#[test]
fn a_type_error_says_where_and_what_kind_not_the_value() {
    let file = |entry: &str| format!("[[servers]]\nslug = \"s\"\ntransport = \"stdio\"\ncommand = \"x\"\n{entry}\n");
    for (entry, kind) in [
        ("env = { API_KEY = 987654321 }", "integer"),
        ("env = { API_KEY = 98765.4321 }", "floating point"),
        ("args = \"sk-live-secret\"", "string"),
        ("env = { API_KEY = true }", "boolean"),
    ] {
        let err = parse_file(&file(entry)).unwrap_err().to_string();
        assert!(err.contains(&format!("invalid type: {kind}, expected")), "{entry}: {err}");
        assert!(err.contains("(line 5)"), "{err}");
        for secret in ["987654321", "98765.4321", "sk-live-secret", "true"] {
            assert!(!err.contains(secret), "{entry}: {err}");
        }
    }
    let unknown = parse_file("[satellite]\nprot = 3000\n").unwrap_err().to_string();
    assert!(unknown.contains("unknown field `prot`"), "{unknown}");
}

/// A configuration path pointed at something huge (a device, a runaway log) is refused, not read into memory.
#[test]
fn a_file_past_the_size_bound_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("satellite.toml");
    std::fs::File::create(&path).unwrap().set_len(file::MAX_FILE_BYTES + 1).unwrap();
    let err = file::read_text(&path).unwrap_err().to_string();
    assert!(err.contains("larger than 32 MiB"), "{err}");
}

/// A member's share of the request places: an eighth of them unless set, from the file or the environment, and a
/// value that is not a positive number is refused with its key.
#[test]
fn the_per_caller_share_follows_the_places_unless_set() {
    let c = build(&[], Flags::default(), "").unwrap();
    assert_eq!((c.max_concurrent_requests, c.max_concurrent_requests_per_caller), (1024, 128));
    let c = build(&[("SATELLITE_MAX_CONCURRENT_REQUESTS", "16")], Flags::default(), "").unwrap();
    assert_eq!(c.max_concurrent_requests_per_caller, 2);
    let c = build(&[], Flags::default(), "[satellite]\nmax_concurrent_requests = 4\n").unwrap();
    assert_eq!(c.max_concurrent_requests_per_caller, 1, "never none");
    let file = "[satellite]\nmax_concurrent_requests_per_caller = 7\n";
    assert_eq!(build(&[], Flags::default(), file).unwrap().max_concurrent_requests_per_caller, 7);
    let set = [("SATELLITE_MAX_CONCURRENT_REQUESTS_PER_CALLER", "9")];
    assert_eq!(build(&set, Flags::default(), file).unwrap().max_concurrent_requests_per_caller, 9);
    let err = build(&[("SATELLITE_MAX_CONCURRENT_REQUESTS_PER_CALLER", "0")], Flags::default(), "").unwrap_err();
    assert!(err.to_string().contains("satellite.max_concurrent_requests_per_caller"), "{err}");
}
