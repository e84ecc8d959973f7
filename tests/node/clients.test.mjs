// The official TypeScript SDK as a client of a running satellite (started by tests/python/conftest.py,
// which passes SATELLITE_URL and tokens): Streamable HTTP, legacy SSE, and the instance router.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";

const base = process.env.SATELLITE_URL;
const token = process.env.SATELLITE_TOKEN;
const instanceUrl = process.env.SATELLITE_INSTANCE_URL;
const auth = { Authorization: `Bearer ${token}` };
const META = ["discover_mcp_tools", "execute_mcp_tool", "list_mcp_resources", "read_mcp_resource"];

async function connect(transport) {
  const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

function doc(result) {
  assert.ok(!result.isError, result.content?.[0]?.text);
  return JSON.parse(result.content[0].text);
}

async function exercise(client) {
  const tools = await client.listTools();
  assert.deepEqual(tools.tools.map((t) => t.name), META);
  const found = doc(await client.callTool({ name: "discover_mcp_tools", arguments: { query: "echo" } }));
  const paths = found.tools.map((t) => t.tool_path);
  assert.ok(paths.includes("demo:echo") && paths.includes("everything:echo"), paths.join());
  const echoed = await client.callTool({ name: "execute_mcp_tool", arguments: { tool_path: "demo:echo", arguments: { text: "from ts" } } });
  assert.equal(echoed.content[0].text, "from ts");
  const everything = await client.callTool({ name: "execute_mcp_tool", arguments: { tool_path: "everything:echo", arguments: { message: "ts too" } } });
  assert.match(everything.content[0].text, /ts too/);
  const listing = doc(await client.callTool({ name: "list_mcp_resources", arguments: {} }));
  assert.ok(listing.resources.some((r) => r.uri === "demo|ui://demo/app.html"));
  const ui = await client.callTool({ name: "read_mcp_resource", arguments: { uri: "demo|ui://demo/app.html" } });
  assert.match(ui.content[0].text, /Demo app/);
  const native = await client.readResource({ uri: "demo|demo://readme" });
  assert.match(native.contents[0].text, /Demo/);
}

test("streamable http with a bearer token", async () => {
  const client = await connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { requestInit: { headers: auth } }));
  await exercise(client);
  await client.close();
});

test("legacy sse transport", async () => {
  const transport = new SSEClientTransport(new URL(`${base}/sse`), {
    requestInit: { headers: auth },
    eventSourceInit: { fetch: (url, init) => fetch(url, { ...init, headers: { ...(init?.headers ?? {}), ...auth } }) },
  });
  const client = await connect(transport);
  await exercise(client);
  await client.close();
});

test("instance router", async () => {
  const client = await connect(new StreamableHTTPClientTransport(new URL(instanceUrl)));
  const tools = await client.listTools();
  assert.deepEqual(tools.tools.map((t) => t.name), ["echo", "add", "slow", "fail", "exit_process", "with_meta", "show_ui"]);
  const echoed = await client.callTool({ name: "echo", arguments: { text: "direct from ts" } });
  assert.equal(echoed.content[0].text, "direct from ts");
  await client.close();
});

test("a wrong token is refused", async () => {
  const bad = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { requestInit: { headers: { Authorization: "Bearer wrong" } } });
  await assert.rejects(connect(bad));
});
