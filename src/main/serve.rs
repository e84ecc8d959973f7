//! `satellite serve`: start the satellite, serve until a signal, then stop in order (runtime, then telemetry).

use super::*;
use satellite::store::{DataDirLock, DirLockError};

/// Raise the soft open-file limit to the hard one, as servers that hold many connections do: containers and
/// some init systems start processes at a soft 1024 with a much higher hard limit, and the connection cap
/// (half the soft limit by default) would follow the low one. Returns (before, after) when it changed.
fn raise_open_file_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    // An unlimited hard limit is capped at what the kernel allows a process (fs.nr_open, commonly 1M).
    let target = if hard == nix::sys::resource::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open").ok()?.trim().parse().ok()?
    } else {
        hard
    };
    if target <= soft {
        return None;
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard).ok()?;
    Some((soft, target))
}

/// How long a failed start waits for its unfinished background work before the process exits.
const FAILED_START_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

pub(super) fn serve(args: &ServeArgs) -> ExitCode {
    let raised = raise_open_file_limit();
    let (config, env) = match load(args) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // Held until this function returns, that is for the process's life.
    let lock = match lock_data_dir(&config) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let telemetry = telemetry::init(&config.log_level, config.log_format, true);
    if let Some((before, after)) = raised {
        tracing::debug!(before, after, "open-file limit raised to the hard limit");
    }
    if let Err(err) = &lock {
        tracing::warn!(error = %err, "running without the data directory's lock: a second satellite started on this \
            directory would not be stopped (the volume refuses the lock file, or its filesystem has no locks)");
    }
    start_reaper();
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    // Runs as long as the satellite serves; stopped once it has shut down, before the runtime goes.
    let purge = runtime.spawn(satellite::memory::purge_periodically(satellite::memory::PURGE_EVERY));
    let served = runtime.block_on(run(&config, &env));
    purge.abort();
    let code = match served {
        Ok(code) => {
            drop(runtime);
            code
        }
        // A failed start may leave work on the blocking pool that nothing waits for any more (the semantic
        // model still loading while the store failed to open): dropping the runtime would wait for it.
        Err(code) => {
            runtime.shutdown_timeout(FAILED_START_GRACE);
            code
        }
    };
    // The exporter blocks while it sends the last spans: after the runtime is gone.
    telemetry.shutdown();
    code
}

/// One satellite per data directory: the lock of `config`'s, before anything is started or logged. Another
/// satellite holding it stops this one with one line and exit 64 (two would run every server twice on one
/// database); a lock that cannot be had at all (a read-only or full volume, which the store then answers with its
/// in-memory fallback; a filesystem without locks) does not stop it: the error is returned to be logged.
fn lock_data_dir(config: &Config) -> Result<Result<DataDirLock, DirLockError>, ExitCode> {
    match DataDirLock::acquire(&config.data_dir) {
        Err(err @ DirLockError::Busy { .. }) => {
            eprintln!("error: {err}");
            Err(exit(config::EXIT_CONFIG))
        }
        other => Ok(other),
    }
}

/// Before any server starts: whatever kills the satellite, its servers' process trees go with it.
fn start_reaper() {
    match std::env::current_exe() {
        Ok(exe) => satellite::mcp::transport::stdio::reaper::start(&exe),
        Err(err) => tracing::warn!(error = %err, "the process-tree watchdog did not start: own executable unknown"),
    }
}

/// Start the satellite and serve until a signal stops it: the exit code, or `Err` with it when it did not start.
async fn run(config: &Config, env: &env::Env) -> Result<ExitCode, ExitCode> {
    let satellite = match Satellite::start(config.clone(), env).await {
        Ok(satellite) => satellite,
        Err(err) => {
            eprintln!("error: {err}");
            return Err(exit(err.exit_code()));
        }
    };
    if let Mode::Standalone(StandaloneSource::Embedded(demo)) = &config.mode {
        print_demo_banner(satellite.local_addr(), demo);
    }
    shutdown_signal().await;
    Ok(if satellite.shutdown().await { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The embedded default's tokens and a client config to paste. Generated tokens are shown once, here;
/// tokens the operator set are not echoed.
fn print_demo_banner(addr: SocketAddr, demo: &config::EmbeddedDefault) {
    let token = if demo.demo_token_generated {
        demo.demo_token.expose_secret().to_owned()
    } else {
        "$SATELLITE_DEMO_TOKEN".into()
    };
    let instance = if demo.instance_token_generated {
        demo.instance_token.expose_secret().to_owned()
    } else {
        "$SATELLITE_DEMO_INSTANCE_TOKEN".into()
    };
    let base = format!("http://{addr}");
    println!(
        "\nsatellite is running standalone with the embedded demo configuration on {base}\n\
         \n  user token (user `demo`):      {token}\n  instance token (path `demo`):  {instance}\n\
         \nClaude Code:\n  claude mcp add --transport http satellite {base}/mcp --header \"Authorization: Bearer {token}\"\n\
         \nCursor (~/.cursor/mcp.json):\n  {{\"mcpServers\": {{\"satellite\": {{\"url\": \"{base}/mcp\", \"headers\": {{\"Authorization\": \"Bearer {token}\"}}}}}}}}\n\
         \nVS Code and Claude Desktop: see the README (\"Connect a client\").\n\
         \nInstance router: {base}/i/demo/mcp?token={instance}\nStatus: {base}/api/status/debug\n\
         Set SATELLITE_DEMO_TOKEN and SATELLITE_DEMO_INSTANCE_TOKEN to keep these tokens across restarts.\n"
    );
}

/// SIGTERM, SIGINT or SIGHUP: each stops the satellite gracefully. SIGHUP is what a closed terminal sends, and what
/// an operator may send out of habit to reload; the configuration file needs no signal (it is watched), so it
/// stops gracefully too. Unhandled, it killed the satellite on the spot: no drain, calls cut, nothing logged.
pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut hangup) = match (signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
        (Ok(term), Ok(hangup)) => (term, hangup),
        (Err(err), _) | (_, Err(err)) => {
            tracing::error!(error = %err, "cannot listen for SIGTERM and SIGHUP; stopping on ctrl-c only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = hangup.recv() => tracing::info!("SIGHUP received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
