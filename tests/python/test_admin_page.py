"""The admin page (/admin) and the analytics API behind it, against the real satellite of conftest.py.

Real activity first, through the official MCP Python SDK (a session that lists, discovers and calls a tool it
discovered; one whose call fails), then the page in a real browser (tests/node/admin_page.mjs drives the system
Chromium with playwright-core) at desktop and phone width: every figure it shows must be the API's, its charts the
API's rows, with no console error, page error or failed request. Screenshots go to
$SATELLITE_ARTIFACTS/admin_page (default target/artifacts/admin_page). And who may read the API: a member never,
a team admin only their own team, no token is 401."""
import json
import math
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "node" / "admin_page.mjs"
ARTIFACTS = Path(os.environ.get("SATELLITE_ARTIFACTS", ROOT / "target" / "artifacts")) / "admin_page"

ROUTES = [
    "summary", "timeseries", "users", "sessions", "servers", "tools", "failures", "instances",
    "charts/savings.svg", "charts/servers.svg",
]
SECTIONS = ("schema_only", "realized", "calls", "discovers")


def get(satellite, route, token=None, **params):
    """(status, headers, body) of GET /api/analytics/<route>; JSON bodies are parsed."""
    url = f"{satellite.base}/api/analytics/{route}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, err.headers, err.read()
    body = json.loads(raw) if "json" in (headers.get("Content-Type") or "") else raw.decode()
    return status, headers, body


def api(satellite, route, **params):
    status, _, body = get(satellite, route, satellite.admin_token, **params)
    assert status == 200, (route, status, body)
    return body


def figures_of(summary):
    return {section: summary[section] for section in SECTIONS}


def at(summary, path):
    node = summary
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"the page shows {path!r}, which the API's summary does not have"
        node = node[key]
    return node


def poll(what, probe, timeout=30.0, every=0.2):
    """probe() until it returns something truthy, or fail after `timeout` seconds saying what never happened."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} within {timeout}s (last: {last!r})")


def client(satellite, user, mode):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {satellite.tokens[user]}"}, timeout=30)
    return Client(streamable_http_client(satellite.base + "/mcp", http_client=http), mode=mode)


async def activity(satellite):
    """Two of alice's sessions: list, discover, call a discovered tool; then a call whose tool fails."""
    async with client(satellite, "alice", "auto") as session:
        assert [t.name for t in (await session.list_tools()).tools][:2] == ["discover_mcp_tools", "execute_mcp_tool"]
        found = await session.call_tool("discover_mcp_tools", {"query": "echo"})
        assert not found.is_error, found.content[0].text
        paths = [t["tool_path"] for t in json.loads(found.content[0].text)["tools"]]
        assert "demo:echo" in paths, paths
        echoed = await session.call_tool("execute_mcp_tool", {"tool_path": "demo:echo", "arguments": {"text": "admin page"}})
        assert not echoed.is_error and echoed.content[0].text == "admin page"
    async with client(satellite, "alice", "legacy") as session:
        failed = await session.call_tool("execute_mcp_tool", {"tool_path": "demo:fail", "arguments": {}})
        assert failed.is_error


def run_page(satellite):
    node = shutil.which("node")
    assert node, "node is required (scripts/test.sh)"
    assert (ROOT / "tests" / "node" / "node_modules" / "playwright-core").exists(), \
        "playwright-core missing: run scripts/test.sh (npm ci --prefix tests/node)"
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    assert Path(chromium).exists(), f"{chromium} missing: apt-get install chromium (scripts/test.sh does)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [node, str(SCRIPT), satellite.base, satellite.admin_token, str(ARTIFACTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, f"admin_page.mjs exited {run.returncode}: {run.stderr[-4000:]}"
    report = json.loads(run.stdout)
    (ARTIFACTS / "report.json").write_text(json.dumps(report, indent=2))
    return report


def same(shown, value):
    """A figure's data-value (String(value), "" for null) against the API's value."""
    if value is None:
        return shown == ""
    if shown in ("", None):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isclose(float(shown), float(value), rel_tol=1e-9, abs_tol=1e-9)
    return shown == str(value)


@pytest.mark.anyio
async def test_admin_page_shows_the_apis_figures(satellite):
    before = api(satellite, "summary")
    await activity(satellite)

    # The satellite writes analytics in batches: wait for these calls, then for the figures to settle.
    def counted():
        now = api(satellite, "summary")
        grown = (
            now["calls"]["total"] >= before["calls"]["total"] + 2
            and now["calls"]["tool_errors"] >= before["calls"]["tool_errors"] + 1
            and now["discovers"]["total"] >= before["discovers"]["total"] + 1
            and now["realized"]["sessions"] >= before["realized"]["sessions"] + 2
        )
        return now if grown else None

    poll("the calls reached /api/analytics/summary", counted)
    reads = []

    def settled():
        reads.append(figures_of(api(satellite, "summary")))
        return len(reads) >= 2 and reads[-1] == reads[-2]

    poll("the summary stopped changing", settled, every=0.6)
    summary = api(satellite, "summary")
    servers = api(satellite, "servers", limit=15)["items"]
    timeseries = api(satellite, "timeseries", bucket="day", limit=60)["items"]
    users = api(satellite, "users", limit=100)["items"]

    report = run_page(satellite)
    assert figures_of(api(satellite, "summary")) == figures_of(summary), "activity arrived while the page was read"

    for name in ("desktop", "phone"):
        run = report[name]
        where = f"{name} (see {ARTIFACTS})"
        assert "error" not in run, (where, run["error"], run.get("load_error"), run.get("sign_in_error"))
        assert run["console_errors"] == [], (where, run["console_errors"])
        assert run["page_errors"] == [], (where, run["page_errors"])
        assert run["failed_requests"] == [], (where, run["failed_requests"])
        assert run["loaded"] and run["dashboard_visible"] and not run["sign_in_visible"], where
        assert run["load_error"] == "" and run["scope"] == "every team", (where, run["load_error"], run["scope"])
        assert Path(run["screenshot"]).stat().st_size > 0, where

        # Every figure is the API's, exactly what the page was given and what the API answers now.
        assert len(run["figures"]) >= 10, (where, run["figures"])
        assert run["api_summaries"], (where, "the page's summary response was not seen")
        for seen in run["api_summaries"]:
            assert figures_of(seen) == figures_of(summary), (where, "the page was given other figures")
        wrong = {
            path: (shown, at(summary, path))
            for path, shown in run["figures"].items()
            if not same(shown, at(summary, path))
        }
        assert not wrong, (where, "figures that are not the API's (shown, API)", wrong)

        # Charts: each has a non-zero bar; the servers chart is /servers' tool_tokens, the savings chart the
        # daily timeseries (oldest first: plain proxy, then router, per day).
        values = run["bar_values"]
        for chart in ("chart-savings", "chart-servers"):
            assert run["bars"][chart] >= 1 and any(float(v) > 0 for v in values[chart]), (where, chart, values[chart])
        assert values["chart-servers"] == [str(s["tool_tokens"]) for s in servers], (where, values["chart-servers"], servers)
        slugs = [s["server_slug"] for s in servers]
        labels = [s["server_slug"] if slugs.count(s["server_slug"]) == 1 else f'{s["server_slug"]} ({s["installation_id"]})'
                  for s in servers]
        assert run["bar_labels"]["chart-servers"] == labels, where
        expected = []
        for day in reversed(timeseries):
            expected += [str(day["realized"]["proxy_tokens"]), str(day["realized"]["received_tokens"])]
        assert values["chart-savings"] == expected, (where, values["chart-savings"], timeseries)

        # Tables: a row per user with activity, the instances, and alice's failed call.
        assert run["rows"]["users"] >= 1 and run["rows"]["users"] == len(users), (where, run["tables"]["users"])
        assert any(row[0] == "alice" and row[1] == "acme" for row in run["tables"]["users"]), (where, run["tables"]["users"])
        assert run["rows"]["instances"] >= 1, (where, run["tables"]["instances"])
        assert any(row[1] == "call" and row[2] == "demo" and row[3] == "alice" and "fail" in row[4]
                   for row in run["tables"]["failures"]), (where, run["tables"]["failures"])

    phone = report["phone"]
    assert not phone["overflow_x"], ("the page scrolls sideways at phone width", phone["scroll_width"],
                                     phone["inner_width"], phone["too_wide"])
    assert report["desktop"]["scroll_width"] <= report["desktop"]["inner_width"] + 1, report["desktop"]["too_wide"]

    wrong = report["wrong_token"]
    assert wrong["sign_in_error_shown"], ("a wrong token shows no sign-in error", wrong)
    assert wrong["sign_in_visible"] and not wrong["dashboard_visible"] and not wrong["loaded"], wrong
    assert wrong["page_errors"] == [], wrong["page_errors"]
    # The API refuses the wrong token (401, expected) and nothing else fails.
    assert wrong["failed_requests"] and all(r.get("status") == 401 for r in wrong["failed_requests"]), wrong["failed_requests"]
    unexpected = [e for e in wrong["console_errors"] if "401" not in e["text"]]
    assert unexpected == [], unexpected


def test_only_admins_read_the_analytics(satellite):
    """A member is 403 on every route, a team admin 403 for another team (and 200 for their own), no token or an
    unknown one 401; the satellite admin token reads every route."""
    bob, carol = satellite.tokens["bob"], satellite.tokens["carol"]  # bob: acme member; carol: globex's admin
    for route in ROUTES:
        status, headers, body = get(satellite, route)
        assert status == 401 and headers.get("WWW-Authenticate") == "Bearer", (route, status, body)
        assert body["error"] == "unauthorized", (route, body)
        status, _, body = get(satellite, route, "not-a-token")
        assert status == 401, (route, status, body)

        status, _, body = get(satellite, route, bob)
        assert status == 403 and body["error"] == "forbidden", (route, "member", status, body)
        status, _, body = get(satellite, route, bob, team_id="acme")
        assert status == 403, (route, "member for their own team", status, body)

        for other in ("acme", "initech"):
            status, _, body = get(satellite, route, carol, team_id=other)
            assert status == 403 and body["error"] == "forbidden", (route, f"team admin asking for {other}", status, body)
        for own in ({}, {"team_id": "globex"}):
            status, _, body = get(satellite, route, carol, **own)
            assert status == 200, (route, "team admin, own team", own, status, body)
            if isinstance(body, dict) and "filter" in body:
                assert body["filter"]["scope"] == "team:globex" and body["filter"]["team_id"] == "globex", body

        status, headers, body = get(satellite, route, satellite.admin_token)
        assert status == 200, (route, "satellite admin", status, body)
        if route.endswith(".svg"):
            assert headers.get("Content-Type") == "image/svg+xml" and body.startswith("<svg"), (route, body[:200])

    # A team admin's rows are their own team's only.
    status, _, instances = get(satellite, "instances", carol)
    assert status == 200 and {i["team_id"] for i in instances["items"]} == {"globex"}, instances
