"""The official MCP Python SDK (2.x) against a running satellite: default mode (probes the stateless
2026-07-28 revision first) and legacy mode (initialize handshake), the instance router and legacy SSE."""
import json

import httpx2
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio

META_TOOLS = ["discover_mcp_tools", "execute_mcp_tool", "list_mcp_resources", "read_mcp_resource"]


def client_for(satellite, user, mode, path="/mcp"):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {satellite.tokens[user]}"}, timeout=30)
    return Client(streamable_http_client(satellite.base + path, http_client=http), mode=mode)


def text(result):
    return result.content[0].text


def document(result):
    assert not result.is_error, text(result)
    return json.loads(text(result))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_hierarchical_router_end_to_end(satellite, mode):
    async with client_for(satellite, "alice", mode) as client:
        expected = "2026-07-28" if mode == "auto" else "2025-11-25"
        assert client.protocol_version == expected
        tools = await client.list_tools()
        assert [t.name for t in tools.tools] == META_TOOLS

        found = document(await client.call_tool("discover_mcp_tools", {"query": "echo"}))
        paths = [t["tool_path"] for t in found["tools"]]
        assert "demo:echo" in paths and "everything:echo" in paths, paths
        # The default answer fits a token budget: two tools named echo, neither leading, are one-line entries that
        # name their required arguments; the tool path as the query gives the schema; `limit` alone gives full ones.
        demo_echo = next(t for t in found["tools"] if t["tool_path"] == "demo:echo")
        assert demo_echo.get("required") == ["text"] and "input_schema" not in demo_echo, demo_echo
        assert found["budget_tokens"] == 1000
        described = document(await client.call_tool("discover_mcp_tools", {"query": "demo:echo"}))
        assert described["tools"][0]["input_schema"]["required"] == ["text"], described
        limited = document(await client.call_tool("discover_mcp_tools", {"query": "echo", "limit": 5}))
        demo_echo = next(t for t in limited["tools"] if t["tool_path"] == "demo:echo")
        assert demo_echo["input_schema"]["required"] == ["text"] and 0 <= demo_echo["relevance_score"] <= 1

        everything = document(await client.call_tool("discover_mcp_tools", {"query": "*"}))
        assert everything["total_found"] == 20 and everything["total_available"] > 20

        result = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:echo", "arguments": {"text": f"hi {mode}"}})
        assert text(result) == f"hi {mode}"
        result = await client.call_tool("execute_mcp_tool", {"tool_path": "everything:echo", "arguments": {"message": "there"}})
        assert "there" in text(result)
        added = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:add", "arguments": {"a": 2, "b": 3}})
        assert added.structured_content == {"sum": 5.0}
        failed = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:fail", "arguments": {}})
        assert failed.is_error

        listing = document(await client.call_tool("list_mcp_resources", {}))
        uris = [r["uri"] for r in listing["resources"]]
        assert "demo|ui://demo/app.html" in uris, uris
        ui = await client.call_tool("read_mcp_resource", {"uri": "demo|ui://demo/app.html"})
        assert "Demo app" in text(ui)
        show_ui = next(t for t in document(await client.call_tool("discover_mcp_tools", {"query": "show ui demo app"}))["tools"] if t["tool_path"] == "demo:show_ui")
        assert show_ui["_meta"]["ui"]["resourceUri"] == "demo|ui://demo/app.html"

        native = await client.list_resources()
        readme = next(r for r in native.resources if str(r.uri) == "demo://readme")
        assert readme.meta["io.deploystack.satellite/server"] == "demo"
        read = await client.read_resource("demo://readme")
        assert "Demo" in read.contents[0].text
        assert "Demo" in (await client.read_resource("demo|demo://readme")).contents[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_errors_are_clear(satellite, mode):
    async with client_for(satellite, "alice", mode) as client:
        with pytest.raises(MCPError, match="Tool not found: demo:nope"):
            await client.call_tool("execute_mcp_tool", {"tool_path": "demo:nope", "arguments": {}})
        with pytest.raises(MCPError, match="Invalid tool_path format"):
            await client.call_tool("execute_mcp_tool", {"tool_path": "nocolon", "arguments": {}})
        with pytest.raises(MCPError, match="Unknown meta-tool"):
            await client.call_tool("nope", {})


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_one_team_never_reaches_another(satellite, mode):
    async with client_for(satellite, "carol", mode) as client:
        found = document(await client.call_tool("discover_mcp_tools", {"query": "echo"}))
        assert [t["tool_path"] for t in found["tools"]] == ["demo:echo"]
        with pytest.raises(MCPError, match="You do not have access to server 'everything'"):
            await client.call_tool("execute_mcp_tool", {"tool_path": "everything:echo", "arguments": {"message": "x"}})
        everything = document(await client.call_tool("discover_mcp_tools", {"query": "*"}))
        assert {t["tool_path"].split(":")[0] for t in everything["tools"]} == {"demo"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_instance_router(satellite, mode):
    url = f"{satellite.base}/i/alice-demo/mcp?token={satellite.instance_tokens['alice-demo']}"
    async with Client(url, mode=mode) as client:
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["echo", "add", "slow", "fail", "exit_process", "with_meta", "show_ui"]
        assert text(await client.call_tool("echo", {"text": "direct"})) == "direct"
        read = await client.read_resource("ui://demo/app.html")
        assert "Demo app" in read.contents[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_tool_that_asks_for_a_parameter_header(satellite, mode):
    """The SDK's own server refuses a call without the `Mcp-Param-Region` its tool's `x-mcp-header` asks for. Through
    the satellite, on both revisions (a 2026-07-28 client sends the header to the satellite, which checks it; a
    handshake-era client sends none), the call reaches the server with it, in the base64 form where the value
    needs it, and the tool whose annotation is invalid is not listed."""
    url = f"{satellite.base}/i/erin-regional/mcp?token={satellite.instance_tokens['erin-regional']}"
    async with Client(url, mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "where" in names and "broken" not in names, names
        for region in ["us-west1", "日本", " padded "]:
            assert text(await client.call_tool("where", {"region": region, "query": "q"})) == f"{region}: q"
    async with client_for(satellite, "erin", mode) as client:
        found = document(await client.call_tool("discover_mcp_tools", {"query": "answers a query in a region"}))
        assert "regional:where" in json.dumps(found), found
        executed = await client.call_tool(
            "execute_mcp_tool", {"tool_path": "regional:where", "arguments": {"region": "日本", "query": "q"}}
        )
        assert text(executed) == "日本: q"


async def test_instance_router_refuses_a_foreign_token(satellite):
    url = f"{satellite.base}/i/alice-demo/mcp?token={satellite.instance_tokens['bob-demo']}"
    with pytest.raises(Exception):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()


async def test_legacy_sse_transport(satellite):
    transport = sse_client(satellite.base + "/sse", headers={"Authorization": f"Bearer {satellite.tokens['bob']}"})
    async with Client(transport, mode="legacy") as client:
        assert [t.name for t in (await client.list_tools()).tools] == META_TOOLS
        found = document(await client.call_tool("discover_mcp_tools", {"query": "add numbers"}))
        assert found["tools"][0]["tool_path"] == "demo:add", found
        result = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:echo", "arguments": {"text": "over sse"}})
        assert text(result) == "over sse"


def test_typescript_sdk(satellite):
    """The TypeScript SDK suite (tests/node/clients.test.mjs) against the same satellite."""
    import os
    import subprocess
    from pathlib import Path

    node_dir = Path(__file__).resolve().parents[1] / "node"
    env = dict(os.environ)
    env.update({
        "SATELLITE_URL": satellite.base,
        "SATELLITE_TOKEN": satellite.tokens["alice"],
        "SATELLITE_INSTANCE_URL": f"{satellite.base}/i/alice-demo/mcp?token={satellite.instance_tokens['alice-demo']}",
    })
    run = subprocess.run(["node", "--test", "clients.test.mjs"], cwd=node_dir, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "# pass 4" in run.stdout, run.stdout[-2000:]
