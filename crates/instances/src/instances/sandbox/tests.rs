//! Unit tests of `mod`.

use super::*;
use crate::model::{InstallationId, ProcessId, SecretNames, TeamId, UserId};
use std::os::unix::fs::PermissionsExt;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn executable(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A policy whose HOME and PATH point into a temporary directory.
fn policy(dir: &Path, settings: SandboxSettings, extra: &[PathBuf]) -> SandboxPolicy {
    let env: Env = [
        ("HOME".to_owned(), dir.join("home").to_string_lossy().into_owned()),
        ("PATH".to_owned(), dir.join("path").to_string_lossy().into_owned()),
    ]
    .into();
    SandboxPolicy::new(&settings, &env, &dir.join("data"), extra).unwrap()
}

fn spec(team: &str, command: &str, args: &[&str], env: &[(&str, &str)]) -> InstanceSpec {
    InstanceSpec {
        process_id: ProcessId("p".into()),
        instance_id: None,
        installation_id: InstallationId("i".into()),
        installation_name: "i".into(),
        team_id: TeamId(team.into()),
        team_slug: team.into(),
        user_id: UserId("u".into()),
        server_name: "s".into(),
        server_slug: "s".into(),
        upstream: Upstream::Stdio {
            command: command.into(),
            args: strings(args),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        },
        enabled: true,
        instance_path: None,
        instance_token_hash: None,
        requires_oauth: false,
        request_logging_enabled: true,
        secrets: SecretNames::default(),
        disabled_tools: Default::default(),
        access: crate::model::ToolAccess::open(),
        deployment: None,
        declared_tools: None,
        rediscover_every: None,
    }
}

#[test]
fn every_forbidden_argument_pattern_is_refused() {
    let bad = [
        ("--", "is '--'"),
        ("a;b", "contains ';'"),
        ("a&b", "contains '&'"),
        ("a|b", "contains '|'"),
        ("`id`", "contains '`'"),
        ("$(id)", "contains '$('"),
        ("${HOME}", "contains '${'"),
        ("../etc/hosts", "contains '../'"),
        ("x/../y", "contains '../'"),
        ("--user=0", "starts with '--user'"),
        ("--group", "starts with '--group'"),
        ("--rlimit_as", "starts with '--rlimit'"),
        ("--mount", "starts with '--mount'"),
        ("--bindmount=/:/x", "starts with '--bindmount'"),
        ("--cgroup_mem_max", "starts with '--cgroup'"),
        ("--disable_no_new_privs", "starts with '--disable'"),
    ];
    for (arg, reason) in bad {
        let err = check_args(&strings(&["ok", arg])).unwrap_err();
        assert_eq!(err.to_string(), format!("SECURITY: Rejected argument 2 ({arg:?}): {reason}"));
    }
    let err = check_args(&strings(&["-y", "pkg", "a;b"])).unwrap_err();
    assert_eq!(err.to_string(), r#"SECURITY: Rejected argument 3 ("a;b"): contains ';'"#);
}

#[test]
fn harmless_arguments_pass() {
    let ok = ["--port=3", "a/b", "https://x?a=1", "-y", "@scope/pkg@1.2.3", "/abs/path", "..", "$HOME", "a-b"];
    check_args(&strings(&ok)).unwrap();
    check_args(&[]).unwrap();
}

#[test]
fn refused_arguments_never_echo_a_credential_or_a_long_value() {
    let err = check_args(&strings(&["--token=abcdef;x"])).unwrap_err().to_string();
    assert!(!err.contains("abcdef"), "{err}");
    assert!(err.contains("--t*****"), "{err}");
    let long = format!("{};", "a".repeat(200));
    let err = check_args(&[long]).unwrap_err().to_string();
    assert!(err.len() < 140, "{err}");
}

#[test]
fn search_order_is_home_dirs_then_system_dirs_then_path() {
    let env: Env = [("HOME".to_owned(), "/h".to_owned()), ("PATH".to_owned(), "/p:/usr/bin:rel:/q".to_owned())].into();
    let dirs: Vec<String> = search_dirs(&env).iter().map(|d| d.to_string_lossy().into_owned()).collect();
    assert_eq!(
        dirs,
        [
            "/h/.local/bin",
            "/h/.cargo/bin",
            "/h/bin",
            "/usr/local/bin",
            "/usr/bin",
            "/bin",
            "/opt/homebrew/bin",
            "/p",
            "/q"
        ]
    );
}

#[test]
fn resolution_takes_the_first_executable_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let dirs = vec![home.join(".local/bin"), home.join(".cargo/bin"), home.join("bin"), dir.path().join("path")];
    executable(&dir.path().join("path/sb-tool"));
    assert_eq!(resolve_in("sb-tool", &dirs), Some(dir.path().join("path/sb-tool")));
    executable(&home.join("bin/sb-tool"));
    assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join("bin/sb-tool")));
    // Not executable: skipped.
    std::fs::create_dir_all(home.join(".local/bin")).unwrap();
    std::fs::write(home.join(".local/bin/sb-tool"), "x").unwrap();
    assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join("bin/sb-tool")));
    executable(&home.join(".cargo/bin/sb-tool"));
    assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join(".cargo/bin/sb-tool")));
    assert_eq!(resolve_in("sb-missing", &dirs), None);
}

#[test]
fn default_allow_list_is_case_insensitive_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    for name in DEFAULT_ALLOWED_COMMANDS {
        executable(&dir.path().join("home/.local/bin").join(name));
    }
    let p = policy(dir.path(), SandboxSettings::default(), &[]);
    for name in ["npx", " NPX ", "Node", "uvx", "python", "PYTHON3\t"] {
        let resolved = p.check_command(name).unwrap();
        assert_eq!(resolved, dir.path().join("home/.local/bin").join(name.trim().to_ascii_lowercase()));
    }
    let err = p.check_command("bash").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"SECURITY: Rejected command "bash": not in the allow-list (npx, node, uvx, python, python3)"#
    );
    assert!(matches!(p.check_command("/usr/bin/node"), Err(SandboxError::CommandNotAllowed { .. })));
    assert!(matches!(p.check_command("./node"), Err(SandboxError::RelativeCommand { .. })));
    assert!(matches!(p.check_command("bin/node"), Err(SandboxError::RelativeCommand { .. })));
    assert!(matches!(p.check_command("npm"), Err(SandboxError::CommandNotAllowed { .. })));
}

#[test]
fn an_allowed_but_missing_runtime_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SandboxSettings { allowed_commands: strings(&["sb-not-installed"]), ..Default::default() };
    let p = policy(dir.path(), settings, &[]);
    let err = p.check_command("sb-not-installed").unwrap_err();
    assert!(matches!(err, SandboxError::NotInstalled { .. }), "{err}");
    assert!(!err.to_string().starts_with("SECURITY"), "{err}");
}

#[test]
fn a_file_widens_with_names_absolute_paths_and_star() {
    let dir = tempfile::tempdir().unwrap();
    executable(&dir.path().join("path/deno"));
    let settings = SandboxSettings { allowed_commands: strings(&["Deno", "/opt/mcp/server"]), ..Default::default() };
    let p = policy(dir.path(), settings, &[PathBuf::from("/opt/satellite")]);
    assert_eq!(p.check_command("deno").unwrap(), dir.path().join("path/deno"));
    assert_eq!(p.check_command("/opt/mcp/server").unwrap(), PathBuf::from("/opt/mcp/server"));
    assert_eq!(p.check_command("/opt/satellite").unwrap(), PathBuf::from("/opt/satellite"));
    // Exactly: a sibling or a path that merely normalises to it is refused.
    assert!(matches!(p.check_command("/opt/mcp/other"), Err(SandboxError::CommandNotAllowed { .. })));
    assert!(matches!(p.check_command("/opt/mcp/../mcp/server"), Err(SandboxError::CommandNotAllowed { .. })));
    let err = p.check_command("bash").unwrap_err().to_string();
    assert!(err.ends_with("(npx, node, uvx, python, python3, Deno, /opt/mcp/server, /opt/satellite)"), "{err}");

    executable(&dir.path().join("path/sb-anything"));
    let any = policy(dir.path(), SandboxSettings { allowed_commands: strings(&["*"]), ..Default::default() }, &[]);
    assert_eq!(any.check_command("sb-anything").unwrap(), dir.path().join("path/sb-anything"));
    assert_eq!(any.check_command("/any/where").unwrap(), PathBuf::from("/any/where"));
    assert!(matches!(any.check_command("./sb-anything"), Err(SandboxError::RelativeCommand { .. })));
    assert!(matches!(any.check_command(".."), Err(SandboxError::RelativeCommand { .. })));
}

#[test]
fn team_directory_names_are_path_safe_and_distinct() {
    for team in ["../x", "a/b", "..", ".", "", "/", "x\0y", "ünïcode", &"t".repeat(300)] {
        let name = team_dir_name(team);
        assert!(!name.contains('/') && !name.starts_with('.') && name.len() <= 41, "{team:?} -> {name:?}");
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{name}");
    }
    assert!(team_dir_name("../x").starts_with("x-"));
    assert!(team_dir_name("a/b").starts_with("ab-"));
    assert_ne!(team_dir_name("a/b"), team_dir_name("ab"));
    assert_eq!(team_dir_name("acme"), team_dir_name("acme"));
}

#[test]
fn prepare_without_isolation_sets_dirs_env_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    executable(&dir.path().join("home/.local/bin/node"));
    let settings = SandboxSettings { rlimit_nofile: 99, memory_limit_mb: 0, ..Default::default() };
    let p = policy(dir.path(), settings, &[]);
    let inherited = BTreeMap::from([("PATH".to_owned(), "/bin".to_owned()), ("LANG".to_owned(), "C".to_owned())]);
    let s = spec("../evil", "node", &["server.js"], &[("LD_PRELOAD", "/x.so"), ("UV_CACHE_DIR", "/mine")]);
    let launch = p.prepare(&s, &inherited, None).unwrap();
    let (work, cache) = p.team_dirs("../evil");
    assert!(work.starts_with(dir.path().join("data/sandbox")) && work.ends_with("work"));
    assert_eq!(launch.cwd, work);
    assert_eq!(launch.program, dir.path().join("home/.local/bin/node"));
    assert_eq!(launch.args, ["server.js"]);
    for d in [&work, &cache] {
        assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700);
    }
    assert_eq!(launch.env["XDG_CACHE_HOME"], cache.to_string_lossy());
    assert_eq!(launch.env["npm_config_cache"], cache.to_string_lossy());
    assert_eq!(launch.env["UV_CACHE_DIR"], "/mine", "the instance's own setting wins");
    assert_eq!(launch.env["LANG"], "C");
    assert!(!launch.env.contains_key("LD_PRELOAD"));
    assert_eq!(launch.dropped_env, ["LD_PRELOAD"]);
    assert_eq!(launch.limits.open_files, Some(99));
    assert_eq!(launch.limits.address_space_bytes, None, "0 disables");
    assert_eq!(launch.limits.file_size_bytes, Some(50 * 1024 * 1024));
    assert!(p.describe().contains("isolation none"), "{}", p.describe());
    assert!(p.describe().contains("NOT isolated: same uid"), "{}", p.describe());

    let refused = p.prepare(&spec("t", "bash", &[], &[]), &inherited, None).unwrap_err();
    assert!(refused.to_string().starts_with("SECURITY: Rejected command \"bash\""));
    let refused = p.prepare(&spec("t", "node", &["x;rm -rf /"], &[]), &inherited, None).unwrap_err();
    assert_eq!(refused.to_string(), r#"SECURITY: Rejected argument 1 ("x;rm -rf /"): contains ';'"#);
}

fn layout() -> Layout {
    Layout {
        binary: PathBuf::from("/usr/bin/wrapper"),
        system: vec![HostDir::Dir("/usr"), HostDir::Symlink("/bin", PathBuf::from("usr/bin")), HostDir::Dir("/etc")],
        uid: 1000,
        gid: 1001,
        tmpfs_size: "100M".into(),
    }
}

/// True when `needle` occurs in `argv` as consecutive elements.
fn has(argv: &[String], needle: &[&str]) -> bool {
    argv.windows(needle.len()).any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
}

#[test]
fn nsjail_argv_follows_the_spec() {
    let team = TeamMounts {
        work: Path::new("/d/t/work"),
        cache: Path::new("/d/t/cache"),
        app: None,
        hostname: "mcp-t".into(),
    };
    let settings = SandboxSettings { memory_limit_mb: 0, ..Default::default() };
    let argv = nsjail_args(&layout(), &settings, &team, "node", Path::new("/usr/bin/node"), &strings(&["s.js", "-v"]));
    for needle in [
        &["-Mo", "--proc_rw", "--user", "1000", "--group", "1001"][..],
        &["--rlimit_as", "max", "--rlimit_cpu", "max", "--rlimit_nproc", "1000"],
        &["--rlimit_nofile", "1024", "--rlimit_fsize", "50", "--time_limit", "0"],
        &["-R", "/usr"],
        &["-s", "usr/bin:/bin"],
        &["-R", "/etc"],
        &["-m", "none:/tmp:tmpfs:size=100M"],
        &["-B", "/d/t/cache:/home/node"],
        &["-B", "/d/t/work:/workspace", "--cwd", "/workspace"],
        &["-B", "/dev/null", "-B", "/dev/urandom", "-B", "/dev/zero"],
        &["-s", "/proc/self/fd:/dev/fd"],
        &["--disable_clone_newnet", "--disable_clone_newcgroup", "--disable_no_new_privs"],
        &["--hostname", "mcp-t", "--keep_env"],
    ] {
        assert!(has(&argv, needle), "{needle:?} missing from {argv:?}");
    }
    assert_eq!(argv[argv.len() - 4..], strings(&["--", "/usr/bin/node", "s.js", "-v"]));
    // A command outside the system dirs is mounted read-only where it is.
    let argv = nsjail_args(&layout(), &settings, &team, "mcp", Path::new("/nonexistent/tool"), &[]);
    assert!(has(&argv, &["-R", "/nonexistent/tool:/nonexistent/tool"]), "{argv:?}");
}

#[test]
fn bubblewrap_argv_binds_system_dirs_read_only_and_unshares_all_but_network() {
    let team = TeamMounts {
        work: Path::new("/d/t/work"),
        cache: Path::new("/d/t/cache"),
        app: None,
        hostname: "mcp-t".into(),
    };
    let argv = bwrap_args(&layout(), &team, "python", Path::new("/usr/bin/python3"), &strings(&["-m", "srv"]));
    for needle in [
        &["--die-with-parent", "--new-session", "--unshare-all", "--share-net"][..],
        &["--hostname", "mcp-t"],
        &["--ro-bind", "/usr", "/usr"],
        &["--symlink", "usr/bin", "/bin"],
        &["--ro-bind", "/etc", "/etc"],
        &["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"],
        &["--bind", "/d/t/cache", "/home/python"],
        &["--bind", "/d/t/work", "/workspace"],
        &["--chdir", "/workspace"],
    ] {
        assert!(has(&argv, needle), "{needle:?} missing from {argv:?}");
    }
    assert_eq!(argv[argv.len() - 4..], strings(&["--", "/usr/bin/python3", "-m", "srv"]));
    let argv = bwrap_args(&layout(), &team, "mcp", Path::new("/nonexistent/tool"), &[]);
    assert!(has(&argv, &["--ro-bind", "/nonexistent/tool", "/nonexistent/tool"]), "{argv:?}");
}

#[test]
fn runtime_environment_inside_a_namespace_inherits_nothing() {
    let env = runtime_env("node");
    assert_eq!(env["HOME"], "/home/node");
    assert_eq!(env["PATH"], SANDBOX_PATH);
    assert_eq!(env["NPM_CONFIG_CACHE"], "/home/node/.npm");
    assert_eq!(runtime_env("python")["UV_CACHE_DIR"], "/home/python/.cache/uv");
    assert_eq!(runtime_of(Path::new("/usr/bin/npx")), "node");
    assert_eq!(runtime_of(Path::new("/x/uvx")), "python");
    assert_eq!(runtime_of(Path::new("/x/satellite")), "mcp");
}

#[test]
fn a_missing_isolation_binary_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let env: Env =
        [("HOME".to_owned(), "/nonexistent".to_owned()), ("PATH".to_owned(), "/nonexistent".to_owned())].into();
    let settings = SandboxSettings {
        isolation: Isolation::Nsjail,
        nsjail_path: Some(PathBuf::from("/nonexistent/nsjail")),
        ..Default::default()
    };
    let err = SandboxPolicy::new(&settings, &env, dir.path(), &[]).unwrap_err();
    assert_eq!(err.key, "sandbox.nsjail_path");
    assert!(!err.to_string().contains('\n'));
    executable(&dir.path().join("bin/bwrap"));
    let settings = SandboxSettings {
        isolation: Isolation::Bubblewrap,
        bwrap_path: Some(dir.path().join("bin/bwrap")),
        ..Default::default()
    };
    let p = SandboxPolicy::new(&settings, &env, dir.path(), &[]).unwrap();
    assert!(p.describe().starts_with("sandbox: isolation bubblewrap"), "{}", p.describe());
}

#[test]
fn satellite_secrets_never_reach_children() {
    let parent: Env =
        [("PATH", "/bin"), ("SATELLITE_DEMO_TOKEN", "s"), ("DEPLOYSTACK_REGISTRATION_TOKEN", "r"), ("LANG", "C")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    let inherited = inherited_env(&parent);
    assert_eq!(inherited.keys().collect::<Vec<_>>(), ["LANG", "PATH"]);
}

#[test]
fn hijacking_variables_are_dropped_case_insensitively() {
    let inherited = BTreeMap::from([("PATH".to_owned(), "/bin".to_owned())]);
    let instance = BTreeMap::from([
        ("ld_preload".to_owned(), "/evil.so".to_owned()),
        ("NODE_OPTIONS".to_owned(), "--require x".to_owned()),
        ("PATH".to_owned(), "/evil".to_owned()),
        ("API_KEY".to_owned(), "k".to_owned()),
        ("SATELLITE_X".to_owned(), "y".to_owned()),
    ]);
    let (env, dropped) = child_env(&inherited, &instance);
    assert_eq!(env["PATH"], "/bin");
    assert_eq!(env["API_KEY"], "k");
    assert!(!env.contains_key("ld_preload"));
    assert_eq!(dropped, ["NODE_OPTIONS", "PATH", "SATELLITE_X", "ld_preload"]);
}
