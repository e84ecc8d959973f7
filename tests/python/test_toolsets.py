"""Toolsets through the official MCP Python SDK (both protocol paths): a session selects one with
`?toolset=` on the endpoint URL, or the user's default applies; discover finds and execute runs only its
tools, the instructions name it, and an unknown toolset fails the connection with a reason."""
import json

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio


def client_for(satellite, user, mode, query=""):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {satellite.tokens[user]}"}, timeout=30)
    return Client(streamable_http_client(f"{satellite.base}/mcp{query}", http_client=http), mode=mode)


def api(satellite, user, method, path, body=None):
    with httpx2.Client(headers={"Authorization": f"Bearer {satellite.tokens[user]}"}, timeout=10) as http:
        response = http.request(method, satellite.base + path, json=body)
        return response.status_code, response.json()


async def paths(client, query):
    result = await client.call_tool("discover_mcp_tools", {"query": query, "limit": 50})
    assert not result.is_error, result.content[0].text
    return sorted(t["tool_path"] for t in json.loads(result.content[0].text)["tools"])


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_session_selects_a_toolset_in_its_url(satellite, mode):
    async with client_for(satellite, "alice", mode, "?toolset=echoes") as client:
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        assert "toolset 'echoes' (Echo tools only)" in client.instructions
        assert await paths(client, "*") == ["demo:echo", "everything:echo"]
        assert await paths(client, "add two numbers") == []
        echoed = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:echo", "arguments": {"text": "in"}})
        assert echoed.content[0].text == "in"
        with pytest.raises(MCPError, match="not in the toolset 'echoes'"):
            await client.call_tool("execute_mcp_tool", {"tool_path": "demo:add", "arguments": {"a": 1, "b": 2}})
    async with client_for(satellite, "alice", mode) as client:
        assert "demo:add" in await paths(client, "add two numbers"), "without a toolset every tool is there"


def mcp_error(error: BaseException) -> MCPError:
    """The MCPError the SDK raised, out of the exception groups its task groups wrap it in."""
    if isinstance(error, MCPError):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = mcp_error(inner)
        if found is not None:
            return found
    return None


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_unknown_toolset_fails_the_connection_with_the_reason(satellite, mode):
    for user, name, expected in [
        ("alice", "nope", "Unknown toolset 'nope'. Your toolsets: echoes"),
        # A toolset of another team does not exist for this caller.
        ("carol", "echoes", "Unknown toolset 'echoes'"),
    ]:
        with pytest.raises(BaseException) as raised:
            async with client_for(satellite, user, mode, f"?toolset={name}") as client:
                await client.list_tools()
        error = mcp_error(raised.value)
        assert error is not None, repr(raised.value)
        assert expected in str(error), str(error)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_stored_toolset_made_the_default_applies_without_a_selection(satellite, mode):
    status, made = api(satellite, "bob", "PUT", "/api/toolsets/adder", {"tools": ["demo:add"]})
    assert status in (200, 201), made
    assert made["matched_tools"] == ["demo:add"]
    status, _ = api(satellite, "bob", "PUT", "/api/toolsets/default", {"name": "adder"})
    assert status == 200
    try:
        async with client_for(satellite, "bob", mode) as client:
            assert "toolset 'adder'" in client.instructions
            assert await paths(client, "*") == ["demo:add"]
            added = await client.call_tool("execute_mcp_tool", {"tool_path": "demo:add", "arguments": {"a": 2, "b": 3}})
            assert added.structured_content == {"sum": 5.0}
        async with client_for(satellite, "bob", mode, "?toolset=all") as client:
            assert "demo:echo" in await paths(client, "*")
    finally:
        assert api(satellite, "bob", "PUT", "/api/toolsets/default", {"name": None})[0] == 200
        assert api(satellite, "bob", "DELETE", "/api/toolsets/adder")[0] == 200
