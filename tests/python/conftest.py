"""Starts a real satellite (the binary cargo built) with a three-team config for the client tests: acme (alice
and bob: the demo server and server-everything over stdio), globex (carol: the demo server) and initech (dave:
server-everything over Streamable HTTP, a remote upstream) and umbrella (erin: the MCP conformance suite's
reference server, a 2026-07-28 upstream that asks through input_required, and the Python SDK's header_server.py,
one whose tool asks for an `Mcp-Param-Region` header). `admin_token` opens the analytics
API and /admin for every team; carol is globex's team admin (reads globex's analytics only)."""
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("SATELLITE_BIN", ROOT / "target" / "debug" / "satellite"))
EVERYTHING = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-server-everything"
REFERENCE = ROOT / "tests" / "conformance" / "upstream"
HEADER_SERVER = ROOT / "tests" / "fixtures" / "header_server.py"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


USERS = ("alice", "bob", "carol", "dave", "erin")
# An instance token opens one instance of one user: one of its own for each instance path.
INSTANCE_PATHS = ("alice-demo", "bob-demo", "alice-everything", "carol-demo", "dave-everything-http",
                  "erin-regional", "erin-reference")


def wait_port(port: int, proc: subprocess.Popen, what: str):
    deadline = time.time() + 30
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert time.time() < deadline and proc.poll() is None, f"{what} did not start"
        time.sleep(0.1)


class Satellite:
    def __init__(self):
        self.tokens = {u: secrets.token_hex(24) for u in USERS}
        self.admin_token = secrets.token_hex(24)
        self.instance_tokens = {p: "ds_inst_" + secrets.token_hex(32) for p in INSTANCE_PATHS}
        self.everything_port = free_port()
        self.everything_sse_port = free_port()
        self.reference_port = free_port()
        self.header_port = free_port()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir = tempfile.TemporaryDirectory()
        assert BIN.exists(), f"{BIN} missing: run cargo build first"
        assert EVERYTHING.exists(), f"{EVERYTHING} missing: run scripts/test.sh (npm ci)"

    def config(self) -> str:
        t, i = self.tokens, self.instance_tokens
        return f"""
[satellite]
debug_route = true
# Short, so a call whose server waits on a client that never answers fails within the test.
call_timeout_seconds = 8

[sandbox]
allowed_commands = [{json.dumps(str(BIN))}, {json.dumps(str(EVERYTHING))}]

[auth]
admin_token_sha256 = ["{sha(self.admin_token)}"]

[[teams]]
id = "acme"
[[teams]]
id = "globex"
[[teams]]
id = "initech"
[[teams]]
id = "umbrella"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{sha(t['alice'])}"]
[[users]]
id = "bob"
teams = ["acme"]
token_sha256 = ["{sha(t['bob'])}"]
[[users]]
id = "carol"
teams = ["globex"]
token_sha256 = ["{sha(t['carol'])}"]
role = "admin"
[[users]]
id = "dave"
teams = ["initech"]
token_sha256 = ["{sha(t['dave'])}"]
[[users]]
id = "erin"
teams = ["umbrella"]
token_sha256 = ["{sha(t['erin'])}"]

[[servers]]
slug = "demo"
transport = "stdio"
command = {json.dumps(str(BIN))}
args = ["demo-server"]
[[servers]]
slug = "everything"
transport = "stdio"
command = {json.dumps(str(EVERYTHING))}
args = ["stdio"]

[[servers]]
slug = "everything-http"
transport = "http"
url = "http://127.0.0.1:{self.everything_port}/mcp"

[[servers]]
slug = "everything-sse"
transport = "sse"
url = "http://127.0.0.1:{self.everything_sse_port}/sse"

[[servers]]
slug = "reference"
transport = "http"
url = "http://127.0.0.1:{self.reference_port}/mcp"

[[servers]]
slug = "regional"
transport = "http"
url = "http://127.0.0.1:{self.header_port}/mcp"

[[installations]]
id = "regional-umbrella"
team = "umbrella"
server = "regional"
[installations.users.erin]
instance_path = "erin-regional"
instance_token_sha256 = "{sha(i['erin-regional'])}"

[[installations]]
id = "reference-umbrella"
team = "umbrella"
server = "reference"
[installations.users.erin]
instance_path = "erin-reference"
instance_token_sha256 = "{sha(i['erin-reference'])}"

[[installations]]
id = "everything-initech"
team = "initech"
server = "everything-http"
[installations.users.dave]
instance_path = "dave-everything-http"
instance_token_sha256 = "{sha(i['dave-everything-http'])}"

[[installations]]
id = "everything-sse-initech"
team = "initech"
server = "everything-sse"
[installations.users.dave]
instance_path = "dave-everything-sse"

[[installations]]
id = "demo-acme"
team = "acme"
server = "demo"
[installations.users.alice]
instance_path = "alice-demo"
instance_token_sha256 = "{sha(i['alice-demo'])}"
[installations.users.bob]
instance_path = "bob-demo"
instance_token_sha256 = "{sha(i['bob-demo'])}"

[[installations]]
id = "everything-acme"
team = "acme"
server = "everything"
[installations.users.alice]
instance_path = "alice-everything"
instance_token_sha256 = "{sha(i['alice-everything'])}"

[[toolsets]]
name = "echoes"
description = "Echo tools only"
team = "acme"
tools = ["*:echo"]

[[installations]]
id = "demo-globex"
team = "globex"
server = "demo"
[installations.users.carol]
instance_path = "carol-demo"
instance_token_sha256 = "{sha(i['carol-demo'])}"
"""

    def start(self):
        self.everything = subprocess.Popen(
            [str(EVERYTHING), "streamableHttp"], env={**os.environ, "PORT": str(self.everything_port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.everything_sse = subprocess.Popen(
            [str(EVERYTHING), "sse"], env={**os.environ, "PORT": str(self.everything_sse_port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        assert (REFERENCE / "node_modules").exists(), f"{REFERENCE}/node_modules missing: run scripts/test.sh (npm ci)"
        self.reference = subprocess.Popen(
            [str(REFERENCE / "node_modules" / ".bin" / "tsx"), "everything-server.ts"], cwd=REFERENCE,
            env={**os.environ, "PORT": str(self.reference_port)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # A 2026-07-28 server whose tool asks for an Mcp-Param-* header (the official Python SDK's MCPServer).
        self.header_server = subprocess.Popen(
            [sys.executable, str(HEADER_SERVER), str(self.header_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.everything_port, self.everything, "server-everything (HTTP)")
        wait_port(self.header_port, self.header_server, "the header server")
        wait_port(self.reference_port, self.reference, "the conformance reference server")
        wait_port(self.everything_sse_port, self.everything_sse, "server-everything (legacy SSE)")
        path = Path(self.dir.name) / "satellite.toml"
        path.write_text(self.config())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SATELLITE_", "DEPLOYSTACK_"))}
        env["SATELLITE_DATA_DIR"] = str(Path(self.dir.name) / "data")
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--config", str(path), "--port", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=open(Path(self.dir.name) / "satellite.log", "w"),
        )
        deadline = time.time() + 90
        while time.time() < deadline:
            assert self.proc.poll() is None, "satellite exited: " + self.log()
            try:
                debug = json.load(urllib.request.urlopen(f"{self.base}/api/status/debug", timeout=2))
                if debug["server_status"]["stats"]["online"] == 9:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("instances did not come online: " + self.log())

    def debug(self) -> dict:
        return json.load(urllib.request.urlopen(f"{self.base}/api/status/debug", timeout=5))

    def log(self) -> str:
        return (Path(self.dir.name) / "satellite.log").read_text()[-4000:]

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=30) == 0, "satellite did not exit cleanly: " + self.log()
        for upstream in (self.everything, self.everything_sse, self.reference, self.header_server):
            upstream.terminate()
            upstream.wait(timeout=10)
        self.dir.cleanup()


@pytest.fixture(scope="session")
def satellite():
    sat = Satellite()
    sat.start()
    yield sat
    sat.stop()


@pytest.fixture
def anyio_backend():
    return "asyncio"
