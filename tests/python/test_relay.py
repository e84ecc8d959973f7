"""What a server says while a call runs reaches the client through the satellite, as it would directly: progress
notifications, and server requests to the client (sampling, elicitation) whose answers go back to the server.
Real parts: the official Python SDK as client, the published `server-everything` as server."""
import json

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio


def client_for(satellite, user, mode, **callbacks):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {satellite.tokens[user]}"}, timeout=60)
    return Client(streamable_http_client(satellite.base + "/mcp", http_client=http), mode=mode, **callbacks)


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "text", None) is not None)


async def execute(client, tool, arguments, server="everything", **kwargs):
    return await client.call_tool("execute_mcp_tool", {"tool_path": f"{server}:{tool}", "arguments": arguments}, **kwargs)


# On /mcp: alice reaches server-everything over stdio, dave over Streamable HTTP and over legacy HTTP+SSE.
CALLERS = {"stdio": ("alice", "everything"), "http": ("dave", "everything-http"), "sse": ("dave", "everything-sse")}


@pytest.mark.parametrize("upstream", ["stdio", "sse"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_progress_reaches_the_client(satellite, mode, upstream):
    seen = []

    async def progress(done, total, message):
        seen.append((done, total))

    user, server = CALLERS[upstream]
    async with client_for(satellite, user, mode) as client:
        result = await execute(client, "trigger-long-running-operation", {"duration": 0.6, "steps": 3},
                               progress_callback=progress, server=server)
        assert "Long running operation completed" in text(result), text(result)
    assert seen == [(1, 3), (2, 3), (3, 3)], seen


@pytest.mark.parametrize("upstream", ["stdio", "http", "sse"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sampling_request_is_answered_by_the_client(satellite, mode, upstream):
    """legacy: the server's request goes out on the call's stream. auto (2026-07-28, which has no server
    requests): the call ends with input_required, the SDK asks the callback and retries with the answer, and
    the satellite hands it to the waiting server."""
    asked = []

    async def sampling(ctx, params: types.CreateMessageRequestParams):
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="client-model", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text="Paris, from the client"))

    user, server = CALLERS[upstream]
    async with client_for(satellite, user, mode, sampling_callback=sampling) as client:
        assert (client.protocol_version == "2026-07-28") == (mode == "auto"), client.protocol_version
        result = await execute(client, "trigger-sampling-request", {"prompt": "capital of France?", "maxTokens": 20},
                               server=server)
        assert not result.is_error, text(result)
        assert "Paris, from the client" in text(result), text(result)
    assert asked and "capital of France?" in asked[0], asked


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_sessions_sampling_at_once_each_get_their_own_answer(satellite, mode):
    """Two sessions of one user call the same server instance at the same time; each server request goes to the
    session whose call made it, and each call gets its own client's answer. The upstream is Streamable HTTP, where
    a server request travels on the stream of the call that caused it; over stdio nothing links the two, and the
    satellite can only pick the newest call (docs/decisions.md, "Known gaps")."""
    user, server = CALLERS["http"]
    results = {}

    async def run(name):
        async def sampling(ctx, params: types.CreateMessageRequestParams):
            await anyio.sleep(0.3)  # both requests are outstanding at once
            return types.CreateMessageResult(role="assistant", model="client-model", stop_reason="endTurn",
                                             content=types.TextContent(type="text", text=f"answer of {name}"))

        async with client_for(satellite, user, mode, sampling_callback=sampling) as client:
            result = await execute(client, "trigger-sampling-request", {"prompt": f"from {name}", "maxTokens": 20},
                                   server=server)
            results[name] = text(result)

    async with anyio.create_task_group() as group:
        group.start_soon(run, "first")
        group.start_soon(run, "second")
    assert "answer of first" in results["first"] and "answer of second" not in results["first"], results
    assert "answer of second" in results["second"] and "answer of first" not in results["second"], results


@pytest.mark.parametrize("upstream", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_elicitation_request_is_answered_by_the_client(satellite, mode, upstream):
    async def elicitation(ctx, params: types.ElicitRequestParams):
        assert "provide inputs" in params.message
        return types.ElicitResult(action="decline")

    user, server = CALLERS[upstream]
    async with client_for(satellite, user, mode, elicitation_callback=elicitation) as client:
        result = await execute(client, "trigger-elicitation-request", {}, server=server)
        assert "declined" in text(result), text(result)


async def test_a_refused_sampling_request_fails_only_its_call(satellite):
    """The client refuses (as one without a model would): the tool reports the failure, the instance stays
    online and the next call works."""
    async def sampling(ctx, params):
        return types.ErrorData(code=-1, message="user rejected sampling")

    async with client_for(satellite, "alice", "legacy", sampling_callback=sampling) as client:
        async with anyio.create_task_group() as group:
            outcomes = {}

            async def refused():
                try:
                    outcomes["sampling"] = await execute(client, "trigger-sampling-request", {"prompt": "x"})
                except Exception as err:  # the server may answer with a JSON-RPC error instead of a tool error
                    outcomes["sampling"] = err

            async def echo():
                outcomes["echo"] = await execute(client, "echo", {"message": "still here"})

            group.start_soon(refused)
            group.start_soon(echo)
        refusal = outcomes["sampling"]
        assert isinstance(refusal, Exception) or refusal.is_error or "rejected" in text(refusal), refusal
        assert "still here" in text(outcomes["echo"])
        again = await execute(client, "echo", {"message": "after"})
        assert "after" in text(again)
    stats = satellite.debug()["server_status"]["stats"]
    assert stats["online"] == stats["total"], stats


async def test_sampling_over_legacy_sse(satellite):
    async def sampling(ctx, params):
        return types.CreateMessageResult(role="assistant", model="m", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text="over the old stream"))

    transport = sse_client(satellite.base + "/sse", headers={"Authorization": f"Bearer {satellite.tokens['bob']}"})
    async with Client(transport, mode="legacy", sampling_callback=sampling) as client:
        result = await execute(client, "trigger-sampling-request", {"prompt": "hello"})
        assert "over the old stream" in text(result), text(result)


def everything_url(satellite, upstream="stdio"):
    if upstream == "http":
        return f"{satellite.base}/i/dave-everything-http/mcp?token={satellite.instance_tokens['dave-everything-http']}"
    return f"{satellite.base}/i/alice-everything/mcp?token={satellite.instance_tokens['alice-everything']}"


# Each case of the instance router runs against server-everything over stdio (a child the satellite spawns) and
# over Streamable HTTP (a remote server it proxies), with the client in each revision.
BOTH_UPSTREAMS = pytest.mark.parametrize("upstream", ["stdio", "http"])


@BOTH_UPSTREAMS
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_instance_router_is_the_server(satellite, mode, upstream):
    """Through the instance router a client sees the server itself: its name, instructions, capabilities,
    prompts and completions, and its progress notifications."""
    seen = []

    async def progress(done, total, message):
        seen.append(done)

    async with Client(everything_url(satellite, upstream), mode=mode) as client:
        assert client.server_info is not None and "everything" in client.server_info.name, client.server_info
        assert client.server_capabilities.prompts is not None
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        assert "simple-prompt" in prompts and "completable-prompt" in prompts, prompts
        prompt = await client.get_prompt("simple-prompt")
        assert prompt.messages and prompt.messages[0].content.text
        completion = await client.complete(types.PromptReference(type="ref/prompt", name="completable-prompt"),
                                           {"name": "department", "value": "Eng"})
        assert "Engineering" in completion.completion.values, completion
        result = await client.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 2},
                                        progress_callback=progress)
        assert "completed" in text(result)
    assert seen == [1, 2], seen


@BOTH_UPSTREAMS
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_instance_router_relays_sampling(satellite, mode, upstream):
    async def sampling(ctx, params):
        return types.CreateMessageResult(role="assistant", model="m", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text="direct answer"))

    async with Client(everything_url(satellite, upstream), mode=mode, sampling_callback=sampling) as client:
        result = await client.call_tool("trigger-sampling-request", {"prompt": "hi"})
        assert "direct answer" in text(result), text(result)


@BOTH_UPSTREAMS
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_instance_router_relays_elicitation(satellite, mode, upstream):
    async def elicitation(ctx, params: types.ElicitRequestParams):
        assert "provide inputs" in params.message
        return types.ElicitResult(action="decline")

    async with Client(everything_url(satellite, upstream), mode=mode, elicitation_callback=elicitation) as client:
        result = await client.call_tool("trigger-elicitation-request", {})
        assert "declined" in text(result), text(result)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_prompts_of_all_instances_on_mcp(satellite, mode):
    async with client_for(satellite, "alice", mode) as client:
        assert client.server_capabilities.prompts is not None
        names = [p.name for p in (await client.list_prompts()).prompts]
        assert "everything:simple-prompt" in names, names
        prompt = await client.get_prompt("everything:args-prompt", {"city": "Paris", "state": "Ile-de-France"})
        assert "Paris" in prompt.messages[0].content.text
        completion = await client.complete(types.PromptReference(type="ref/prompt", name="everything:completable-prompt"),
                                           {"name": "department", "value": "Sal"})
        assert "Sales" in completion.completion.values, completion
    async with client_for(satellite, "carol", mode) as other_team:
        names = [p.name for p in (await other_team.list_prompts()).prompts]
        assert not any(n.startswith("everything:") for n in names), names


async def test_log_messages_reach_the_client(satellite):
    logs = []

    async def logging_callback(params):
        logs.append(params.level)

    async with client_for(satellite, "alice", "legacy", logging_callback=logging_callback) as client:
        await client.set_logging_level("debug")
        started = await execute(client, "toggle-simulated-logging", {})
        try:
            assert "Started" in text(started) or "started" in text(started), text(started)
            assert logs, "a log message sent during a call reached the client"
        finally:
            await execute(client, "toggle-simulated-logging", {})


@pytest.mark.parametrize("front", ["mcp", "sse"])
async def test_an_unanswered_sampling_request_fails_its_call_only(satellite, front):
    """The client never answers the server's sampling request: that call fails when its timeout (8 s here)
    runs out, a concurrent call on the same instance succeeds meanwhile, and the instance stays online. The
    request is withdrawn from the client with the call (`notifications/cancelled` under the id it was asked by),
    so the SDK stops its handler: before, the client went on asking its user for an answer nobody awaited."""
    asked = anyio.Event()
    withdrawn = anyio.Event()

    async def never_answers(ctx, params):
        asked.set()
        try:
            await anyio.sleep(3600)
        finally:
            withdrawn.set()

    if front == "sse":
        headers = {"Authorization": f"Bearer {satellite.tokens['bob']}"}
        client = Client(sse_client(satellite.base + "/sse", headers=headers), mode="legacy",
                        sampling_callback=never_answers)
    else:
        client = client_for(satellite, "alice", "legacy", sampling_callback=never_answers)
    async with client:
        outcome = {}

        async def hanging():
            try:
                outcome["sampling"] = await execute(client, "trigger-sampling-request", {"prompt": "never"})
            except Exception as err:
                outcome["sampling"] = err

        async with anyio.create_task_group() as group:
            group.start_soon(hanging)
            with anyio.fail_after(30):
                await asked.wait()
            concurrent = await execute(client, "echo", {"message": "meanwhile"})
            assert "meanwhile" in text(concurrent)
        failed = outcome["sampling"]
        assert isinstance(failed, Exception) or failed.is_error, failed
        assert "timeout" in str(failed).lower() or "timed out" in str(failed).lower(), failed
        with anyio.fail_after(10):
            await withdrawn.wait()
        after = await execute(client, "echo", {"message": "after"})
        assert "after" in text(after)
    stats = satellite.debug()["server_status"]["stats"]
    assert stats["online"] == stats["total"], stats


@BOTH_UPSTREAMS
async def test_resource_updates_reach_the_session_that_subscribed(satellite, upstream):
    """A notification the server sends outside any request (a resource update) reaches, over its GET stream,
    the instance-router session that subscribed to that resource, and not another session of the same user."""
    updates = {"a": [], "b": []}

    def recorder(name):
        async def handler(message):
            method = getattr(message, "method", None)
            if method == "notifications/resources/updated":
                updates[name].append(str(message.params.uri))
        return handler

    async with Client(everything_url(satellite, upstream), mode="legacy", message_handler=recorder("a")) as a, \
            Client(everything_url(satellite, upstream), mode="legacy", message_handler=recorder("b")) as b:
        uri = str((await a.list_resources()).resources[0].uri)
        await a.subscribe_resource(uri)
        await b.list_resources()
        toggled = await a.call_tool("toggle-subscriber-updates", {})
        try:
            with anyio.fail_after(20):
                while uri not in updates["a"]:
                    await anyio.sleep(0.05)
        finally:
            await a.call_tool("toggle-subscriber-updates", {})
        assert "Started" in text(toggled), text(toggled)
        await a.unsubscribe_resource(uri)
    assert updates["b"] == [], "a session that did not subscribe hears nothing of it"


@pytest.mark.parametrize("router", ["instance", "mcp"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_2026_server_asking_through_input_required(satellite, mode, router):
    """The conformance reference server (2026-07-28) asks for the user's name with an input_required result. A
    2026-07-28 client gets that result and retries itself; for a handshake-era client, which cannot read it, the
    satellite asks the question as an elicitation request on the call's stream and retries with the answer."""
    asked = []

    async def elicitation(ctx, params: types.ElicitRequestParams):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    if router == "instance":
        url = f"{satellite.base}/i/erin-reference/mcp?token={satellite.instance_tokens['erin-reference']}"
        client = Client(url, mode=mode, elicitation_callback=elicitation)
    else:
        client = client_for(satellite, "erin", mode, elicitation_callback=elicitation)
    async with client:
        if router == "instance":
            result = await client.call_tool("test_input_required_result_elicitation", {})
        else:
            result = await execute(client, "test_input_required_result_elicitation", {}, server="reference")
    assert "Hello, Ada!" in text(result), text(result)
    assert asked == ["What is your name?"], asked


@pytest.mark.parametrize("transport", ["streamable", "sse"])
async def test_roots_asked_outside_a_call_reach_the_client(satellite, transport):
    """server-everything (stdio) asks for the roots again when its client says they changed, outside any call:
    the satellite passes the request to the member's client on its GET stream (on legacy SSE, its one stream),
    and the server keeps the answer, which its get-roots-list tool then shows. Before, the satellite answered such
    a request itself, with no roots; a legacy SSE client's roots change did not even reach the server."""
    current = []
    asked = anyio.Event()

    async def roots(context):
        if current:
            asked.set()
        return types.ListRootsResult(roots=current)

    if transport == "sse":
        legacy = sse_client(satellite.base + "/sse", headers={"Authorization": f"Bearer {satellite.tokens['alice']}"})
        client = Client(legacy, mode="legacy", list_roots_callback=roots)
    else:
        client = client_for(satellite, "alice", "legacy", list_roots_callback=roots)
    async with client:
        # Asked during the call first (the server keeps what it got): not this one yet.
        root = f"file:///alice/{transport}"
        assert root not in text(await execute(client, "get-roots-list", {}))
        current.append(types.Root(uri=root, name="project"))
        # No call runs now: the server's request can only come on the GET stream, which the SDK opens in the
        # background, so the change is announced until the request reaches the client.
        with anyio.fail_after(30):
            while not asked.is_set():
                await client.send_roots_list_changed()
                with anyio.move_on_after(0.5):
                    await asked.wait()
        assert root in text(await execute(client, "get-roots-list", {}))


@pytest.mark.parametrize("router", ["instance", "mcp"])
async def test_a_2026_servers_rounds_of_questions_share_the_requests_budget(satellite, router):
    """The reference server asks twice (two rounds of input_required, the state carried between them). A
    handshake-era client answers each question through the satellite and gets the server's final answer. The rounds
    share the request's one budget (call_timeout_seconds = 8): a client that takes 5 s per answer makes the call
    fail after 8 s, where before each round got the whole budget again and the call ran on for 10 s and more."""
    asked = []

    async def answer(delay, ctx, params: types.ElicitRequestParams):
        asked.append(params.message)
        await anyio.sleep(delay)
        field = "name" if params.message.startswith("Step 1") else "color"
        return types.ElicitResult(action="accept", content={field: "Ada" if field == "name" else "green"})

    def connect(delay):
        callback = lambda ctx, params: answer(delay, ctx, params)  # noqa: E731
        if router == "instance":
            url = f"{satellite.base}/i/erin-reference/mcp?token={satellite.instance_tokens['erin-reference']}"
            return Client(url, mode="legacy", elicitation_callback=callback)
        return client_for(satellite, "erin", "legacy", elicitation_callback=callback)

    async def call(client):
        if router == "instance":
            return await client.call_tool("test_input_required_result_multi_round", {})
        return await execute(client, "test_input_required_result_multi_round", {}, server="reference")

    async with connect(0) as client:
        result = await call(client)
    assert "Multi-round complete for Ada who likes green" in text(result), text(result)
    assert [m.split(":")[0] for m in asked] == ["Step 1", "Step 2"], asked

    asked.clear()
    async with connect(5) as client:
        with pytest.raises(MCPError, match=r"within \d+s"):
            await call(client)
    assert [m.split(":")[0] for m in asked] == ["Step 1", "Step 2"], asked


@pytest.mark.parametrize("router", ["instance", "mcp", "sse"])
async def test_every_kind_of_question_of_a_2026_server_reaches_a_handshake_era_client(satellite, router):
    """The reference server (2026-07-28) asks three things in one input_required round: an elicitation, a sampling
    and the roots. A handshake-era client gets each as the request it knows, on its session (on legacy SSE, on its
    one stream, its POST to /message answered already), and the server gets the three answers in one retry."""
    asked = []

    async def elicitation(ctx, params: types.ElicitRequestParams):
        asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def sampling(ctx, params: types.CreateMessageRequestParams):
        asked.append("sampling")
        return types.CreateMessageResult(role="assistant", model="client-model", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text="Good day"))

    async def roots(ctx):
        asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri="file:///erin/project", name="project")])

    callbacks = dict(elicitation_callback=elicitation, sampling_callback=sampling, list_roots_callback=roots)
    if router == "instance":
        url = f"{satellite.base}/i/erin-reference/mcp?token={satellite.instance_tokens['erin-reference']}"
        client = Client(url, mode="legacy", **callbacks)
    elif router == "sse":
        legacy = sse_client(satellite.base + "/sse", headers={"Authorization": f"Bearer {satellite.tokens['erin']}"})
        client = Client(legacy, mode="legacy", **callbacks)
    else:
        client = client_for(satellite, "erin", "legacy", **callbacks)
    async with client:
        if router == "instance":
            result = await client.call_tool("test_input_required_result_multiple_inputs", {})
        else:
            result = await execute(client, "test_input_required_result_multiple_inputs", {}, server="reference")
    assert "Name: Ada; Greeting: Good day; Roots: 1" in text(result), text(result)
    assert sorted(asked) == ["elicitation", "roots", "sampling"], asked
