//! The one-shot subcommands: `check-config`, `token new`, `search`, `import` and `tokens`; each returns its exit code.

use super::*;
use satellite::app::search::Found;
use satellite::app::tokens::{How, Target};
use satellite::control::DesiredState;
use satellite::instances::sandbox::SandboxPolicy;

/// `satellite tokens`: exit 0 when every server was counted, 1 when one failed (the others are still shown),
/// 64 for bad arguments or a bad config.
pub(super) fn tokens(args: &TokensArgs) -> ExitCode {
    let env = env::from_process();
    let (targets, sandbox) = match token_targets(args, &env) {
        Ok(targets) => targets,
        Err(code) => return code,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let timeout = std::time::Duration::from_secs(args.timeout.max(1));
    let report = match runtime.block_on(satellite::app::tokens::measure(&targets, &env, sandbox.as_ref(), timeout)) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(code) = print_report(&report, args.json) {
        return code;
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

/// The servers `satellite tokens` counts, as its arguments name them, and the sandbox a config file's servers
/// start in.
fn token_targets(args: &TokensArgs, env: &env::Env) -> Result<(Vec<Target>, Option<SandboxPolicy>), ExitCode> {
    if let Some(url) = &args.url {
        Ok((vec![http_target(url, args)?], None))
    } else if let Some(path) = &args.config {
        let (targets, sandbox) = config_targets(path, env)?;
        Ok((targets, Some(sandbox)))
    } else if let [program, rest @ ..] = args.command.as_slice() {
        let name = std::path::Path::new(program).file_name().map(|n| n.to_string_lossy().into_owned());
        let how = How::Command { program: program.clone(), args: rest.to_vec() };
        Ok((vec![Target { name: name.unwrap_or_else(|| program.clone()), how }], None))
    } else {
        eprintln!("error: say which server: --url URL, --config FILE, or -- COMMAND [ARGS...]");
        Err(exit(config::EXIT_CONFIG))
    }
}

/// A remote server (`--url`), with its `--header`s.
fn http_target(url: &url::Url, args: &TokensArgs) -> Result<Target, ExitCode> {
    let mut headers = std::collections::BTreeMap::new();
    for header in &args.headers {
        let Some((name, value)) = header.split_once(':') else {
            eprintln!("error: --header {header:?} is not `Name: value`");
            return Err(exit(config::EXIT_CONFIG));
        };
        headers.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    let name = url.host_str().unwrap_or("server").to_owned();
    Ok(Target { name, how: How::Http { url: url.clone(), headers, sse: args.sse } })
}

/// Every enabled installation of a config file (`--config`), and the sandbox they start in.
fn config_targets(path: &std::path::Path, env: &env::Env) -> Result<(Vec<Target>, SandboxPolicy), ExitCode> {
    let flags = Flags { config: Some(path.to_path_buf()), ..Flags::default() };
    let config = Config::load(env, &flags).map_err(|err| {
        eprintln!("error: {err}");
        exit(config::EXIT_CONFIG)
    })?;
    satellite::app::tokens::targets_of_config(&config, env).map_err(|err| {
        eprintln!("error: {err}");
        exit(config::EXIT_CONFIG)
    })
}

/// The counts as a table, or as JSON (`--json`).
fn print_report(report: &satellite::app::tokens::TokenReport, json: bool) -> Result<(), ExitCode> {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("error: {err}");
                return Err(ExitCode::FAILURE);
            }
        }
    } else {
        print!("{}", satellite::app::tokens::table(report));
    }
    Ok(())
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
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let limit = args.limit.clamp(1, 50);
    if args.url.is_some() && args.token.is_none() {
        eprintln!("error: --url needs a bearer token: --token TOKEN or SATELLITE_TOKEN");
        return exit(config::EXIT_CONFIG);
    }
    if let (Some(url), Some(token)) = (&args.url, &args.token) {
        return match runtime.block_on(satellite::app::search::remote(url, token, &args.query, limit)) {
            Ok(document) if args.json => print_json(&document),
            Ok(document) => show_found(&found_in(&document), &args.query),
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

/// The tools a running satellite's `discover_mcp_tools` answered, as the stored search finds them.
fn found_in(document: &serde_json::Value) -> Vec<Found> {
    document["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| Found {
                    tool_path: t["tool_path"].as_str().unwrap_or_default().to_owned(),
                    score: t["relevance_score"].as_f64().unwrap_or_default(),
                    description: t["description"].as_str().unwrap_or_default().to_owned(),
                    user: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Found tools as a table on stdout; none found is said on stderr (and is not a failure).
pub(super) fn show_found(found: &[Found], query: &str) -> ExitCode {
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
    let sandbox = match SandboxPolicy::for_config(&config, &env) {
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
    let problems = refusals(&state, &sandbox);
    note_start_only_settings(&config);
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
    print_json(&effective_config(&config, &state, &sandbox, database))
}

/// What `serve` would refuse: entries that do not validate, and stdio commands or arguments the sandbox
/// refuses. A runtime missing on this machine is only a warning: the config may be checked elsewhere.
fn refusals(state: &DesiredState, sandbox: &SandboxPolicy) -> Vec<String> {
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
    problems
}

/// Settings of the config file that a running satellite does not reread, said once on stderr.
fn note_start_only_settings(config: &Config) {
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
}

/// The configuration `check-config` prints: secrets redacted, with the database's version, the instances
/// it would run and what it refused, and the sandbox.
fn effective_config(
    config: &Config,
    state: &DesiredState,
    sandbox: &SandboxPolicy,
    database: Option<String>,
) -> serde_json::Value {
    let instances: Vec<serde_json::Value> = state.instances.values().map(redacted_instance).collect();
    let mut effective = config.redacted();
    if let Some(version) = database {
        effective["database"]["server_version"] = serde_json::Value::String(version);
    }
    effective["desired_state"] = serde_json::json!({"instances": instances, "rejected": state.rejected});
    effective["sandbox"]["summary"] = serde_json::Value::String(sandbox.describe());
    effective
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
