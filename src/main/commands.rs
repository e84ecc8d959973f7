//! The one-shot subcommands: `check-config`, `token new`, `search`, `import` and `tokens`; each returns its exit code.

use super::*;

/// `satellite tokens`: exit 0 when every server was counted, 1 when one failed (the others are still shown),
/// 64 for bad arguments or a bad config.
pub(super) fn tokens(args: &TokensArgs) -> ExitCode {
    use satellite::app::tokens::{How, Target};
    let env = env::from_process();
    let mut sandbox = None;
    let targets = if let Some(url) = &args.url {
        let mut headers = std::collections::BTreeMap::new();
        for header in &args.headers {
            let Some((name, value)) = header.split_once(':') else {
                eprintln!("error: --header {header:?} is not `Name: value`");
                return exit(config::EXIT_CONFIG);
            };
            headers.insert(name.trim().to_owned(), value.trim().to_owned());
        }
        let name = url.host_str().unwrap_or("server").to_owned();
        vec![Target { name, how: How::Http { url: url.clone(), headers, sse: args.sse } }]
    } else if let Some(path) = &args.config {
        let flags = Flags { config: Some(path.clone()), ..Flags::default() };
        let config = match Config::load(&env, &flags) {
            Ok(config) => config,
            Err(err) => {
                eprintln!("error: {err}");
                return exit(config::EXIT_CONFIG);
            }
        };
        match satellite::app::tokens::targets_of_config(&config, &env) {
            Ok((targets, policy)) => {
                sandbox = Some(policy);
                targets
            }
            Err(err) => {
                eprintln!("error: {err}");
                return exit(config::EXIT_CONFIG);
            }
        }
    } else if let [program, rest @ ..] = args.command.as_slice() {
        let name = std::path::Path::new(program).file_name().map(|n| n.to_string_lossy().into_owned());
        let how = How::Command { program: program.clone(), args: rest.to_vec() };
        vec![Target { name: name.unwrap_or_else(|| program.clone()), how }]
    } else {
        eprintln!("error: say which server: --url URL, --config FILE, or -- COMMAND [ARGS...]");
        return exit(config::EXIT_CONFIG);
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let timeout = std::time::Duration::from_secs(args.timeout.max(1));
    let report = match runtime.block_on(satellite::app::tokens::measure(&targets, &env, sandbox.as_ref(), timeout)) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", satellite::app::tokens::table(&report));
    }
    for server in report.servers.iter().filter(|s| s.error.is_some()) {
        eprintln!("error: {}: {}", server.server, server.error.as_deref().unwrap_or_default());
    }
    if report.servers.iter().any(|s| s.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
/// `satellite token new`: a token to hand out once, and the hash the config file keeps.
pub(super) fn token_new(instance: bool, json: bool) -> ExitCode {
    let (kind, token, field) = if instance {
        ("instance", format!("ds_inst_{}", config::random_hex(32)), "instance_token_sha256")
    } else {
        ("user", format!("sat_{}", config::random_hex(32)), "token_sha256")
    };
    let sha256 = config::sha256_hex(&token);
    if json {
        return print_json(&serde_json::json!({"kind": kind, "token": token, "sha256": sha256}));
    }
    let paste = if instance {
        format!("{field} = \"{sha256}\"          # under [installations.users.<user>], with instance_path")
    } else {
        format!("{field} = [\"{sha256}\"]        # in the user's [[users]] entry")
    };
    print_out(&format!(
        "token:   {token}\nsha256:  {sha256}\n\nPaste into the config file:\n  {paste}\n\n\
         The token is shown only now; the file keeps only its hash. Give the token to its holder over a private channel.\n"
    ))
}

/// `satellite search`: 0 with results (or none found), 1 when the satellite or the store could not be asked.
pub(super) fn search(args: &SearchArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let limit = args.limit.clamp(1, 50);
    if args.url.is_some() && args.token.is_none() {
        eprintln!("error: --url needs a bearer token: --token TOKEN or SATELLITE_TOKEN");
        return exit(config::EXIT_CONFIG);
    }
    if let (Some(url), Some(token)) = (&args.url, &args.token) {
        return match runtime.block_on(satellite::app::search::remote(url, token, &args.query, limit)) {
            Ok(document) if args.json => print_json(&document),
            Ok(document) => {
                let found: Vec<satellite::app::search::Found> = document["tools"]
                    .as_array()
                    .map(|tools| {
                        tools
                            .iter()
                            .map(|t| satellite::app::search::Found {
                                tool_path: t["tool_path"].as_str().unwrap_or_default().to_owned(),
                                score: t["relevance_score"].as_f64().unwrap_or_default(),
                                description: t["description"].as_str().unwrap_or_default().to_owned(),
                                user: None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                show_found(&found, &args.query)
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let (config, _) = match load(&args.serve) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    match runtime.block_on(satellite::app::search::stored(&config, &args.query, limit, args.user.as_deref())) {
        Ok(found) if args.json => print_json(&serde_json::json!({"query": args.query, "tools": found})),
        Ok(found) => show_found(&found, &args.query),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Found tools as a table on stdout; none found is said on stderr (and is not a failure).
pub(super) fn show_found(found: &[satellite::app::search::Found], query: &str) -> ExitCode {
    if found.is_empty() {
        eprintln!("no tool matched {query:?}");
    }
    print_out(&satellite::app::search::table(found))
}

/// `satellite import`: 0 with a valid config written, 64 when the file is not a server list.
pub(super) fn import(args: &ImportArgs) -> ExitCode {
    use satellite::app::import::{import, ImportOptions};
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("error: cannot read {}: {err}", args.file.display());
            return exit(config::EXIT_CONFIG);
        }
    };
    let token = format!("sat_{}", config::random_hex(32));
    let options = ImportOptions { team: args.team.clone(), user: args.user.clone(), token: token.clone() };
    let imported = match import(&text, &options) {
        Ok(imported) => imported,
        Err(err) => {
            eprintln!("error: {}: {err}", args.file.display());
            return exit(config::EXIT_CONFIG);
        }
    };
    for warning in &imported.warnings {
        eprintln!("warning: {warning}");
    }
    let written = match &args.output {
        None => print_out(&imported.toml),
        Some(path) => {
            use std::io::Write;
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path);
            match file.and_then(|mut f| f.write_all(imported.toml.as_bytes())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: cannot write {}: {err}", path.display());
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    eprintln!(
        "imported {} server(s) for user `{}` in team `{}`; their bearer token (shown once): {token}",
        imported.servers, args.user, args.team
    );
    written
}

pub(super) fn check_config(args: &ServeArgs) -> ExitCode {
    let (config, env) = match load(args) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let sandbox = match satellite::instances::sandbox::SandboxPolicy::for_config(&config, &env) {
        Ok(sandbox) => sandbox,
        Err(err) => {
            eprintln!("error: {err}");
            return exit(config::EXIT_CONFIG);
        }
    };
    let state = match app::initial_standalone(&config) {
        Ok(standalone) => standalone.desired_state(),
        Err(err) => {
            eprintln!("error: {err}");
            return exit(err.exit_code());
        }
    };
    // What `serve` would refuse: entries that do not validate, and stdio commands or arguments the sandbox
    // refuses. A runtime missing on this machine is only a warning: the config may be checked elsewhere.
    let mut problems: Vec<String> = state.rejected.iter().map(|(key, reason)| format!("{key}: {reason}")).collect();
    for spec in state.instances.values().filter(|spec| spec.enabled) {
        use satellite::instances::sandbox::SandboxError;
        let who =
            format!("installation {} (server {}, user {})", spec.installation_id.0, spec.server_slug, spec.user_id.0);
        match sandbox.check(spec) {
            Ok(()) => {}
            Err(err @ SandboxError::NotInstalled { .. }) => {
                eprintln!("warning: {who}: {err}; `serve` on this machine would fail to start it")
            }
            Err(err) => problems.push(format!("{who}: {err}")),
        }
    }
    if let Mode::Standalone(StandaloneSource::File { path, .. }) = &config.mode {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let start_only: Vec<String> = config::start_only_settings(&text).into_keys().collect();
        if !start_only.is_empty() {
            let verb = if start_only.len() == 1 { "is" } else { "are" };
            eprintln!(
                "note: {} {verb} read only when `serve` starts: an edit in a running satellite's file takes \
                 effect at the next restart (teams, users, auth, servers and installations apply at once)",
                start_only.join(", ")
            );
        }
    }
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("error: {problem}");
        }
        return exit(config::EXIT_CONFIG);
    }
    // A shared database must answer now: a replica that cannot reach it would not start.
    let database = match check_database(&config) {
        Ok(version) => version,
        Err(err) => {
            eprintln!("error: {err}");
            return exit(config::EXIT_CONFIG);
        }
    };
    let instances: Vec<serde_json::Value> = state.instances.values().map(redacted_instance).collect();
    let mut effective = config.redacted();
    if let Some(version) = database {
        effective["database"]["server_version"] = serde_json::Value::String(version);
    }
    effective["desired_state"] = serde_json::json!({"instances": instances, "rejected": state.rejected});
    effective["sandbox"]["summary"] = serde_json::Value::String(sandbox.describe());
    print_json(&effective)
}

/// Connect to the configured PostgreSQL database within 10 s; its server version, or `None` for SQLite.
fn check_database(config: &satellite::config::Config) -> Result<Option<String>, String> {
    if config.database.url.is_none() {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("cannot start a runtime to check the database: {err}"))?;
    runtime.block_on(async {
        match tokio::time::timeout(std::time::Duration::from_secs(10), satellite::store::Store::check(&config.database))
            .await
        {
            Ok(Ok(version)) => Ok(version),
            Ok(Err(err)) => Err(format!("{} (DATABASE_URL): {err}", satellite::config::env::DATABASE_URL)),
            Err(_) => Err(format!("{}: no answer within 10 s", satellite::config::env::DATABASE_URL)),
        }
    })
}

pub(super) fn redacted_instance(spec: &satellite::model::InstanceSpec) -> serde_json::Value {
    use satellite::secrets;
    let mut value = serde_json::json!({
        "process_id": spec.process_id.0,
        "team_id": spec.team_id.0,
        "user_id": spec.user_id.0,
        "installation_id": spec.installation_id.0,
        "server_slug": spec.server_slug,
        "enabled": spec.enabled,
        "instance_path": spec.instance_path,
        "instance_token_hash": spec.instance_token_hash.as_ref().map(|_| "[redacted]"),
        "transport": spec.upstream.transport_name(),
    });
    if let (Some(value), serde_json::Value::Object(upstream)) = (value.as_object_mut(), secrets::masked_upstream(spec))
    {
        value.extend(upstream);
    }
    value
}
