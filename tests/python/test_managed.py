"""The official MCP Python SDK against a managed satellite: the satellite binary registers with a small fake
backend (stdlib HTTP, the BP subset a managed satellite needs), runs the npm `server-everything` it is
configured with, and authenticates the SDK's bearer token by introspection. The fake answers the way the real
backend does, with only the fields it promises: registration `{success, satellite: {id, name, api_key},
message}`, introspection with `aud: ["deploystack:mcp:satellite"]`, acks without bodies the satellite needs."""
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import BIN, EVERYTHING, free_port

pytestmark = pytest.mark.anyio

API_KEY = "deploystack_satellite_api_global_" + "k" * 32
REGISTRATION = "deploystack_satellite_global_pytest0registration0token"
TOKENS = {
    "alice-token": {"sub": "alice", "team_id": "acme", "aud": ["deploystack:mcp:satellite"]},
    # Issued for another resource server: refused (BP §10, OQ-14).
    "foreign-token": {"sub": "alice", "team_id": "acme", "aud": ["https://elsewhere.example/mcp"]},
}


class FakeBackend(ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls = []
        self.events = []
        self.introspections = 0
        server_js = os.path.realpath(EVERYTHING)
        self.config = {
            "mcp_servers": {
                "everything-acme-alice-inst1": {
                    "installation_id": "inst1", "team_id": "acme", "team_slug": "acme",
                    "server_name": "Everything", "server_slug": "everything", "installation_name": "Everything",
                    "transport_type": "stdio", "command": "node", "args": [server_js, "stdio"],
                    "enabled": True, "user_id": "alice",
                }
            }
        }

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def authorized(self):
        return self.headers.get("authorization") == f"Bearer {API_KEY}"

    def do_GET(self):
        backend = self.server
        backend.calls.append(("GET", self.path))
        if self.path == "/api/health":
            return self.reply(200, {"status": "ok"})
        if not self.authorized():
            return self.reply(401, {"success": False, "error": "Invalid API key"})
        if self.path.startswith("/api/satellites/sat000000000001/commands"):
            return self.reply(200, {"commands": [], "polling_mode": "slow", "next_poll_interval": 60})
        if self.path == "/api/satellites/sat000000000001/config":
            return self.reply(200, backend.config)
        return self.reply(404, {"success": False, "error": "Not found"})

    def do_POST(self):
        backend = self.server
        body = self.body()
        backend.calls.append(("POST", self.path))
        if self.path == "/api/satellites/register":
            if self.headers.get("authorization") != f"Bearer {REGISTRATION}":
                return self.reply(401, {"success": False, "error": "invalid_registration_token"})
            return self.reply(200, {"success": True, "satellite": {
                "id": "sat000000000001", "name": body["name"], "api_key": API_KEY},
                "message": "Satellite registered successfully"})
        if self.path == "/api/oauth2/introspect":
            backend.introspections += 1
            known = TOKENS.get(body.get("token"))
            if not known:
                return self.reply(200, {"active": False, "error": "invalid_token"})
            return self.reply(200, {"active": True, "client_id": "pytest",
                                    "scope": "mcp:read mcp:tools:execute offline_access", **known})
        if not self.authorized():
            return self.reply(401, {"success": False, "error": "Invalid API key"})
        if self.path.endswith("/heartbeat") or self.path.endswith("/command-result"):
            return self.reply(200, {"success": True})
        if self.path.endswith("/events"):
            backend.events.extend(body["events"])
            return self.reply(200, {"success": True})
        return self.reply(404, {"success": False, "error": "Not found"})


@pytest.fixture(scope="module")
def managed():
    backend = FakeBackend()
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    work = tempfile.TemporaryDirectory()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SATELLITE_", "DEPLOYSTACK_"))}
    env.update({
        "DEPLOYSTACK_BACKEND_URL": backend.url,
        "DEPLOYSTACK_SATELLITE_NAME": "pytest-satellite",
        "DEPLOYSTACK_REGISTRATION_TOKEN": REGISTRATION,
        "DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE": "true",
        "EVENT_BATCH_INTERVAL_MS": "200",
        "PORT": str(port),
    })
    log = open(Path(work.name) / "satellite.log", "w")
    proc = subprocess.Popen([str(BIN), "serve"], cwd=work.name, env=env, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        assert proc.poll() is None, "satellite exited: " + (Path(work.name) / "satellite.log").read_text()[-3000:]
        try:
            debug = json.load(urllib.request.urlopen(f"{base}/api/status/debug", timeout=2))
            if debug["server_status"]["stats"]["online"] == 1:
                break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        raise AssertionError("the managed instance did not come online")
    yield backend, base
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    backend.shutdown()
    work.cleanup()


def client(base, token, mode):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(base + "/mcp", http_client=http), mode=mode)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sdk_client_authenticated_by_introspection(managed, mode):
    backend, base = managed
    async with client(base, "alice-token", mode) as c:
        tools = await c.list_tools()
        assert [t.name for t in tools.tools][0] == "discover_mcp_tools"
        found = json.loads((await c.call_tool("discover_mcp_tools", {"query": "echo"})).content[0].text)
        assert "everything:echo" in [t["tool_path"] for t in found["tools"]]
        result = await c.call_tool("execute_mcp_tool", {"tool_path": "everything:echo", "arguments": {"message": "managed"}})
        assert "managed" in result.content[0].text
    # One introspection per token within the cache's 5 minutes, however many requests.
    assert backend.introspections == 1
    assert backend.calls.count(("POST", "/api/satellites/register")) == 1


async def test_an_unknown_token_is_refused(managed):
    _, base = managed
    with pytest.raises(Exception):
        async with client(base, "not-a-token", "legacy") as c:
            await c.list_tools()


async def test_a_token_for_another_audience_is_refused_as_invalid(managed):
    _, base = managed
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(
            base + "/mcp",
            headers={"Authorization": "Bearer foreign-token", "Content-Type": "application/json",
                     "Accept": "application/json, text/event-stream"},
            content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == -32002
    assert "invalid_token" in answer.headers["www-authenticate"]
