#!/usr/bin/env bash
# Validates everything under deploy/ without a cluster, a Docker engine or systemd running:
#
#   - deploy/kubernetes: every manifest against the Kubernetes OpenAPI schemas bundled in the kubernetes-validate
#     package (strict: unknown fields fail), for each version in K8S_VERSIONS; the ServiceMonitor (a CRD, not
#     in those schemas) against a strict hand-written schema of the fields used; the kustomization (every file
#     listed, every listed file present) and, when kubectl is installed, `kubectl kustomize` and its output;
#     cross-references (ConfigMap/Secret/PVC names, selectors, port names, probe paths, mount paths) and the
#     production settings (one replica + Recreate + a ReadWriteOnce claim, non-root, read-only root, grace
#     period, resources).
#   - deploy/kubernetes-scale-out (the PostgreSQL overlay of deploy/kubernetes): rendered by a built-in renderer of
#     the kustomize features it uses (JSON patches, `$patch: delete`, labels, images) and, when kubectl is
#     installed, compared with `kubectl kustomize`; every rendered object against the schemas; then its settings:
#     RollingUpdate that keeps a replica up, no claim, the data directory an emptyDir within the ephemeral-storage
#     limit, DATABASE_URL from a Secret key that exists (a postgres:// placeholder), the HPA (target, at least 2
#     replicas, maxReplicas x (pool + 1) within PostgreSQL's default 100 connections, slow scale-down), the PDB
#     consistent with the HPA's minimum, ClientIP affinity, the grace period covering the preStop pause.
#   - deploy/compose.yaml: interpolated with its defaults, against the Compose Specification schema bundled in
#     check-jsonschema, plus the settings (volume, config mount, healthcheck, stop_grace_period, ulimits).
#   - deploy/compose.scale-out.yaml: the same per replica (none publishes a port, each has its own volume and
#     waits for a healthy PostgreSQL, env files are git-ignored), PostgreSQL (pinned, pg_isready, password not
#     inline, not published), and nginx.scale-out.conf (upstream = the replicas, hashed on the caller's token,
#     SSE unbuffered, timeouts) with `nginx -t` when nginx is installed.
#   - deploy/Dockerfile and .dockerignore: parsed; the build stage copies every path the release build reads
#     (Cargo.toml targets, include_str!/include_bytes!, sqlx migrations) and .dockerignore keeps them in the
#     context; the runtime stage is non-root, has HEALTHCHECK, STOPSIGNAL, tini, node/npm, python3, uv/uvx,
#     a data volume made and chowned before VOLUME, and no demo token or debug route.
#   - deploy/satellite.service: its settings, and `systemd-analyze verify` when systemd-analyze exists.
#   - the example config and the ConfigMap's satellite.toml: `satellite check-config` with the environment each
#     deployment sets, when SATELLITE_BIN names a satellite binary (skipped otherwise).
#
# Usage:   bash scripts/validate-deploy.sh
#          SATELLITE_BIN=target/release/satellite bash scripts/validate-deploy.sh
# Env:     SATELLITE_BIN   a built satellite binary for check-config (optional)
#          K8S_VERSIONS    Kubernetes versions to validate against (default "1.30 1.37")
#          DEPLOY_VENV     where the Python tools live (default ~/.cache/satellite/validate-deploy-venv)
#          PYTHON          the interpreter that makes the venv (default python3, 3.11+)
#          DOCKERFILE_PARSER=builtin  use the built-in Dockerfile parser even where BuildKit's is installed
#
# Needs Python 3.11+ with pip, and PyPI on the first run only (the venv is reused while its requirements
# are unchanged). Exits non-zero, naming each failure, if anything is wrong; the last line reads
# "deploy: N passed, N failed, N skipped".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
VENV=${DEPLOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/satellite/validate-deploy-venv}

# Pinned: the bundled schemas come with the package version.
REQUIREMENTS='kubernetes-validate==1.37.0
check-jsonschema==0.39.0
jsonschema==4.26.0
PyYAML==6.0.3'
# Optional: BuildKit's own Dockerfile parser (wheels for x86-64 Linux only); a built-in parser stands in for it.
OPTIONAL='dockerfile==3.4.0'

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "validate-deploy: needs Python 3.11+ as \$PYTHON (have: $("$PYTHON" --version 2>&1 || echo none))" >&2
  exit 2
fi

pip_into_venv() {
  if [ -x "$VENV/bin/pip" ]; then
    "$VENV/bin/pip" --disable-pip-version-check -q "$@"
  else
    # A venv made without ensurepip (Debian without python3-venv): the system pip installs into it.
    "$PYTHON" -m pip --disable-pip-version-check -q --python "$VENV/bin/python" "$@"
  fi
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "validate-deploy: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    "$PYTHON" -m venv --without-pip "$VENV"
  fi
fi
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQUIREMENTS" ]; then
  echo "validate-deploy: installing $(echo "$REQUIREMENTS" | tr '\n' ' ')"
  printf '%s\n' "$REQUIREMENTS" > "$VENV/requirements.txt"
  pip_into_venv install -r "$VENV/requirements.txt"
  pip_into_venv install --only-binary=:all: "$OPTIONAL" 2>/dev/null \
    || echo "validate-deploy: no $OPTIONAL wheel for this platform; using the built-in Dockerfile parser"
  printf '%s' "$REQUIREMENTS" > "$VENV/.requirements"
fi

export VALIDATE_ROOT="$ROOT"
exec "$VENV/bin/python" - "$@" <<'PY'
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(os.environ["VALIDATE_ROOT"])
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
K8S_SCALE = DEPLOY / "kubernetes-scale-out"
K8S_VERSIONS = os.environ.get("K8S_VERSIONS", "1.30 1.37").split()
SATELLITE_BIN = os.environ.get("SATELLITE_BIN", "").strip()

# Variables whose values are secrets; none may be baked into an image, a ConfigMap or compose.yaml.
# DATABASE_URL carries the PostgreSQL password.
SECRET_VARS = ("SATELLITE_DEMO_TOKEN", "SATELLITE_DEMO_INSTANCE_TOKEN", "DEPLOYSTACK_REGISTRATION_TOKEN", "DATABASE_URL")
# Shutdown: SATELLITE_DRAIN_SECONDS, then ~25 s to stop MCP servers and flush events.
STOP_AFTER_DRAIN = 25
DEFAULT_DRAIN = 10

counts = {"passed": 0, "failed": 0, "skipped": 0}
failures = []


def rel(path):
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


class Check:
    """One named check: `with Check(name) as c:` then c.fail(...) any number of times; an exception fails it."""

    def __init__(self, name, quiet=False):
        self.name = name
        self.quiet = quiet  # counted and shown only when it fails
        self.problems = []
        self.skip_reason = None

    def fail(self, message):
        self.problems.append(message)

    def expect(self, condition, message):
        if not condition:
            self.fail(message)
        return condition

    def skip(self, reason):
        self.skip_reason = reason

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if value is not None:
            self.problems.append(f"{kind.__name__}: {value}")
        if self.problems:
            counts["failed"] += 1
            failures.append(self.name)
            print(f"FAIL {self.name}")
            for problem in self.problems:
                for i, line in enumerate(str(problem).splitlines() or [""]):
                    print(("     - " if i == 0 else "       ") + line)
        elif self.quiet:
            pass
        elif self.skip_reason:
            counts["skipped"] += 1
            print(f"skip {self.name}: {self.skip_reason}")
        else:
            counts["passed"] += 1
            print(f"ok   {self.name}")
        return True


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def seconds(text):
    """A Go/compose duration ("45s", "1m30s", "500ms") or a bare number of seconds."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text):
        if m.start() != pos:
            raise ValueError(f"not a duration: {text!r}")
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"not a duration: {text!r}")
    return total


def is_placeholder(value):
    value = "" if value is None else str(value).strip()
    # "<password>" anywhere counts too (postgres://satellite:<password>@host/db).
    return value == "" or re.search(r"<[^<>\s]+>", value) or re.search(r"REPLACE|CHANGE[_-]?ME|PLACEHOLDER", value, re.I)


# Token-shaped strings that must never appear in deploy/ (real secrets): instance tokens, registration
# tokens, GitHub tokens, private keys.
SECRET_PATTERNS = [
    (re.compile(r"ds_inst_[0-9a-f]{64}"), "an instance token (ds_inst_ + 64 hex)"),
    (re.compile(r"deploystack_satellite_(global|team)_[A-Za-z0-9]{8,}"), "a registration token"),
    (re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"), "a GitHub token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
]
ZERO_HASH = "0" * 64


def check_toml_placeholders(c, text, where):
    """Example configs ship the all-zero hash (no token hashes to it) and no credential values."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        c.fail(f"{where}: not TOML: {e}")
        return None
    hashes = list(data.get("auth", {}).get("admin_token_sha256", []))
    for user in data.get("users", []):
        hashes += user.get("token_sha256", [])
        hashes += [t.get("sha256", "") for t in user.get("tokens", [])]
    for inst in data.get("installations", []):
        for tier in inst.get("users", {}).values():
            if "instance_token_sha256" in tier:
                hashes.append(tier["instance_token_sha256"])
    for h in hashes:
        c.expect(h == ZERO_HASH, f"{where}: token hash {h[:12]}... is not the all-zero placeholder; an example "
                                 "must not ship a hash whose token someone knows")
    jwt = data.get("auth", {}).get("jwt")
    if jwt:
        c.expect(is_placeholder(jwt.get("secret")), f"{where}: [auth.jwt] secret is not a placeholder")
    return data


# ---------------------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------------------
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


class Instr:
    def __init__(self, cmd, flags, value, line, json_form):
        self.cmd, self.flags, self.value, self.line, self.json = cmd, tuple(flags), tuple(value), line, json_form

    def flag(self, name):
        for f in self.flags:
            if f.startswith(f"--{name}="):
                return f.split("=", 1)[1]
        return None


def parse_dockerfile_builtin(text):
    """A small parser of the Dockerfile syntax used here: comments, `\\` continuations, JSON and shell forms,
    leading --flags. Stands in for BuildKit's parser where the `dockerfile` wheel is unavailable."""
    out, buf, start = [], "", None
    lines = text.splitlines()
    for n, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as BuildKit does
        if start is None:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        cmd, _, rest = buf.partition(" ")
        flags = []
        rest = rest.strip()
        if cmd.upper() in ("FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"):
            while rest.startswith("--"):
                flag, _, rest = rest.partition(" ")
                flags.append(flag)
                rest = rest.strip()
        json_form = False
        if cmd.upper() in ("RUN", "CMD", "ENTRYPOINT", "SHELL", "VOLUME", "COPY", "ADD") and rest.startswith("["):
            try:
                value = json.loads(rest)
                json_form = True
            except json.JSONDecodeError:
                value = [rest]
        elif cmd.upper() == "HEALTHCHECK":
            kind, _, body = rest.partition(" ")
            body = body.strip()
            if body.startswith("["):
                value = [kind] + json.loads(body)
                json_form = True
            else:
                value = [kind, body] if body else [kind]
        elif cmd.upper() in ("RUN", "CMD", "ENTRYPOINT"):
            value = [rest]
        elif cmd.upper() in ("ENV", "LABEL"):
            value = []
            if "=" in rest.split(" ")[0]:
                for word in shlex.split(rest):
                    k, _, v = word.partition("=")
                    value += [k, v]
            else:
                k, _, v = rest.partition(" ")
                value = [k, v.strip()]
        else:
            value = shlex.split(rest)
        out.append(Instr(cmd.upper(), flags, value, start, json_form))
        buf, start = "", None
    return out


def parse_dockerfile(path):
    text = path.read_text()
    if os.environ.get("DOCKERFILE_PARSER") == "builtin":
        return parse_dockerfile_builtin(text), "built-in parser"
    try:
        import dockerfile  # BuildKit's parser, when its wheel exists for this platform
    except ImportError:
        return parse_dockerfile_builtin(text), "built-in parser"
    parsed = dockerfile.parse_string(text)
    return [Instr(c.cmd.upper(), c.flags, c.value, c.start_line, c.json) for c in parsed], "BuildKit parser"


def dockerignore_patterns(path):
    pats = []
    if not path.exists():
        return pats
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        if neg:
            line = line[1:].strip()
        line = os.path.normpath(line.lstrip("/")).replace(os.sep, "/")
        rx, i = "", 0
        while i < len(line):
            ch = line[i]
            if line.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
                continue
            if line.startswith("**", i):
                rx += ".*"
                i += 2
                continue
            rx += {"*": "[^/]*", "?": "[^/]"}.get(ch, re.escape(ch))
            i += 1
        pats.append((re.compile(rx), neg, line))
    return pats


def ignored(relpath, pats):
    """Docker's rule: a pattern matches a path or any of its parents; the last matching pattern decides."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for rx, neg, _ in pats:
        if any(rx.fullmatch(p) for p in prefixes):
            result = not neg
    return result


def build_inputs():
    """Repository paths `cargo build --release --locked --bin satellite` reads."""
    needed = {"Cargo.toml", "Cargo.lock"}
    if (ROOT / ".cargo" / "config.toml").exists():
        needed.add(".cargo/config.toml")
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    if (ROOT / "build.rs").exists() or manifest.get("package", {}).get("build"):
        needed.add(manifest.get("package", {}).get("build") or "build.rs")
    lib = manifest.get("lib", {}).get("path", "src/lib.rs")
    needed.add(lib)
    for kind, folder in (("bin", "src/bin"), ("test", "tests"), ("bench", "benches"), ("example", "examples")):
        for target in manifest.get(kind, []):
            if "path" in target:
                needed.add(target["path"])
            elif kind == "bin" and target.get("name") == manifest["package"]["name"]:
                needed.add("src/main.rs")
            else:
                needed.add(f"{folder}/{target['name']}.rs")
    # The workspace's member crates (`crates/*`): each one's manifest and sources.
    sources = [ROOT / "src"]
    for pattern in manifest.get("workspace", {}).get("members", []):
        if pattern in (".", ""):
            continue
        for member in sorted(ROOT.glob(pattern)):
            if member.resolve() != ROOT.resolve() and (member / "Cargo.toml").is_file():
                needed.add(rel(member / "Cargo.toml"))
                sources.append(member / "src")
    for rs in sorted(p for folder in sources for p in folder.rglob("*.rs")):
        needed.add(rel(rs))
        text = rs.read_text(errors="replace")
        for m in re.finditer(r"include_(?:str|bytes)!\(\s*\"([^\"]+)\"\s*\)", text):
            needed.add(rel((rs.parent / m.group(1)).resolve()))
        for m in re.finditer(r"(?:sqlx::)?migrate!\(\s*\"([^\"]+)\"\s*\)", text):
            folder = (ROOT / m.group(1)).resolve()
            needed.update(rel(p) for p in folder.rglob("*") if p.is_file())
        if re.search(r"(?:sqlx::)?migrate!\(\s*\)", text):
            needed.update(rel(p) for p in (ROOT / "migrations").rglob("*") if p.is_file())
    return needed


def check_dockerfile():
    path = DEPLOY / "Dockerfile"
    with Check("Dockerfile parses") as c:
        instrs, parser = parse_dockerfile(path)
        unknown = [f"line {i.line}: {i.cmd}" for i in instrs if i.cmd not in INSTRUCTIONS]
        c.expect(not unknown, f"unknown instructions: {unknown}")
        c.expect(instrs and instrs[0].cmd in ("FROM", "ARG"), "must start with ARG or FROM")
        print(f"     ({parser}, {len(instrs)} instructions)")
    if c.problems:
        return

    # Split into stages.
    stages, current = [], None
    for i in instrs:
        if i.cmd == "FROM":
            name = i.value[2] if len(i.value) >= 3 and i.value[1].upper() == "AS" else None
            current = {"image": i.value[0], "name": name, "instrs": [], "line": i.line}
            stages.append(current)
        elif current is not None:
            current["instrs"].append(i)
    by_name = {s["name"]: s for s in stages if s["name"]}
    final = stages[-1]
    args = {}
    for i in instrs:
        if i.cmd == "ARG":
            for v in i.value:
                k, _, d = v.partition("=")
                args.setdefault(k, d)

    with Check("Dockerfile base images are pinned by tag") as c:
        for s in stages:
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), s["image"])
            if image in by_name:
                continue
            tag = image.split("@")[0].rsplit("/", 1)[-1]
            c.expect(":" in tag or "@" in image, f"line {s['line']}: {s['image']} has no tag")
            c.expect(not tag.endswith(":latest"), f"line {s['line']}: {s['image']} uses :latest")

    with Check("Dockerfile build stage copies everything the release build reads") as c:
        build = next((s for s in stages if any(i.cmd == "RUN" and "cargo build" in " ".join(i.value)
                                                for i in s["instrs"])), None)
        if not c.expect(build is not None, "no stage runs `cargo build`"):
            return
        run = next(i for i in build["instrs"] if i.cmd == "RUN" and "cargo build" in " ".join(i.value))
        cmdline = " ".join(run.value)
        c.expect("--release" in cmdline and "--locked" in cmdline, "cargo build must use --release --locked")
        workdir = "/"
        copies = []  # (repo source, container destination)
        for i in build["instrs"]:
            if i is run:
                break
            if i.cmd == "WORKDIR":
                workdir = os.path.normpath(os.path.join(workdir, i.value[0]))
            if i.cmd in ("COPY", "ADD") and not i.flag("from"):
                *srcs, dest = i.value
                dest_abs = os.path.normpath(os.path.join(workdir, dest))
                for src in srcs:
                    c.expect((ROOT / src).exists(), f"line {i.line}: COPY source {src} does not exist")
                    if len(srcs) > 1 or dest.endswith("/"):
                        if (ROOT / src).is_dir():
                            copies.append((os.path.normpath(src), dest_abs))
                        else:
                            copies.append((os.path.normpath(src), os.path.join(dest_abs, os.path.basename(src))))
                    else:
                        copies.append((os.path.normpath(src), dest_abs))
        pats = dockerignore_patterns(ROOT / ".dockerignore")
        missing_copy, missing_ctx = [], []
        for need in sorted(build_inputs()):
            if not (ROOT / need).exists():
                c.fail(f"{need} is needed by the build but missing from the repository")
                continue
            target = os.path.normpath(os.path.join(workdir, need))
            covered = False
            for src, dest in copies:
                src = "" if src == "." else src
                if need == src or need.startswith(src + "/") or src == "":
                    tail = need[len(src):].lstrip("/") if src else need
                    if os.path.normpath(os.path.join(dest, tail)) == target:
                        covered = True
            if not covered:
                missing_copy.append(need)
            if ignored(need, pats):
                missing_ctx.append(need)
        c.expect(not missing_copy, f"not copied to {workdir} before `cargo build`: {missing_copy[:10]}"
                                   + (f" and {len(missing_copy) - 10} more" if len(missing_copy) > 10 else ""))
        c.expect(not missing_ctx, f".dockerignore drops files the build needs: {missing_ctx[:10]}")
        # Secrets and bulk must stay out of the context.
        for bulky in ("target/x", "fuzz/corpus/x", ".env", "data/x", "persistent_data/x", ".git/x",
                      "tests/node/node_modules/x"):
            c.expect(ignored(bulky, pats), f".dockerignore lets {bulky.rsplit('/x', 1)[0]} into the build context")
        # What the final stage copies out of the build stage must survive the cache mounts.
        mounts = [m.group(1) for f in run.flags for m in [re.search(r"type=cache,.*?target=([^,\s]+)", f)] if m]
        for i in final["instrs"]:
            src_stage = i.flag("from") if i.cmd == "COPY" else None
            if src_stage and src_stage == build["name"]:
                for src in i.value[:-1]:
                    for mount in mounts:
                        c.expect(not (src + "/").startswith(mount.rstrip("/") + "/"),
                                 f"line {i.line}: copies {src} from a cache mount ({mount}); it is not in the layer")
                    produced = src in cmdline or any(src.startswith(d[1]) for d in copies)
                    c.expect(produced, f"line {i.line}: {src} is not produced by the build stage's RUN")

    env, user, health, stopsignal, entry, volumes = {}, None, None, None, None, []
    runs = []
    for i in final["instrs"]:
        if i.cmd == "ENV":
            for k, v in zip(i.value[0::2], i.value[1::2]):
                env[k] = v.strip('"')
        elif i.cmd == "USER":
            user = i.value[0]
        elif i.cmd == "HEALTHCHECK":
            health = i
        elif i.cmd == "STOPSIGNAL":
            stopsignal = i.value[0]
        elif i.cmd == "ENTRYPOINT":
            entry = i
        elif i.cmd == "VOLUME":
            volumes += [(v, i.line) for v in i.value]
        elif i.cmd == "RUN":
            runs.append(i)
    run_text = " ".join(" ".join(r.value) for r in runs)

    with Check("Dockerfile runtime stage runs as a numeric non-root user") as c:
        c.expect(user is not None, "no USER in the final stage")
        if user:
            uid = user.split(":")[0]
            c.expect(uid.isdigit(), f"USER {user} is not numeric (Kubernetes runAsNonRoot cannot verify a name)")
            c.expect(uid != "0", "USER is root")

    with Check("Dockerfile data volume exists and belongs to the user before VOLUME") as c:
        c.expect(volumes, "no VOLUME")
        uid = (user or "").split(":")[0]
        for vol, line in volumes:
            before = " ".join(" ".join(r.value) for r in runs if r.line < line)
            c.expect(re.search(rf"mkdir\b[^&;]*\s{re.escape(vol)}(/|\s|$)", before),
                     f"VOLUME {vol} (line {line}) is not made by a RUN mkdir before it")
            c.expect(re.search(rf"chown\b[^&;]*\b({re.escape(uid)}|satellite)\S*\s[^&;]*{re.escape(vol)}(\s|$)", before),
                     f"VOLUME {vol} (line {line}) is not chowned to the runtime user before it")
        c.expect(env.get("SATELLITE_DATA_DIR") in [v for v, _ in volumes],
                 f"SATELLITE_DATA_DIR={env.get('SATELLITE_DATA_DIR')} is not the VOLUME")
        persistent = env.get("DEPLOYSTACK_PERSISTENT_DATA_DIR", "")
        c.expect(any(persistent.startswith(v.rstrip("/") + "/") for v, _ in volumes),
                 "DEPLOYSTACK_PERSISTENT_DATA_DIR (managed mode's API key) is not on the volume")

    with Check("Dockerfile has HEALTHCHECK, STOPSIGNAL and tini") as c:
        if c.expect(health is not None, "no HEALTHCHECK"):
            cmd = " ".join(health.value[1:])
            c.expect(health.value[0].upper() == "CMD", "HEALTHCHECK is not CMD")
            c.expect(re.search(r"/(healthz|readyz)\b", cmd), "HEALTHCHECK probes neither /healthz nor /readyz")
            tool = re.split(r"\s+", cmd.strip())[0]
            if tool == "curl":
                c.expect(re.search(r"apt-get install[^&;]*\bcurl\b", run_text), "HEALTHCHECK uses curl, not installed")
            c.expect(health.flag("start-period") is not None, "HEALTHCHECK has no --start-period")
        c.expect(stopsignal == "SIGTERM", f"STOPSIGNAL is {stopsignal}, not SIGTERM")
        c.expect(entry is not None and entry.json and "tini" in entry.value[0],
                 "ENTRYPOINT is not tini in JSON form")
        c.expect(re.search(r"apt-get install[^&;]*\btini\b", run_text), "tini is not installed")

    with Check("Dockerfile runtime has node/npm, python3 and uv/uvx") as c:
        base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), final["image"])
        node = base.startswith(("node:", "docker.io/library/node:")) or re.search(
            r"apt-get install[^&;]*\bnodejs\b[^&;]*\bnpm\b", run_text)
        c.expect(node, "neither a node base image nor apt nodejs+npm")
        c.expect(re.search(r"apt-get install[^&;]*\bpython3\b", run_text), "python3 is not installed")
        uv = [i for i in final["instrs"] if i.cmd == "COPY" and "/uv" in i.value and "/uvx" in i.value]
        c.expect(uv, "uv and uvx are not copied in")
        for i in uv:
            src = i.flag("from")
            image = by_name[src]["image"] if src in by_name else src
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), image or "")
            c.expect(re.search(r"astral-sh/uv:\d+\.\d+\.\d+", image), f"uv image {image} is not pinned to a version")
            c.expect(i.value[-1].rstrip("/") in ("/usr/local/bin", "/usr/bin", "/bin"), "uv is not put on PATH")

    with Check("Dockerfile defaults are safe (no demo tokens, debug route off)") as c:
        c.expect(env.get("DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE") == "false",
                 "ENV DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE=false is missing")
        for i in instrs:
            if i.cmd in ("ENV", "ARG", "LABEL"):
                text = " ".join(i.value)
                for var in SECRET_VARS:
                    c.expect(var not in text, f"line {i.line}: {i.cmd} sets {var}")
        c.expect("SATELLITE_CONFIG" not in env and "DEPLOYSTACK_BACKEND_URL" not in env,
                 "the image must not choose the mode (SATELLITE_CONFIG/DEPLOYSTACK_BACKEND_URL)")
        port = env.get("PORT", "3001")
        exposed = [v for i in final["instrs"] if i.cmd == "EXPOSE" for v in i.value]
        c.expect(port in [e.split("/")[0] for e in exposed], f"PORT {port} is not EXPOSEd")


# ---------------------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------------------
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": LABELS,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
# The monitoring.coreos.com/v1 ServiceMonitor fields this repository uses (and a few common ones), strict: a
# field outside it is more likely a typo than a feature; extend the schema when you use one on purpose.
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                "namespace": {"type": "string"},
                "labels": LABELS,
                "annotations": LABELS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "params": {"type": "object",
                                       "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}
KUSTOMIZATION = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "resources"],
    "properties": {
        "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
        "kind": {"const": "Kustomization"},
        "namespace": {"type": "string"},
        "resources": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        # JSON patches (a list of operations) with a target, or `$patch: delete` documents without one.
        "patches": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["path"],
            "properties": {"path": {"type": "string"}, "target": {
                "type": "object", "additionalProperties": False, "required": ["kind", "name"],
                "properties": {"group": {"type": "string"}, "version": {"type": "string"},
                               "kind": {"type": "string"}, "name": {"type": "string"}}}}}},
        "labels": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["pairs"],
            "properties": {"pairs": LABELS, "includeSelectors": {"type": "boolean"},
                           "includeTemplates": {"type": "boolean"}}}},
        "commonAnnotations": LABELS,
        "images": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {"name": {"type": "string"}, "newName": {"type": "string"},
                           "newTag": {"type": "string"}, "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}}}},
    },
}


def k8s_schema_errors(doc):
    """Problems of one object against the bundled strict schemas, for every version in K8S_VERSIONS."""
    problems = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.absolute_path) or "(root)"
            problems.append(f"k8s {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"k8s {version}: {e.message}")
        except kubernetes_validate.VersionNotSupportedError as e:
            problems.append(e.message)
    return problems


def validate_objects(c, docs, where):
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            c.fail(f"{where}: a document without apiVersion/kind")
            continue
        name = f"{where}: {doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            v = jsonschema.Draft202012Validator(SERVICE_MONITOR)
            for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
                path = ".".join(str(p) for p in e.absolute_path) or "(root)"
                c.fail(f"{name}: {path}: {e.message} (minimal ServiceMonitor schema)")
        else:
            for p in k8s_schema_errors(doc):
                c.fail(f"{name}: {p}")


# JSON patch (RFC 6902) and the subset of kustomize the overlays here use, so they are rendered and checked
# without kubectl; where kubectl is installed its rendering must be the same.
def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    for p in parts:
        if isinstance(doc, list):
            doc = doc[int(p)]
        elif isinstance(doc, dict):
            doc = doc[p]
        else:
            raise KeyError(p)
    return doc


def json_patch(doc, ops):
    for op in ops:
        kind, parts = op["op"], _pointer(op["path"])
        parent, last = _walk(doc, parts[:-1]), parts[-1]
        if kind == "test":
            if _walk(doc, parts) != op["value"]:
                raise ValueError(f"test {op['path']}: {_walk(doc, parts)!r} is not {op['value']!r}")
        elif kind in ("add", "replace"):
            value = json.loads(json.dumps(op["value"]))
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif kind == "add":
                    parent.insert(int(last), value)
                else:
                    parent[int(last)] = value
            else:
                if kind == "replace" and last not in parent:
                    raise KeyError(f"replace {op['path']}: no such member")
                parent[last] = value
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise ValueError(f"op {kind} is not handled by the built-in renderer")
    return doc


def kustomize_builtin(directory):
    """resources (files and directories), patches (JSON patch lists with a kind/name target, or `$patch: delete`),
    labels (metadata only) and images: what this repository's kustomizations use."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objs = []
    for r in k.get("resources", []):
        p = (directory / r).resolve()
        objs += kustomize_builtin(p) if p.is_dir() else load_yaml_docs(p)
    for patch in k.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        if isinstance(body, list):
            t = patch.get("target", {})
            hits = [o for o in objs if o["kind"] == t.get("kind") and o["metadata"]["name"] == t.get("name")]
            if len(hits) != 1:
                raise ValueError(f"patch {patch['path']}: target {t} matches {len(hits)} objects")
            json_patch(hits[0], body)
        elif isinstance(body, dict) and body.get("$patch") == "delete":
            key = (body["kind"], body["metadata"]["name"])
            before = len(objs)
            objs = [o for o in objs if (o["kind"], o["metadata"]["name"]) != key]
            if len(objs) != before - 1:
                raise ValueError(f"patch {patch['path']}: deletes {key[0]}/{key[1]}, which is not there")
        else:
            raise ValueError(f"patch {patch['path']}: only JSON patches and `$patch: delete` are rendered here")
    for label in k.get("labels", []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise ValueError("labels with includeSelectors/includeTemplates are not rendered here")
        for o in objs:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in k.get("images", []):
        for o in objs:
            for ctr in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                name = re.split(r"[:@]", ctr["image"].rsplit("/", 1)[-1])[0]
                prefix = ctr["image"].rsplit("/", 1)[0] + "/" if "/" in ctr["image"] else ""
                if prefix + name != image["name"]:
                    continue
                ref = image.get("newName", image["name"])
                ref += f"@{image['digest']}" if "digest" in image else f":{image['newTag']}" if "newTag" in image else ""
                ctr["image"] = ref
    return objs


def quantity(text):
    """A Kubernetes quantity (256Mi, 2Gi, 500M, 1) in bytes or units."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?", str(text))
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    mult = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * mult


def scaled(value, total, round_up):
    """An int-or-percent field of a PDB or rolling update, resolved against `total` replicas."""
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def k8s_objects(c, docs, where):
    """Validates and indexes objects by (kind, name); duplicates fail."""
    validate_objects(c, docs, where)
    objects = {}
    for d in docs:
        if isinstance(d, dict) and "kind" in d:
            key = (d["kind"], d.get("metadata", {}).get("name"))
            c.expect(key not in objects, f"{where}: duplicate {key[0]}/{key[1]}")
            objects[key] = d
    return objects


def check_kustomization_file(c, directory, files):
    kfile = directory / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    for e in jsonschema.Draft202012Validator(KUSTOMIZATION).iter_errors(k):
        c.fail(f"{rel(kfile)}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}")
    listed = set(k.get("resources", [])) | {p["path"] for p in k.get("patches", [])}
    for r in listed:
        c.expect((directory / r).exists(), f"{rel(kfile)} lists {r}, which does not exist")
    for f in files:
        c.expect(f.name in listed, f"{f.name} is not listed in {rel(kfile)}")
    return k


def check_kubernetes():
    files = sorted(p for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml")
    objects = {}  # (kind, name) -> doc, the single-replica setup as rendered
    with Check("kubernetes manifests match the Kubernetes schemas (strict; " + ", ".join(K8S_VERSIONS) + ")") as c:
        c.expect(files, f"no manifests in {rel(K8S)}")
        docs = []
        for f in files:
            try:
                docs += load_yaml_docs(f)
            except yaml.YAMLError as e:
                c.fail(f"{rel(f)}: not YAML: {e}")
        k8s_objects(c, docs, rel(K8S))

    with Check("kubernetes kustomization lists every manifest") as c:
        k = check_kustomization_file(c, K8S, files)
        images = [i["name"] for i in k.get("images", [])]
        for d in docs:
            for ctr in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                c.expect(ctr["image"] in images or ":" in ctr["image"],
                         f"container {ctr['name']} image {ctr['image']} has neither a tag nor a kustomize images: entry")

    variants = [("kubernetes", K8S), ("kubernetes-scale-out", K8S_SCALE)]
    rendered = {}
    for name, directory in variants:
        if name != "kubernetes":
            extra = sorted(p for p in directory.glob("*.y*ml") if p.name != "kustomization.yaml")
            with Check(f"{name} kustomization lists every file") as c:
                check_kustomization_file(c, directory, extra)
                for f in extra:
                    for d in load_yaml_docs(f):
                        if isinstance(d, dict) and d.get("$patch") != "delete" and "kind" in d:
                            validate_objects(c, [d], rel(f))
        with Check(f"{name} renders valid objects (built-in renderer; kubectl kustomize agrees where installed)") as c:
            docs_ = kustomize_builtin(directory)
            objs = k8s_objects(c, docs_, f"{name} rendered")
            rendered[name] = objs
            kubectl = shutil.which("kubectl")
            if kubectl:
                r = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
                if c.expect(r.returncode == 0, f"kubectl kustomize failed: {r.stderr.strip()}"):
                    theirs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(r.stdout) if d}
                    c.expect(set(theirs) == set(objs), f"kubectl renders {sorted(theirs)}, the built-in renderer "
                                                       f"{sorted(objs)}")
                    for key in set(theirs) & set(objs):
                        c.expect(json.dumps(theirs[key], sort_keys=True) == json.dumps(objs[key], sort_keys=True),
                                 f"{key[0]}/{key[1]}: kubectl kustomize renders it differently than the built-in "
                                 "renderer (a kustomize feature it does not know?)")
            else:
                print("     (kubectl not installed: built-in renderer only)")
    objects = rendered.get("kubernetes", {})
    for name, _ in variants:
        if name in rendered:
            check_variant(name, rendered[name], scale_out=(name != "kubernetes"))
    return objects


def check_variant(name, objects, scale_out):
    dep = objects.get(("Deployment", "satellite"))
    hpas = [d for (k, _), d in objects.items() if k == "HorizontalPodAutoscaler"]
    hpa = hpas[0] if hpas else None
    with Check(f"{name} Deployment is production-ready" + (" (PostgreSQL, several replicas)" if scale_out
                                                            else " (SQLite, one replica)")) as c:
        if not c.expect(dep is not None, "no Deployment/satellite"):
            return
        spec = dep["spec"]
        pod = spec["template"]["spec"]
        ctr = next((x for x in pod["containers"] if x["name"] == "satellite"), pod["containers"][0])
        env = {}
        for ref in ctr.get("envFrom", []):
            if "configMapRef" in ref:
                cm = objects.get(("ConfigMap", ref["configMapRef"]["name"]))
                if c.expect(cm is not None or ref["configMapRef"].get("optional"),
                            f"envFrom ConfigMap {ref['configMapRef']['name']} is not defined"):
                    env.update((cm or {}).get("data", {}))
            if "secretRef" in ref:
                c.expect(("Secret", ref["secretRef"]["name"]) in objects or ref["secretRef"].get("optional"),
                         f"envFrom Secret {ref['secretRef']['name']} is not defined")
        env.update({e["name"]: e.get("value") for e in ctr.get("env", []) if "value" in e})
        from_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in ctr.get("env", [])
                       if "secretKeyRef" in e.get("valueFrom", {})}
        for var, ref in from_secret.items():
            secret = objects.get(("Secret", ref["name"]))
            if ref.get("optional"):
                continue
            if c.expect(secret is not None, f"env {var}: Secret {ref['name']} is not defined"):
                c.expect(ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})},
                         f"env {var}: Secret {ref['name']} has no key {ref['key']}")
        for (kind, cm_name), d in objects.items():
            if kind == "ConfigMap":
                c.expect("DATABASE_URL" not in d.get("data", {}),
                         f"ConfigMap {cm_name} sets DATABASE_URL; it holds a password and goes in a Secret")

        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])}
        data_dir = env.get("SATELLITE_DATA_DIR", "/var/lib/satellite")
        dm = mounts.get(data_dir)
        data_volume = volumes.get(dm["name"], {}) if dm else {}
        pre_stop = ctr.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        if scale_out:
            ref = from_secret.get("DATABASE_URL")
            if c.expect(ref is not None and not ref.get("optional"),
                        "DATABASE_URL is not taken from a Secret (env valueFrom.secretKeyRef, not optional): without "
                        "it every replica would run on a SQLite file of its own"):
                secret = objects.get(("Secret", ref["name"]), {})
                url = {**secret.get("data", {}), **secret.get("stringData", {})}.get(ref["key"], "")
                c.expect(str(url).startswith(("postgres://", "postgresql://")) and is_placeholder(url),
                         f"Secret {ref['name']} {ref['key']} should be a postgres:// placeholder (with <password>)")
            c.expect(hpa is not None, "no HorizontalPodAutoscaler")
            floor = hpa["spec"].get("minReplicas", 1) if hpa else spec.get("replicas", 1)
            if "replicas" in spec and hpa:
                c.expect(hpa["spec"].get("minReplicas", 1) <= spec["replicas"] <= hpa["spec"]["maxReplicas"],
                         f"replicas {spec['replicas']} is outside the HPA's range")
            strategy = spec.get("strategy", {})
            c.expect(strategy.get("type", "RollingUpdate") == "RollingUpdate", "strategy is not RollingUpdate")
            ru = strategy.get("rollingUpdate", {})
            c.expect(scaled(ru.get("maxUnavailable", "25%"), floor, False) < floor,
                     "rollingUpdate.maxUnavailable would take every replica down at once")
            c.expect(not [v for v in volumes.values() if "persistentVolumeClaim" in v],
                     "a PersistentVolumeClaim volume: replicas share PostgreSQL, not a volume")
            c.expect(not [k for (k, _) in objects if k == "PersistentVolumeClaim"], "a PersistentVolumeClaim is left")
            if c.expect("emptyDir" in data_volume, f"SATELLITE_DATA_DIR {data_dir} is not an emptyDir (caches)"):
                size = data_volume["emptyDir"].get("sizeLimit")
                if c.expect(size, "the data emptyDir has no sizeLimit"):
                    limit = ctr.get("resources", {}).get("limits", {}).get("ephemeral-storage")
                    c.expect(limit and quantity(limit) > quantity(size),
                             f"limits.ephemeral-storage {limit} does not leave room for the data emptyDir ({size})")
        else:
            c.expect(spec.get("replicas") == 1, "replicas must be 1 (SQLite on a ReadWriteOnce volume)")
            c.expect(spec.get("strategy", {}).get("type") == "Recreate",
                     "strategy must be Recreate (two pods cannot share the SQLite volume during a rollout)")
            c.expect(hpa is None, "a HorizontalPodAutoscaler on a single SQLite replica")
            c.expect(not env.get("DATABASE_URL") and "DATABASE_URL" not in from_secret,
                     "DATABASE_URL is set: that is the scale-out setup (kubernetes-scale-out)")
            c.expect("persistentVolumeClaim" in data_volume, f"SATELLITE_DATA_DIR {data_dir} is not a PVC mount")
            for v in volumes.values():
                if "persistentVolumeClaim" in v:
                    claim = v["persistentVolumeClaim"]["claimName"]
                    pvc = objects.get(("PersistentVolumeClaim", claim))
                    if c.expect(pvc is not None, f"PVC {claim} is not defined"):
                        c.expect(pvc["spec"].get("accessModes") in (["ReadWriteOnce"], ["ReadWriteOncePod"]),
                                 f"PVC {claim} should be ReadWriteOnce(Pod): one SQLite writer")
        drain = int(env.get("SATELLITE_DRAIN_SECONDS", DEFAULT_DRAIN))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        need = max(45, pre_stop + drain + STOP_AFTER_DRAIN + 10)
        c.expect(grace >= need, f"terminationGracePeriodSeconds {grace} < max(45, preStop {pre_stop} + drain {drain} "
                                f"+ {STOP_AFTER_DRAIN} + 10)")
        c.expect(pod.get("enableServiceLinks") is False,
                 "enableServiceLinks must be false (a Service named satellite injects SATELLITE_* variables)")
        psc, csc = pod.get("securityContext", {}), ctr.get("securityContext", {})
        c.expect(psc.get("runAsNonRoot") is True or csc.get("runAsNonRoot") is True, "runAsNonRoot is not set")
        c.expect((csc.get("runAsUser") or psc.get("runAsUser") or 0) != 0, "runAsUser is missing or 0")
        c.expect(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not set")
        c.expect(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
        c.expect("ALL" in csc.get("capabilities", {}).get("drop", []), "capabilities are not dropped")
        res = ctr.get("resources", {})
        for part in ("requests", "limits"):
            for what in ("cpu", "memory"):
                c.expect(what in res.get(part, {}), f"resources.{part}.{what} is missing")
        port_names = {p.get("name"): p["containerPort"] for p in ctr.get("ports", [])}
        c.expect(str(port_names.get("http")) == str(env.get("PORT", "3001")),
                 f"container port http {port_names.get('http')} is not PORT {env.get('PORT', '3001')}")

        def probe(kind, paths):
            p = ctr.get(kind)
            if c.expect(p and "httpGet" in p, f"{kind} is missing or not httpGet"):
                c.expect(p["httpGet"].get("path") in paths, f"{kind} path {p['httpGet'].get('path')} not in {paths}")
                port = p["httpGet"].get("port")
                c.expect(port in port_names or str(port) == str(env.get("PORT", "3001")),
                         f"{kind} port {port} is not the container's")
        probe("readinessProbe", ["/readyz"])
        probe("livenessProbe", ["/healthz"])
        if "startupProbe" in ctr:
            probe("startupProbe", ["/healthz", "/readyz"])

        for m in mounts.values():
            c.expect(m["name"] in volumes, f"volumeMount {m['name']} has no volume")
        for v in volumes.values():
            if "configMap" in v:
                c.expect(("ConfigMap", v["configMap"]["name"]) in objects, f"ConfigMap {v['configMap']['name']} missing")
            if "secret" in v:
                c.expect(("Secret", v["secret"]["secretName"]) in objects or v["secret"].get("optional"),
                         f"Secret {v['secret']['secretName']} missing")
        tm = mounts.get("/tmp")
        c.expect(tm is not None and "emptyDir" in volumes.get(tm["name"], {}), "/tmp is not an emptyDir")
        for k in ("HOME", "DEPLOYSTACK_PERSISTENT_DATA_DIR"):
            if k in env:
                c.expect(str(env[k]).startswith(data_dir.rstrip("/") + "/") or env[k] == data_dir,
                         f"{k}={env[k]} is not on the data volume (read-only root)")
        c.expect(env.get("DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE") == "false", "the debug route is not off")
        for var in SECRET_VARS:
            c.expect(not env.get(var), f"{var} is set in a ConfigMap or the pod spec; secrets go in a Secret")
        config = env.get("SATELLITE_CONFIG")
        c.expect(not (config and env.get("DEPLOYSTACK_BACKEND_URL")), "SATELLITE_CONFIG and DEPLOYSTACK_BACKEND_URL both set")
        if config:
            d = os.path.dirname(config)
            m = mounts.get(d)
            if c.expect(m is not None, f"SATELLITE_CONFIG {config}: no volume mounted at {d}"):
                c.expect("subPath" not in m, "the config mount uses subPath: ConfigMap edits would never reach the pod")
                v = volumes.get(m["name"], {})
                src = v.get("configMap", {}).get("name") or v.get("secret", {}).get("secretName")
                kind = "ConfigMap" if "configMap" in v else "Secret"
                obj = objects.get((kind, src), {})
                c.expect(os.path.basename(config) in {**obj.get("data", {}), **obj.get("stringData", {})},
                         f"{kind} {src} has no key {os.path.basename(config)}")

    if scale_out:
        with Check(f"{name} HorizontalPodAutoscaler fits the Deployment and the database") as c:
            hs = hpa["spec"] if c.expect(len(hpas) == 1, f"{len(hpas)} HorizontalPodAutoscalers, want 1") else {}
            if not hs:
                hs = {"scaleTargetRef": {"kind": "?", "name": "?"}, "maxReplicas": 0}
            ref = hs["scaleTargetRef"]
            c.expect((ref.get("apiVersion"), ref["kind"], ref["name"]) == ("apps/v1", "Deployment", "satellite"),
                     f"scaleTargetRef {ref} is not apps/v1 Deployment/satellite")
            lo, hi = hs.get("minReplicas", 1), hs["maxReplicas"]
            c.expect(lo >= 2, f"minReplicas {lo}: fewer than 2 leaves nothing serving when one replica fails")
            c.expect(hi >= lo, f"maxReplicas {hi} < minReplicas {lo}")
            metrics = hs.get("metrics", [])
            c.expect(metrics, "no metrics (the default, 80% CPU, is implicit; say it)")
            requests = ctr.get("resources", {}).get("requests", {})
            for m in metrics:
                if m["type"] == "Resource" and m["resource"]["target"]["type"] == "Utilization":
                    c.expect(m["resource"]["name"] in requests,
                             f"{m['resource']['name']} utilization without a request for it in the container")
            down = hs.get("behavior", {}).get("scaleDown", {})
            c.expect(down.get("stabilizationWindowSeconds", 300) >= 300,
                     "scaleDown stabilization under 300 s: every scale-down ends a replica's sessions and servers")
            pool = int(env.get("SATELLITE_DATABASE_MAX_CONNECTIONS", 8))
            # PostgreSQL's default max_connections (100) less its 3 superuser_reserved_connections; +1 per replica
            # for the leader lock's dedicated connection.
            c.expect(hi * (pool + 1) <= 97, f"maxReplicas {hi} x (pool {pool} + 1) = {hi * (pool + 1)} connections "
                                            "exceed PostgreSQL's default max_connections (100, 3 reserved)")

    with Check(f"{name} Service, PodDisruptionBudget and ServiceMonitor select the pod") as c:
        pod_labels = dep["spec"]["template"]["metadata"].get("labels", {})
        sel = dep["spec"]["selector"].get("matchLabels", {})
        c.expect(all(pod_labels.get(k) == v for k, v in sel.items()), "the Deployment selector misses its own pods")
        for tsc in dep["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            ml = tsc.get("labelSelector", {}).get("matchLabels", {})
            c.expect(ml and all(pod_labels.get(k) == v for k, v in ml.items()),
                     "a topologySpreadConstraint selects other pods than the Deployment's")
        svc = objects.get(("Service", "satellite"))
        if c.expect(svc is not None, "no Service/satellite"):
            c.expect(svc["spec"]["selector"] and all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
                     "the Service selector does not match the pod labels")
            ctr_ports = {p.get("name") for c_ in dep["spec"]["template"]["spec"]["containers"] for p in c_.get("ports", [])}
            for p in svc["spec"]["ports"]:
                c.expect(p.get("targetPort") in ctr_ports or isinstance(p.get("targetPort"), int),
                         f"Service targetPort {p.get('targetPort')} is not a container port name")
            if scale_out:
                c.expect(svc["spec"].get("sessionAffinity") == "ClientIP",
                         "the Service has no ClientIP affinity: in-cluster clients' sessions would be spread")
        floor = (hpa["spec"].get("minReplicas", 1) if hpa else dep["spec"].get("replicas", 1))
        pdbs = [d for (k, _), d in objects.items() if k == "PodDisruptionBudget"]
        c.expect(pdbs, "no PodDisruptionBudget")
        for pdb in pdbs:
            ml = pdb["spec"]["selector"].get("matchLabels", {})
            c.expect(ml and all(pod_labels.get(k) == v for k, v in ml.items()), "the PDB selector misses the pod")
            if "minAvailable" in pdb["spec"]:
                keep = scaled(pdb["spec"]["minAvailable"], floor, True)
            else:
                keep = floor - scaled(pdb["spec"].get("maxUnavailable", 1), floor, True)
            c.expect(floor - keep >= 1, f"the PDB allows no disruption at {floor} replica(s): every node drain would "
                                        "block (see poddisruptionbudget.yaml)")
            if scale_out:
                c.expect(keep >= 1, f"the PDB lets a drain take all {floor} replicas at once")
        sms = [d for (k, _), d in objects.items() if k == "ServiceMonitor"]
        c.expect(sms, "no ServiceMonitor")
        for sm in sms:
            ml = sm["spec"]["selector"].get("matchLabels", {})
            if svc:
                c.expect(ml and all(svc["metadata"].get("labels", {}).get(k) == v for k, v in ml.items()),
                         "the ServiceMonitor selector does not match the Service's labels")
                names = {p.get("name") for p in svc["spec"]["ports"]}
                for ep in sm["spec"]["endpoints"]:
                    c.expect(ep.get("port") in names, f"ServiceMonitor port {ep.get('port')} is not a Service port name")
                    c.expect(ep.get("path") == "/metrics", f"ServiceMonitor path {ep.get('path')} is not /metrics")
                    if "interval" in ep and "scrapeTimeout" in ep:
                        c.expect(seconds(ep["scrapeTimeout"]) <= seconds(ep["interval"]), "scrapeTimeout > interval")

    with Check(f"{name} Secrets hold placeholders only; ConfigMap config has no known token hash") as c:
        for (kind, obj_name), d in objects.items():
            if kind == "Secret":
                for k, v in {**d.get("stringData", {}), **d.get("data", {})}.items():
                    c.expect(is_placeholder(v), f"Secret {obj_name} key {k} has a value; ship placeholders only")
            if kind == "ConfigMap":
                for k, v in d.get("data", {}).items():
                    if k.endswith(".toml"):
                        check_toml_placeholders(c, v, f"ConfigMap {obj_name} {k}")


# ---------------------------------------------------------------------------------------------------------
# Compose
# ---------------------------------------------------------------------------------------------------------
def interpolate(value, env):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, $$ (defaults only, env as given)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1) or m.group(4), m.group(2), m.group(3)
        val = env.get(name)
        if op in (":-", "-"):
            return arg if (val is None or (op == ":-" and val == "")) else val
        if op in (":?", "?"):
            if val is None or (op == ":?" and val == ""):
                raise ValueError(f"${{{name}}} is required: {arg}")
            return val
        if op in (":+", "+"):
            return arg if val else ""
        return val or ""
    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, value)


def compose_service_env(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return env


def satellite_services(doc):
    """The services that run the satellite image (built from deploy/Dockerfile)."""
    out = {}
    for name, svc in (doc.get("services") or {}).items():
        build = svc.get("build", {})
        if isinstance(build, dict) and str(build.get("dockerfile", "")).endswith("deploy/Dockerfile"):
            out[name] = svc
    return out


def check_satellite_service(c, path, doc, svc, publishes):
    env = compose_service_env(svc)
    build = svc.get("build", {})
    if isinstance(build, dict):
        ctx = (path.parent / build.get("context", ".")).resolve()
        c.expect(ctx == ROOT, f"build.context is {ctx}, not the repository root")
        c.expect((ctx / build.get("dockerfile", "Dockerfile")).resolve() == (DEPLOY / "Dockerfile").resolve(),
                 "build.dockerfile is not deploy/Dockerfile")
    data_dir = env.get("SATELLITE_DATA_DIR", "/var/lib/satellite")
    named = set((doc.get("volumes") or {}).keys())
    targets = {}
    for v in svc.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            v = {"type": "volume" if not parts[0].startswith((".", "/", "~")) else "bind",
                 "source": parts[0], "target": parts[1], "read_only": len(parts) > 2 and "ro" in parts[2]}
        targets[v["target"]] = v
    dv = targets.get(data_dir)
    c.expect(dv is not None and dv.get("type", "volume") == "volume" and dv["source"] in named,
             f"{data_dir} is not a named volume declared under volumes:")
    config = env.get("SATELLITE_CONFIG")
    if config:
        cv = targets.get(config)
        if c.expect(cv is not None, f"SATELLITE_CONFIG {config} is not mounted"):
            src = (path.parent / cv["source"]).resolve()
            c.expect(src.is_file(), f"config mount source {cv['source']} (with defaults) does not exist")
            c.expect(cv.get("read_only") is True, "the config mount is not read-only")
    c.expect(not (config and env.get("DEPLOYSTACK_BACKEND_URL")), "SATELLITE_CONFIG and DEPLOYSTACK_BACKEND_URL both set")
    c.expect(str(env.get("DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE", "")).lower() == "false", "the debug route is not off")
    for var in SECRET_VARS:
        c.expect(var not in env, f"{var} is set in {path.name}; secrets go in an env file")
    hc = svc.get("healthcheck", {})
    test = hc.get("test", [])
    test = " ".join(test) if isinstance(test, list) else str(test)
    c.expect(re.search(r"/(readyz|healthz)\b", test), "healthcheck probes neither /readyz nor /healthz")
    drain = float(env.get("SATELLITE_DRAIN_SECONDS", DEFAULT_DRAIN))
    grace = seconds(svc.get("stop_grace_period", "10s"))
    c.expect(grace > drain + STOP_AFTER_DRAIN, f"stop_grace_period {grace:g}s is not above drain {drain:g}s + {STOP_AFTER_DRAIN}s")
    c.expect(svc.get("stop_signal", "SIGTERM") == "SIGTERM", "stop_signal is not SIGTERM")
    for key in ("interval", "timeout", "start_period", "start_interval"):
        if key in hc:
            try:
                seconds(hc[key])
            except ValueError as e:
                c.fail(f"healthcheck.{key}: {e}")
    c.expect(str(hc.get("retries", 3)).isdigit(), f"healthcheck.retries {hc.get('retries')!r} is not a number")
    nofile = svc.get("ulimits", {}).get("nofile")
    soft = nofile.get("soft") if isinstance(nofile, dict) else nofile
    c.expect(soft and int(soft) >= 4096, "ulimits.nofile is missing or below 4096")
    ports = [str(p if not isinstance(p, dict) else p.get("target")) for p in svc.get("ports", [])]
    if publishes:
        c.expect(any(p.split(":")[-1].split("/")[0] == str(env.get("PORT", "3001")) for p in ports),
                 "no published port reaches the container's PORT")
    else:
        c.expect(not ports, "a replica publishes a port; clients go through the proxy")
    if svc.get("read_only"):
        tmpfs = svc.get("tmpfs", [])
        tmpfs = [tmpfs] if isinstance(tmpfs, str) else tmpfs
        c.expect(any(t.split(":")[0] == "/tmp" for t in tmpfs), "read_only without a tmpfs on /tmp")
    return env


def load_compose(c, path):
    raw = yaml.safe_load(path.read_text())
    doc = interpolate(raw, {})
    from importlib.resources import files
    schema = json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        c.fail(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}")
    return doc


def check_compose():
    path = DEPLOY / "compose.yaml"
    with Check("compose.yaml matches the Compose Specification schema") as c:
        doc = load_compose(c, path)
    if not c.problems:
        with Check("compose.yaml satellite service is production-ready") as c:
            svc = doc.get("services", {}).get("satellite")
            if c.expect(svc is not None, "no services.satellite"):
                env = check_satellite_service(c, path, doc, svc, publishes=True)
                c.expect("DATABASE_URL" not in env, "compose.yaml is the SQLite setup; PostgreSQL is compose.scale-out.yaml")
    check_compose_scale_out()


def nginx_directives(text):
    """(context path, directive, args) of an nginx config: comments dropped, blocks nested."""
    out, stack = [], []
    tokens = re.findall(r'"[^"]*"|\'[^\']*\'|[{};]|[^\s{};]+', re.sub(r"#[^\n]*", "", text))
    current = []
    for tok in tokens:
        if tok == "{":
            stack.append(" ".join(current))
            current = []
        elif tok == "}":
            stack.pop()
        elif tok == ";":
            if current:
                out.append((tuple(stack), current[0], current[1:]))
            current = []
        else:
            current.append(tok)
    return out


def check_compose_scale_out():
    path = DEPLOY / "compose.scale-out.yaml"
    with Check("compose.scale-out.yaml matches the Compose Specification schema") as c:
        doc = load_compose(c, path)
    if c.problems:
        return
    services = doc.get("services", {})
    sats = satellite_services(doc)
    ignored_here = []
    gi = DEPLOY / ".gitignore"
    if gi.exists():
        ignored_here = [l.strip().lstrip("/") for l in gi.read_text().splitlines() if l.strip() and not l.startswith("#")]
    with Check("compose.scale-out.yaml replicas are production-ready and share PostgreSQL") as c:
        c.expect(len(sats) >= 2, f"{len(sats)} satellite service(s); the scale-out runs at least 2")
        data_volumes = []
        for name, svc in sats.items():
            sub = Check(name)
            env = check_satellite_service(sub, path, doc, svc, publishes=False)
            for p in sub.problems:
                c.fail(f"{name}: {p}")
            c.expect(svc.get("depends_on", {}).get("postgres", {}).get("condition") == "service_healthy",
                     f"{name} does not wait for postgres to be healthy")
            env_files = [e if isinstance(e, dict) else {"path": e} for e in svc.get("env_file", [])]
            required = [e["path"] for e in env_files if e.get("required", True)]
            c.expect(required, f"{name}: no required env_file for DATABASE_URL")
            for e in env_files:
                c.expect(os.path.normpath(e["path"]) in ignored_here,
                         f"{name}: env_file {e['path']} is not in deploy/.gitignore (it holds secrets)")
            data_dir = env.get("SATELLITE_DATA_DIR", "/var/lib/satellite")
            data_volumes += [v.get("source") if isinstance(v, dict) else v.split(":")[0]
                             for v in svc.get("volumes", [])
                             if (v.get("target") if isinstance(v, dict) else v.split(":")[1]) == data_dir]
            pool = env.get("SATELLITE_DATABASE_MAX_CONNECTIONS")
            c.expect(pool is None or str(pool).isdigit(), f"{name}: SATELLITE_DATABASE_MAX_CONNECTIONS {pool!r}")
        c.expect(len(set(data_volumes)) == len(data_volumes), f"replicas share a data volume: {data_volumes}")

    with Check("compose.scale-out.yaml PostgreSQL: pinned, health-checked, password from a file, not published") as c:
        pg = services.get("postgres")
        if c.expect(pg is not None, "no services.postgres"):
            image = pg.get("image", "")
            c.expect(re.fullmatch(r"(docker\.io/library/)?postgres:\d+(\.\d+)?(-alpine|-bookworm|-trixie)?(@sha256:[0-9a-f]{64})?",
                                  image), f"postgres image {image!r} is not pinned to a major version")
            env = compose_service_env(pg)
            c.expect("POSTGRES_PASSWORD" not in env, "POSTGRES_PASSWORD is inline; it goes in postgres.env")
            c.expect(env.get("POSTGRES_HOST_AUTH_METHOD", "scram-sha-256") not in ("trust", "password", "md5"),
                     f"POSTGRES_HOST_AUTH_METHOD {env.get('POSTGRES_HOST_AUTH_METHOD')}")
            c.expect(pg.get("env_file") or "POSTGRES_PASSWORD_FILE" in env, "no env_file or secret for the password")
            for e in pg.get("env_file", []):
                p = e["path"] if isinstance(e, dict) else e
                c.expect(os.path.normpath(p) in ignored_here, f"env_file {p} is not in deploy/.gitignore")
            test = pg.get("healthcheck", {}).get("test", [])
            test = " ".join(test) if isinstance(test, list) else str(test)
            c.expect("pg_isready" in test, "the healthcheck does not run pg_isready")
            c.expect(not pg.get("ports"), "PostgreSQL is published; only the replicas need it")
            c.expect(any(str(v.get("target") if isinstance(v, dict) else v.split(":")[1]).startswith("/var/lib/postgresql")
                         for v in pg.get("volumes", [])), "PostgreSQL's data directory is not on a volume")

    with Check("compose.scale-out.yaml proxy: nginx over every replica, affinity by caller, SSE passed through") as c:
        proxies = {n: s for n, s in services.items() if str(s.get("image", "")).split(":")[0].endswith("nginx")}
        if not c.expect(len(proxies) == 1, f"{len(proxies)} nginx services, want 1"):
            return
        pname, proxy = next(iter(proxies.items()))
        c.expect(re.fullmatch(r"nginx:\d+\.\d+(\.\d+)?(-alpine)?", proxy["image"]), f"{proxy['image']} is not pinned")
        c.expect(proxy.get("ports"), "the proxy publishes no port")
        deps = proxy.get("depends_on", {})
        c.expect(set(sats) <= set(deps), f"the proxy does not depend on every replica ({sorted(sats)})")
        mounts = [v for v in proxy.get("volumes", []) if isinstance(v, dict) and v.get("type") == "bind"]
        conf = next((m for m in mounts if str(m["target"]).startswith("/etc/nginx/")), None)
        if not c.expect(conf is not None and conf.get("read_only") is True, "no read-only nginx config mount"):
            return
        conf_path = (path.parent / conf["source"]).resolve()
        if not c.expect(conf_path.is_file(), f"{conf['source']} does not exist"):
            return
        text = conf_path.read_text()
        ds = nginx_directives(text)
        upstreams = {ctx[-1].split()[1] for ctx, _, _ in ds if ctx and ctx[-1].startswith("upstream ")}
        c.expect(len(upstreams) == 1, f"upstream blocks: {sorted(upstreams)}")
        up = next(iter(upstreams), "")
        in_up = [(d, a) for ctx, d, a in ds if ctx and ctx[-1] == f"upstream {up}"]
        servers = {a[0] for d, a in in_up if d == "server"}
        want = {f"{n}:{compose_service_env(s).get('PORT', '3001')}" for n, s in sats.items()}
        c.expect(servers == want, f"upstream servers {sorted(servers)} are not the replicas {sorted(want)}")
        hashes = [a for d, a in in_up if d == "hash"]
        if c.expect(hashes, "no `hash ... consistent` in the upstream: a caller's sessions would be spread"):
            key = hashes[0][0]
            c.expect("consistent" in hashes[0][1:], "hash without `consistent`: a replica added or lost moves every caller")
            c.expect(not re.search(r"mcp_session_id|arg_session", key, re.I),
                     f"hash {key}: a session id is made up by the replica that answers initialize, so its hash "
                     "picks a replica regardless of which one holds the session; hash a key every request of the "
                     "session carries from the start ($http_authorization)")
            c.expect(key in ("$http_authorization", "$remote_addr", "$binary_remote_addr"),
                     f"hash {key} is not the caller's token or address")
        ka = [a for d, a in in_up if d == "keepalive_timeout"]
        if [a for d, a in in_up if d == "keepalive"]:
            c.expect(ka and seconds(ka[0][0]) < 10,
                     "upstream keepalive without keepalive_timeout under the satellite's 10 s idle close")
        loc = {d: a for ctx, d, a in ds if ctx and ctx[-1].startswith("location")}
        c.expect(loc.get("proxy_pass") == [f"http://{up}"], f"proxy_pass is {loc.get('proxy_pass')}, not http://{up}")
        c.expect(loc.get("proxy_buffering") == ["off"], "proxy_buffering is not off (SSE answers would be held)")
        c.expect(loc.get("proxy_http_version") == ["1.1"], "proxy_http_version is not 1.1")
        c.expect(loc.get("proxy_read_timeout") and seconds(loc["proxy_read_timeout"][0]) >= 300,
                 "proxy_read_timeout under 300 s would cut quiet SSE streams")
        nu = loc.get("proxy_next_upstream", [])
        c.expect("non_idempotent" not in nu, "proxy_next_upstream non_idempotent could send a tool call twice")
        body = [a for ctx, d, a in ds if d == "client_max_body_size"]
        c.expect(body and quantity(body[0][0].upper().replace("M", "Mi").replace("K", "Ki")) > 4 * 2**20,
                 "client_max_body_size is not above the satellite's 4 MiB")

    with Check("compose.scale-out.yaml nginx config passes nginx -t") as c:
        nginx = shutil.which("nginx")
        if nginx is None:
            c.skip("nginx not installed (optional)")
            return
        with tempfile.TemporaryDirectory() as tmp:
            # The replicas' names do not resolve here: the same config with 127.0.0.1 in their place.
            conf_text = text
            for n in sats:
                conf_text = re.sub(rf"\b{re.escape(n)}:", "127.0.0.1:", conf_text)
            (Path(tmp) / "default.conf").write_text(conf_text)
            (Path(tmp) / "nginx.conf").write_text(
                f"pid {tmp}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n  access_log off;\n"
                f"  client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n"
                f"  include {tmp}/default.conf;\n}}\n")
            r = subprocess.run([nginx, "-e", "stderr", "-t", "-q", "-p", tmp, "-c", f"{tmp}/nginx.conf"], capture_output=True,
                               text=True, timeout=60)
            c.expect(r.returncode == 0, f"nginx -t (exit {r.returncode}): {(r.stdout + r.stderr).strip()}")


# ---------------------------------------------------------------------------------------------------------
# systemd
# ---------------------------------------------------------------------------------------------------------
def unit_settings(text):
    settings = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        settings.setdefault((section, k.strip()), []).append(v.strip())
    return settings


def check_systemd():
    path = DEPLOY / "satellite.service"
    text = path.read_text()
    s = unit_settings(text)
    get = lambda k, sec="Service": (s.get((sec, k)) or [None])[-1]
    env = {}
    for line in s.get(("Service", "Environment"), []):
        for word in shlex.split(line):
            k, _, v = word.partition("=")
            env[k] = v
    with Check("satellite.service keeps the satellite's settings and is hardened") as c:
        c.expect("useradd --system" in text and "/usr/sbin/nologin" in text, "header lacks the useradd command")
        c.expect("systemctl enable" in text, "header lacks the enable command")
        c.expect(get("User") not in (None, "root"), "runs as root")
        c.expect(get("KillSignal") in (None, "SIGTERM"), "KillSignal is not SIGTERM")
        c.expect(get("KillMode") == "control-group", "KillMode is not control-group")
        drain = float(env.get("SATELLITE_DRAIN_SECONDS", DEFAULT_DRAIN))
        c.expect(get("TimeoutStopSec") and seconds(get("TimeoutStopSec")) > drain + STOP_AFTER_DRAIN,
                 f"TimeoutStopSec is not above drain {drain:g}s + {STOP_AFTER_DRAIN}s")
        c.expect(get("LimitNOFILE") and int(get("LimitNOFILE")) >= 4096, "LimitNOFILE is missing or low")
        c.expect(get("StateDirectory") == "satellite", "StateDirectory=satellite is missing")
        c.expect(env.get("SATELLITE_DATA_DIR") == "/var/lib/satellite", "SATELLITE_DATA_DIR is not the state directory")
        c.expect(env.get("DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE") == "false", "the debug route is not off")
        for var in SECRET_VARS:
            c.expect(var not in env, f"{var} is set in the unit; secrets go in /etc/satellite/satellite.env")
        exec_start = get("ExecStart") or ""
        c.expect("--config" not in exec_start, "ExecStart passes --config, which rules out managed mode via satellite.env")
        for key, want in (("NoNewPrivileges", "true"), ("ProtectSystem", "strict"), ("ProtectHome", "true"),
                          ("PrivateTmp", "true"), ("ProtectKernelTunables", "true"),
                          ("ProtectKernelModules", "true"), ("RestrictSUIDSGID", "true"),
                          ("LockPersonality", "true"), ("CapabilityBoundingSet", "")):
            c.expect(get(key) == want, f"{key}={want} is missing (have {get(key)!r})")
        c.expect(get("MemoryDenyWriteExecute") in (None, "false", "no"), "MemoryDenyWriteExecute breaks Node's JIT")
        if get("Delegate") and "cpu" in get("Delegate"):
            c.expect(get("ProtectControlGroups") in (None, "false", "no"),
                     "ProtectControlGroups makes the delegated cgroup read-only (Delegate=cpu would do nothing)")
        c.expect(get("ProcSubset") in (None, "all"), "ProcSubset=pid hides /proc/meminfo, which the satellite reads")

    with Check("satellite.service passes systemd-analyze verify") as c:
        tool = shutil.which("systemd-analyze")
        if tool is None:
            c.skip("systemd-analyze not installed")
            return
        binary = Path(SATELLITE_BIN).resolve() if SATELLITE_BIN else Path(shutil.which("true") or "/bin/true")
        with tempfile.TemporaryDirectory() as tmp:
            unit = Path(tmp) / "satellite.service"
            # The binary is not installed here: point ExecStart at an executable so only the unit is judged.
            unit.write_text(text.replace("/usr/local/bin/satellite", str(binary)))
            r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=120)
            out = (r.stdout + r.stderr).strip()
            # Messages about other units of this machine are not ours.
            ours = [l for l in out.splitlines() if "satellite.service" in l or str(unit) in l]
            c.expect(r.returncode == 0 and not ours, f"systemd-analyze verify (exit {r.returncode}):\n{out}")


# ---------------------------------------------------------------------------------------------------------
# Configuration files through the binary
# ---------------------------------------------------------------------------------------------------------
def check_configs(objects):
    example = DEPLOY / "satellite.example.toml"
    with Check("example configs have placeholder hashes and no token-shaped secrets") as c:
        check_toml_placeholders(c, example.read_text(), rel(example))
        for f in sorted(DEPLOY.rglob("*")):
            if f.is_file():
                text = f.read_text(errors="replace")
                for rx, what in SECRET_PATTERNS:
                    for m in rx.finditer(text):
                        c.fail(f"{rel(f)}: {what}: {m.group(0)[:16]}...")

    cm_env = dict((objects or {}).get(("ConfigMap", "satellite-env"), {}).get("data", {}))
    cm_toml = (objects or {}).get(("ConfigMap", "satellite-config"), {}).get("data", {}).get("satellite.toml")
    try:
        compose = interpolate(yaml.safe_load((DEPLOY / "compose.yaml").read_text()), {})
        compose_env = compose["services"]["satellite"].get("environment") or {}
    except (yaml.YAMLError, KeyError, TypeError, AttributeError):
        compose_env = {}  # compose.yaml's own checks report it
    unit_env = {}
    for line in unit_settings((DEPLOY / "satellite.service").read_text()).get(("Service", "Environment"), []):
        for word in shlex.split(line):
            k, _, v = word.partition("=")
            unit_env[k] = v
    try:
        scale = interpolate(yaml.safe_load((DEPLOY / "compose.scale-out.yaml").read_text()), {})
        scale_env = compose_service_env(next(iter(satellite_services(scale).values())))
    except (yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration):
        scale_env = {}
    # DATABASE_URL is in the replicas' env file, not here: check-config runs these on SQLite.
    cases = [("deploy/satellite.example.toml with compose.yaml's environment", example.read_text(), compose_env),
             ("deploy/satellite.example.toml with compose.scale-out.yaml's replica environment", example.read_text(),
              scale_env),
             ("deploy/satellite.example.toml with satellite.service's environment", example.read_text(), unit_env)]
    if cm_toml is not None:
        cases.append(("kubernetes ConfigMap satellite.toml with satellite-env", cm_toml, cm_env))
    for name, toml_text, env in cases:
        with Check(f"check-config: {name}") as c:
            if not SATELLITE_BIN:
                c.skip("set SATELLITE_BIN to a satellite binary to run it")
                continue
            binary = Path(SATELLITE_BIN)
            if not c.expect(binary.is_file() and os.access(binary, os.X_OK), f"SATELLITE_BIN={SATELLITE_BIN} is not executable"):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                cfg = Path(tmp) / "satellite.toml"
                cfg.write_text(toml_text)
                run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp}
                run_env.update({k: str(v) for k, v in env.items() if v is not None})
                # The deployment's paths do not exist here: the file goes by --config (flags win over the
                # environment), the data directory into the temporary one.
                run_env.pop("SATELLITE_CONFIG", None)
                run_env["SATELLITE_DATA_DIR"] = str(Path(tmp) / "data")
                run_env.pop("DEPLOYSTACK_PERSISTENT_DATA_DIR", None)
                r = subprocess.run([str(binary), "check-config", "--config", str(cfg)], env=run_env,
                                   capture_output=True, text=True, timeout=120)
                if c.expect(r.returncode == 0, f"exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()[-500:]}"):
                    try:
                        shown = json.loads(r.stdout)
                    except json.JSONDecodeError:
                        c.fail("check-config printed no JSON")
                        continue
                    c.expect(shown.get("debug_route") is False, "the debug route would be on")
                    c.expect(shown.get("mode", {}).get("kind") == "standalone", f"mode is {shown.get('mode')}")
                    c.expect(shown.get("desired_state", {}).get("rejected") == [],
                             f"entries rejected: {shown.get('desired_state', {}).get('rejected')}")


def main():
    print(f"validate-deploy: {rel(DEPLOY)} in {ROOT}")
    objects = None
    for name, run in (("Dockerfile", check_dockerfile), ("kubernetes", check_kubernetes),
                      ("compose", check_compose), ("systemd", check_systemd),
                      ("configs", lambda: check_configs(objects))):
        # A file too broken for its section to go on fails that section instead of stopping the run.
        with Check(f"{name}: stopped by an unexpected error", quiet=True):
            result = run()
            if name == "kubernetes":
                objects = result
    if failures:
        print("\nfailed: " + "; ".join(failures))
    print(f"deploy: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if failures else 0


sys.exit(main())
PY
