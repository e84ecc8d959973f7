"""Two satellite replicas on one PostgreSQL database behind a small round-robin proxy (issue 18): the official
Python SDK on the 2026-07-28 revision, whose requests carry no session, is served by both; a toolset written
through one replica's API reaches the other; a handshake-era session stays with the replica that opened it, and
another replica answers its id with 404, the spec's signal to initialize again.

Needs a PostgreSQL server: SATELLITE_TEST_POSTGRES_URL (scripts/test.sh starts one with scripts/postgres.sh)."""
import itertools
import json
import os
import secrets
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.routing import Route

from conftest import BIN, free_port, sha, wait_port

pytestmark = pytest.mark.anyio

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


def fresh_database() -> str:
    admin = os.environ.get("SATELLITE_TEST_POSTGRES_URL")
    if not admin:
        pytest.fail("SATELLITE_TEST_POSTGRES_URL is not set: eval \"$(bash scripts/postgres.sh start)\"")
    name = "satellite_py_" + secrets.token_hex(8)
    subprocess.run(["psql", "-q", admin, "-c", f"CREATE DATABASE {name}"], check=True)
    return admin.rsplit("/", 1)[0] + "/" + name


class Replicas:
    def __init__(self):
        self.token = secrets.token_hex(24)
        self.dir = tempfile.TemporaryDirectory()
        self.ports = [free_port(), free_port()]
        self.database = fresh_database()
        self.procs = []

    def config(self) -> str:
        return f"""
[sandbox]
allowed_commands = [{json.dumps(str(BIN))}]

[[teams]]
id = "acme"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{sha(self.token)}"]

[[servers]]
slug = "demo"
transport = "stdio"
command = {json.dumps(str(BIN))}
args = ["demo-server"]

[[installations]]
id = "demo-acme"
team = "acme"
server = "demo"
[installations.users.alice]
"""

    def start(self):
        path = Path(self.dir.name) / "satellite.toml"
        path.write_text(self.config())
        for n, port in enumerate(self.ports):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SATELLITE_", "DEPLOYSTACK_"))}
            env["SATELLITE_DATA_DIR"] = str(Path(self.dir.name) / f"data{n}")
            env["DATABASE_URL"] = self.database
            proc = subprocess.Popen(
                [str(BIN), "serve", "--config", str(path), "--port", str(port)], env=env,
                stdout=subprocess.DEVNULL, stderr=open(Path(self.dir.name) / f"replica{n}.log", "w"),
            )
            self.procs.append(proc)
        for n, (port, proc) in enumerate(zip(self.ports, self.procs)):
            wait_port(port, proc, f"replica {n}")
            deadline = time.time() + 60
            while True:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                        break
                except OSError:
                    pass
                assert time.time() < deadline, "replica not ready: " + self.log(n)
                time.sleep(0.1)

    def log(self, n: int) -> str:
        return (Path(self.dir.name) / f"replica{n}.log").read_text()[-3000:]

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for n, proc in enumerate(self.procs):
            assert proc.wait(timeout=30) == 0, "replica did not exit cleanly: " + self.log(n)
        self.dir.cleanup()


@pytest.fixture(scope="module")
def replicas():
    group = Replicas()
    group.start()
    yield group
    group.stop()


def round_robin_proxy(ports):
    """A reverse proxy that sends each request to the next replica in turn (the worst case for sessions) and
    counts what each one served."""
    served = {port: 0 for port in ports}
    turn = itertools.cycle(ports)
    client = httpx2.AsyncClient(timeout=30)

    async def forward(request):
        port = next(turn)
        served[port] += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        upstream = client.build_request(request.method, f"http://127.0.0.1:{port}{request.url.path}",
                                        params=request.query_params, headers=headers, content=await request.body())
        answer = await client.send(upstream, stream=True)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                                 background=BackgroundTask(answer.aclose))

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE", "PUT"])])
    return app, served


async def test_stateless_requests_are_served_by_both_replicas(replicas):
    app, served = round_robin_proxy(replicas.ports)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve)
        with anyio.fail_after(30):
            while not server.started:
                await anyio.sleep(0.05)
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {replicas.token}"}, timeout=30)
        async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client:
            assert client.protocol_version == "2026-07-28"
            for n in range(10):
                found = json.loads((await client.call_tool("discover_mcp_tools", {"query": "echo"})).content[0].text)
                assert "demo:echo" in [t["tool_path"] for t in found["tools"]]
                echoed = await client.call_tool("execute_mcp_tool",
                                                {"tool_path": "demo:echo", "arguments": {"text": f"hi {n}"}})
                assert echoed.content[0].text == f"hi {n}"
        server.should_exit = True
    assert all(count >= 10 for count in served.values()), f"both replicas serve: {served}"


def api(port, token, method, path, body=None):
    with httpx2.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        response = http.request(method, f"http://127.0.0.1:{port}{path}", json=body)
        return response.status_code, response.json()


def test_a_toolset_written_on_one_replica_reaches_the_other(replicas):
    first, second = replicas.ports
    status, _ = api(first, replicas.token, "PUT", "/api/toolsets/echo-only", {"tools": ["demo:echo"]})
    assert status in (200, 201)
    deadline = time.time() + 30
    while True:
        status, listing = api(second, replicas.token, "GET", "/api/toolsets")
        names = [t["name"] for t in listing.get("toolsets", [])] if status == 200 else []
        if "echo-only" in names:
            break
        assert time.time() < deadline, f"the other replica never saw the toolset: {status} {listing}"
        time.sleep(0.2)


def test_a_handshake_session_lives_on_its_replica_and_elsewhere_gets_404(replicas):
    first, second = replicas.ports
    headers = {"Authorization": f"Bearer {replicas.token}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    with httpx2.Client(timeout=10) as http:
        opened = http.post(f"http://127.0.0.1:{first}/mcp", json=init, headers=headers)
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        with_session = {**headers, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        assert http.post(f"http://127.0.0.1:{first}/mcp", json=listing, headers=with_session).status_code == 200
        elsewhere = http.post(f"http://127.0.0.1:{second}/mcp", json=listing, headers=with_session)
        assert elsewhere.status_code == 404, elsewhere.text
