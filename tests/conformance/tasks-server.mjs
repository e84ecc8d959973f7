#!/usr/bin/env node
// A small MCP server of protocol revision 2026-07-28 (the stateless revision) that implements the Tasks extension
// `io.modelcontextprotocol/tasks` (SEP-2663), written to be the upstream for the conformance suite's `tasks-*`
// scenarios. Run the suite against it directly and through the gateway to compare how the gateway passes tasks on.
//
//   PORT=3100 tests/conformance/node_modules/.bin/node tests/conformance/tasks-server.mjs
//   -> http://127.0.0.1:3100/mcp  (POST only; Node 18+ built-ins, no dependencies)
//
// What it speaks:
//   - 2026-07-28 only: no initialize and no session. Every request carries `_meta` with
//     `io.modelcontextprotocol/protocolVersion` and `io.modelcontextprotocol/clientCapabilities`, and the headers
//     `MCP-Protocol-Version` (equal to the `_meta` version), `Mcp-Method` (the body's method) and, for tools/call and
//     tasks/get|update|cancel, `Mcp-Name` (the tool name or the taskId; `=?base64?…?=` is decoded). Disagreement or
//     absence is HTTP 400 + -32020; missing `_meta` fields 400 + -32602; another version (or an `initialize` from an
//     older revision) 400 + -32022; a capability the request did not declare 400 + -32021; an unknown method
//     (tasks/result and tasks/list included: the extension removed them) 404 + -32601.
//   - Results always carry `resultType`; server/discover and tools/list also carry `ttlMs` and `cacheScope`.
//   - Tasks: a tools/call of a task-supporting tool from a request that declares the extension in its
//     `clientCapabilities.extensions` returns a flat CreateTaskResult (`resultType:"task"`); without the
//     declaration an optional-task tool runs synchronously and a required-task tool is refused with -32021.
//     tasks/get returns the DetailedTask (`result` / `error` / `inputRequests` inlined by status), tasks/update and
//     tasks/cancel return an empty `{resultType:"complete"}` ack, unknown task ids are -32602. Task ids are random
//     UUIDs and tasks are dropped `ttlMs` after creation. They are not bound to any caller (no auth here).
//   - Host (and Origin, when sent) must name a loopback host (DNS-rebinding protection): 403 otherwise.
//   - subscriptions/listen with `notifications.tasksStatus: [taskId…]` opens an SSE stream that carries
//     `notifications/tasks/status` (the DetailedTask, tagged with the subscription id) on each status change.
//
// Fixture tools (what the tasks-* scenarios call):
//   greet               sync only: "Hello, {name}!"
//   slow_compute        task optional: sleeps `seconds`, then returns; tasks/cancel settles it to `cancelled`
//   failing_job         task required: after ~1 s completes with a tool error (`result.isError: true`)
//   protocol_error_job  task optional: after ~0.5 s fails with a JSON-RPC error (-32603) -> status `failed`
//   confirm_delete      task optional, needs elicitation: asks one `elicitation/create`, completes on the answer
//                       (without the extension: the same question as an MRTR InputRequiredResult)
//   multi_input         task optional, needs elicitation: asks two questions at once (partial answers allowed)
//   test_tool_with_task task required, needs elicitation: round 1 is an MRTR InputRequiredResult asking for
//                       `user_name` (with an HMAC-signed requestState); round 2 answers it and gets a task whose
//                       result greets that name

import http from 'node:http';
import { createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';

const PROTOCOL_VERSION = '2026-07-28';
const SUPPORTED_VERSIONS = [PROTOCOL_VERSION];
const LEGACY_VERSIONS = new Set(['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25']);
const TASKS = 'io.modelcontextprotocol/tasks';
const META_VERSION = 'io.modelcontextprotocol/protocolVersion';
const META_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';
const META_SERVER_INFO = 'io.modelcontextprotocol/serverInfo';
const META_SUBSCRIPTION = 'io.modelcontextprotocol/subscriptionId';
const SERVER_INFO = { name: 'tasks-conformance-server', version: '1.0.0' };
const TASK_TTL_MS = 15 * 60 * 1000;
const POLL_INTERVAL_MS = 500;
const LIST_TTL_MS = 300000;
const MAX_BODY_BYTES = 1 << 20;

// ---------------------------------------------------------------------------------------------------------------
// JSON-RPC errors

const HEADER_MISMATCH = -32020;
const MISSING_CAPABILITY = -32021;
const UNSUPPORTED_VERSION = -32022;
const INVALID_PARAMS = -32602;
const METHOD_NOT_FOUND = -32601;
const INTERNAL_ERROR = -32603;

class RpcError extends Error {
  constructor(code, message, data, httpStatus) {
    super(message);
    this.code = code;
    this.data = data;
    this.httpStatus =
      httpStatus ??
      ([HEADER_MISMATCH, MISSING_CAPABILITY, UNSUPPORTED_VERSION, -32600, -32700].includes(code)
        ? 400
        : code === METHOD_NOT_FOUND
          ? 404
          : 200);
  }
  toJSON() {
    return { code: this.code, message: this.message, ...(this.data === undefined ? {} : { data: this.data }) };
  }
}

const invalidParams = (message) => new RpcError(INVALID_PARAMS, message);
const missingCapability = (requiredCapabilities, what) =>
  new RpcError(MISSING_CAPABILITY, `Missing required client capability: ${what}`, { requiredCapabilities });
const missingTasks = (what) => missingCapability({ extensions: { [TASKS]: {} } }, `${TASKS} (${what})`);

const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
const text = (s, isError = false) => ({ content: [{ type: 'text', text: s }], isError });
const declaresTasks = (caps) => isObject(caps?.extensions) && caps.extensions[TASKS] !== undefined;

// ---------------------------------------------------------------------------------------------------------------
// Tasks: an in-memory store, each task driven by an async job that can sleep and ask the client for input.

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
const CANCELLED = Symbol('cancelled'); // what a job's pending sleep/ask rejects with once its task is settled
const tasks = new Map(); // taskId -> task

/** The Task fields every view carries (CreateTaskResult, tasks/get, notifications/tasks/status). */
function taskBase(task) {
  return {
    taskId: task.taskId,
    status: task.status,
    ...(task.statusMessage ? { statusMessage: task.statusMessage } : {}),
    createdAt: task.createdAt,
    lastUpdatedAt: task.lastUpdatedAt,
    ttlMs: task.ttlMs,
    pollIntervalMs: task.pollIntervalMs
  };
}

/** DetailedTask: the base plus what the status inlines. */
function detailedTask(task) {
  const view = taskBase(task);
  if (task.status === 'input_required') {
    view.inputRequests = Object.fromEntries([...task.pending].map(([key, p]) => [key, p.request]));
  } else if (task.status === 'completed') {
    view.result = task.result;
  } else if (task.status === 'failed') {
    view.error = task.error;
  }
  return view;
}

function touch(task) {
  task.lastUpdatedAt = new Date().toISOString();
  notifySubscribers(task);
}

function settle(task, status, fields) {
  if (TERMINAL.has(task.status)) return;
  Object.assign(task, { status }, fields);
  for (const abort of task.aborters) abort();
  for (const p of task.pending.values()) p.reject(CANCELLED);
  task.pending.clear();
  touch(task);
}

/** Creates a task (stored before this returns, so an immediate tasks/get resolves) and starts `job(ctx)`. */
function startTask(job, statusMessage) {
  const now = new Date().toISOString();
  const task = {
    taskId: randomUUID(),
    status: 'working',
    statusMessage,
    createdAt: now,
    lastUpdatedAt: now,
    ttlMs: TASK_TTL_MS,
    pollIntervalMs: POLL_INTERVAL_MS,
    pending: new Map(), // inputRequests key -> { request, resolve, reject }
    aborters: new Set() // cancels the job's current sleep
  };
  tasks.set(task.taskId, task);
  setTimeout(() => {
    settle(task, 'cancelled', { statusMessage: 'expired' });
    tasks.delete(task.taskId);
    for (const sub of subscribers) sub.taskIds.delete(task.taskId);
  }, TASK_TTL_MS).unref();

  const ctx = {
    sleep: (ms) =>
      new Promise((resolve, reject) => {
        if (TERMINAL.has(task.status)) return reject(CANCELLED);
        const abort = () => {
          clearTimeout(timer);
          reject(CANCELLED);
        };
        const timer = setTimeout(() => {
          task.aborters.delete(abort);
          resolve();
        }, ms);
        task.aborters.add(abort);
      }),
    /** Surfaces `request` under a fresh key until tasks/update answers it; resolves to the answer. */
    ask: (prefix, request) =>
      new Promise((resolve, reject) => {
        if (TERMINAL.has(task.status)) return reject(CANCELLED);
        task.pending.set(`${prefix}-${randomUUID()}`, { request, resolve, reject });
        task.status = 'input_required';
        task.statusMessage = 'waiting for the client to answer inputRequests';
        touch(task);
      }),
    progress: (message) => {
      if (TERMINAL.has(task.status)) return;
      task.statusMessage = message;
      touch(task);
    }
  };
  (async () => job(ctx))().then(
    (result) => settle(task, 'completed', { result, statusMessage: 'completed' }),
    (err) => {
      if (err === CANCELLED) return;
      const error = err instanceof RpcError ? err.toJSON() : { code: INTERNAL_ERROR, message: String(err?.message ?? err) };
      settle(task, 'failed', { error, statusMessage: `failed: ${error.message}` });
    }
  );
  return task;
}

/** The flat CreateTaskResult (Result & Task): no result/error/inputRequests, no requestState. */
const createTaskResult = (task) => ({ resultType: 'task', ...taskBase(task) });

function lookupTask(params) {
  if (typeof params.taskId !== 'string') throw invalidParams('taskId must be a string');
  const task = tasks.get(params.taskId);
  if (!task) throw invalidParams(`Unknown task: ${params.taskId}`);
  return task;
}

// ---------------------------------------------------------------------------------------------------------------
// Task status notifications on subscriptions/listen streams

const subscribers = new Set(); // { res, subscriptionId, taskIds:Set }

function sendEvent(res, message) {
  res.write(`event: message\ndata: ${JSON.stringify(message)}\n\n`);
}

function notifySubscribers(task) {
  for (const sub of subscribers) {
    if (!sub.taskIds.has(task.taskId)) continue;
    sendEvent(sub.res, {
      jsonrpc: '2.0',
      method: 'notifications/tasks/status',
      params: { _meta: { [META_SUBSCRIPTION]: sub.subscriptionId }, ...detailedTask(task) }
    });
  }
}

function listen(req, res, id, params, caps) {
  const filter = isObject(params.notifications) ? params.notifications : {};
  const wanted = filter.tasksStatus;
  if (wanted !== undefined && !Array.isArray(wanted)) throw invalidParams('notifications.tasksStatus must be an array');
  if (wanted !== undefined && !declaresTasks(caps)) throw missingTasks('task status notifications');
  const taskIds = new Set((wanted ?? []).filter((t) => typeof t === 'string' && tasks.has(t)));
  const subscriptionId = String(id);
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  sendEvent(res, {
    jsonrpc: '2.0',
    method: 'notifications/subscriptions/acknowledged',
    params: {
      _meta: { [META_SUBSCRIPTION]: subscriptionId },
      notifications: wanted === undefined ? {} : { tasksStatus: [...taskIds] }
    }
  });
  const sub = { res, subscriptionId, taskIds };
  subscribers.add(sub);
  const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15000);
  res.on('close', () => {
    clearInterval(keepalive);
    subscribers.delete(sub);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Fixture tools

const elicit = (message, properties, required) => ({
  method: 'elicitation/create',
  params: { mode: 'form', message, requestedSchema: { type: 'object', properties, required } }
});
const confirmRequest = (filename) =>
  elicit(`Really delete ${filename}?`, { confirm: { type: 'boolean', title: 'Delete it' } }, ['confirm']);
const nameRequest = (message) => elicit(message, { name: { type: 'string', title: 'Name' } }, ['name']);
const accepted = (answer) => isObject(answer) && answer.action === 'accept';
const confirmed = (answer) => accepted(answer) && answer.content?.confirm !== false;
const answerText = (answer) =>
  accepted(answer) ? JSON.stringify(answer.content ?? {}) : `(${isObject(answer) ? answer.action : 'no answer'})`;

// MRTR requestState for test_tool_with_task: HMAC-signed with a per-process key, so it is integrity protected.
const STATE_KEY = randomBytes(32);
const sign = (payload) => {
  const body = Buffer.from(JSON.stringify(payload)).toString('base64url');
  return `${body}.${createHmac('sha256', STATE_KEY).update(body).digest('base64url')}`;
};
function verify(state) {
  if (typeof state !== 'string') return undefined;
  const [body, mac] = state.split('.');
  if (!body || !mac) return undefined;
  const want = Buffer.from(createHmac('sha256', STATE_KEY).update(body).digest('base64url'));
  const got = Buffer.from(mac);
  if (got.length !== want.length || !timingSafeEqual(got, want)) return undefined;
  try {
    const payload = JSON.parse(Buffer.from(body, 'base64url').toString());
    return payload.exp > Date.now() ? payload : undefined;
  } catch {
    return undefined;
  }
}

function inputResponsesOf(params) {
  const r = params.inputResponses;
  if (r === undefined) return {};
  if (!isObject(r)) throw invalidParams('inputResponses must be an object');
  return r;
}

const TOOLS = {
  greet: {
    description: 'Sync only: returns "Hello, {name}!".',
    inputSchema: { type: 'object', properties: { name: { type: 'string' } } },
    call: (args) => text(`Hello, ${typeof args.name === 'string' ? args.name : 'World'}!`)
  },

  slow_compute: {
    description: 'Task-supporting: sleeps `seconds` then returns; cancellable.',
    taskSupport: 'optional',
    inputSchema: {
      type: 'object',
      properties: { seconds: { type: 'number', minimum: 0 }, label: { type: 'string' } }
    },
    call: (args, req) => {
      const seconds = args.seconds ?? 1;
      if (typeof seconds !== 'number' || !(seconds >= 0) || seconds > 3600) {
        throw invalidParams('seconds must be a number between 0 and 3600');
      }
      const label = typeof args.label === 'string' ? args.label : 'slow_compute';
      const job = async (ctx) => {
        await ctx.sleep(seconds * 1000);
        return text(`${label}: computed after ${seconds}s`);
      };
      return runTool(req, job, `${label}: computing for ${seconds}s`);
    }
  },

  failing_job: {
    description: 'Task required: after ~1s completes with a tool execution error (isError).',
    taskSupport: 'required',
    inputSchema: { type: 'object', properties: {} },
    call: (_args, req) =>
      runTool(req, async (ctx) => {
        await ctx.sleep(1000);
        return text('failing_job: the job ran and reported an error', true);
      })
  },

  protocol_error_job: {
    description: 'Task-supporting: after ~0.5s fails with a JSON-RPC internal error (task status "failed").',
    taskSupport: 'optional',
    inputSchema: { type: 'object', properties: {} },
    call: (_args, req) =>
      runTool(req, async (ctx) => {
        await ctx.sleep(500);
        throw new RpcError(INTERNAL_ERROR, 'protocol_error_job: simulated internal failure', {
          tool: 'protocol_error_job'
        });
      })
  },

  confirm_delete: {
    description: 'Task-supporting: asks (elicitation) whether to delete `filename`, then completes.',
    taskSupport: 'optional',
    needs: { elicitation: {} },
    inputSchema: { type: 'object', properties: { filename: { type: 'string' } }, required: ['filename'] },
    call: (args, req) => {
      const filename = typeof args.filename === 'string' ? args.filename : 'unnamed';
      const outcome = (answer) => text(confirmed(answer) ? `Deleted ${filename}` : `Kept ${filename}`);
      if (!req.tasks) {
        // No tasks: the same question as a multi round-trip request.
        const answers = inputResponsesOf(req.params);
        if (answers.confirm !== undefined) return outcome(answers.confirm);
        return { resultType: 'input_required', inputRequests: { confirm: confirmRequest(filename) } };
      }
      return createTaskResult(
        startTask(async (ctx) => {
          await ctx.sleep(100);
          return outcome(await ctx.ask('confirm', confirmRequest(filename)));
        }, `confirm_delete: preparing to delete ${filename}`)
      );
    }
  },

  multi_input: {
    description: 'Task-supporting: asks two elicitation questions at once; completes when both are answered.',
    taskSupport: 'optional',
    needs: { elicitation: {} },
    inputSchema: { type: 'object', properties: {} },
    call: (_args, req) => {
      const first = nameRequest('First input: your name?');
      const second = elicit('Second input: go ahead?', { confirm: { type: 'boolean' } }, ['confirm']);
      const outcome = (a, b) => text(`multi_input: first=${answerText(a)} second=${answerText(b)}`);
      if (!req.tasks) {
        const answers = inputResponsesOf(req.params);
        if (answers.first !== undefined && answers.second !== undefined) return outcome(answers.first, answers.second);
        const missing = {};
        if (answers.first === undefined) missing.first = first;
        if (answers.second === undefined) missing.second = second;
        return { resultType: 'input_required', inputRequests: missing };
      }
      return createTaskResult(
        startTask(async (ctx) => {
          await ctx.sleep(100);
          const [a, b] = await Promise.all([ctx.ask('first', first), ctx.ask('second', second)]);
          return outcome(a, b);
        }, 'multi_input: preparing questions')
      );
    }
  },

  test_tool_with_task: {
    description: 'Task required: MRTR round asks for user_name, then the answered call becomes a task.',
    taskSupport: 'required',
    needs: { elicitation: {} },
    inputSchema: { type: 'object', properties: {} },
    call: (_args, req) => {
      const answer = inputResponsesOf(req.params).user_name;
      if (answer === undefined) {
        return {
          resultType: 'input_required',
          inputRequests: { user_name: nameRequest('What is your name?') },
          requestState: sign({ tool: 'test_tool_with_task', exp: Date.now() + 10 * 60 * 1000 })
        };
      }
      const state = verify(req.params.requestState);
      if (state?.tool !== 'test_tool_with_task') throw invalidParams('requestState is missing or fails verification');
      if (!accepted(answer) || typeof answer.content?.name !== 'string') {
        return text('test_tool_with_task: no name was given');
      }
      const name = answer.content.name;
      return createTaskResult(
        startTask(async (ctx) => {
          await ctx.sleep(500);
          return text(`Hello, ${name}! (name gathered by MRTR, result delivered by a task)`);
        }, `test_tool_with_task: working for ${name}`)
      );
    }
  }
};

/** A task when the request declared the extension, else the same job run inline (sleeps are real sleeps). */
async function runTool(req, job, statusMessage) {
  if (req.tasks) return createTaskResult(startTask(job, statusMessage));
  const inline = {
    sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
    ask: () => {
      throw new RpcError(INTERNAL_ERROR, 'this tool needs a task to ask for input');
    },
    progress: () => {}
  };
  return job(inline);
}

function toolList() {
  return Object.entries(TOOLS).map(([name, tool]) => ({
    name,
    description: tool.description,
    inputSchema: tool.inputSchema,
    ...(tool.taskSupport ? { execution: { taskSupport: tool.taskSupport } } : {})
  }));
}

// ---------------------------------------------------------------------------------------------------------------
// Methods

async function callTool(params, caps) {
  const tool = typeof params.name === 'string' && Object.hasOwn(TOOLS, params.name) ? TOOLS[params.name] : undefined;
  if (!tool) throw invalidParams(`Unknown tool: ${params.name}`);
  const args = params.arguments ?? {};
  if (!isObject(args)) throw invalidParams('arguments must be an object');
  const withTasks = Boolean(tool.taskSupport) && declaresTasks(caps);
  if (tool.taskSupport === 'required' && !withTasks) throw missingTasks(`${params.name} runs only as a task`);
  for (const capability of Object.keys(tool.needs ?? {})) {
    if (caps[capability] === undefined) {
      throw missingCapability({ [capability]: {} }, `${capability} (${params.name} asks the client for input)`);
    }
  }
  // A legacy `task` param (2025-11-25) is ignored: the server alone decides.
  return tool.call(args, { tasks: withTasks, params });
}

const METHODS = {
  'server/discover': () => ({
    supportedVersions: SUPPORTED_VERSIONS,
    capabilities: { tools: {}, extensions: { [TASKS]: {} } },
    ttlMs: LIST_TTL_MS,
    cacheScope: 'public',
    _meta: { [META_SERVER_INFO]: SERVER_INFO }
  }),

  'tools/list': () => ({ tools: toolList(), ttlMs: LIST_TTL_MS, cacheScope: 'public' }),

  'tools/call': callTool,

  'tasks/get': (params, caps) => {
    if (!declaresTasks(caps)) throw missingTasks('tasks/get');
    return detailedTask(lookupTask(params));
  },

  'tasks/update': (params, caps) => {
    if (!declaresTasks(caps)) throw missingTasks('tasks/update');
    const task = lookupTask(params);
    if (!isObject(params.inputResponses)) throw invalidParams('inputResponses must be an object');
    // Keys never issued, already answered or superseded are ignored; answers to outstanding ones must be objects.
    const answers = Object.entries(params.inputResponses).filter(([key]) => task.pending.has(key));
    for (const [key, answer] of answers) {
      if (!isObject(answer)) throw invalidParams(`inputResponses.${key} must be an object`);
    }
    for (const [key, answer] of answers) {
      task.pending.get(key).resolve(answer);
      task.pending.delete(key);
    }
    if (answers.length > 0) {
      if (task.pending.size === 0 && task.status === 'input_required') {
        task.status = 'working';
        task.statusMessage = 'resumed with the client input';
      }
      touch(task);
    }
    return {};
  },

  'tasks/cancel': (params, caps) => {
    if (!declaresTasks(caps)) throw missingTasks('tasks/cancel');
    settle(lookupTask(params), 'cancelled', { statusMessage: 'cancelled by the client' }); // no-op once terminal
    return {};
  }
};

// ---------------------------------------------------------------------------------------------------------------
// HTTP

const NAME_PARAM = {
  'tools/call': 'name',
  'prompts/get': 'name',
  'resources/read': 'uri',
  'tasks/get': 'taskId',
  'tasks/update': 'taskId',
  'tasks/cancel': 'taskId'
};

/** A header value as the client meant it: OWS trimmed, `=?base64?…?=` decoded; undefined if undecodable. */
function headerValue(raw) {
  const value = raw.replace(/^[ \t]+|[ \t]+$/g, '');
  const m = /^=\?base64\?(.*)\?=$/.exec(value);
  if (!m) return value;
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(m[1])) return undefined;
  const bytes = Buffer.from(m[1], 'base64');
  if (bytes.toString('base64') !== m[1]) return undefined;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/** SEP-2243 / SEP-2663 routing headers: Mcp-Method always, Mcp-Name for methods that name something. */
function checkRoutingHeaders(headers, method, params) {
  const sentMethod = headers['mcp-method'];
  if (sentMethod === undefined) throw new RpcError(HEADER_MISMATCH, 'Mcp-Method header is missing');
  if (sentMethod.trim() !== method) {
    throw new RpcError(HEADER_MISMATCH, `Mcp-Method header "${sentMethod}" does not match the body method "${method}"`);
  }
  const key = NAME_PARAM[method];
  if (!key || typeof params[key] !== 'string') return;
  const sentName = headers['mcp-name'];
  if (sentName === undefined) throw new RpcError(HEADER_MISMATCH, `Mcp-Name header is missing (params.${key} is set)`);
  if (headerValue(sentName) !== params[key]) {
    throw new RpcError(HEADER_MISMATCH, `Mcp-Name header does not match params.${key}`);
  }
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(new RpcError(-32600, 'Request body too large', undefined, 413));
        req.destroy();
      } else chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJson(res, status, body) {
  const payload = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) });
  res.end(payload);
}

async function handlePost(req, res) {
  let message;
  try {
    message = JSON.parse(await readBody(req));
  } catch (err) {
    const e = err instanceof RpcError ? err : new RpcError(-32700, 'Parse error: the body is not JSON');
    return sendJson(res, e.httpStatus, { jsonrpc: '2.0', id: null, error: e.toJSON() });
  }
  if (!isObject(message) || message.jsonrpc !== '2.0' || typeof message.method !== 'string') {
    const e = new RpcError(-32600, 'Invalid Request: one JSON-RPC request object per POST (no batches)');
    return sendJson(res, 400, { jsonrpc: '2.0', id: isObject(message) ? (message.id ?? null) : null, error: e.toJSON() });
  }
  if (message.id === undefined) {
    res.writeHead(202).end(); // notifications need no answer
    return;
  }
  const { id, method } = message;
  const params = isObject(message.params) ? message.params : {};
  try {
    const meta = isObject(params._meta) ? params._meta : undefined;
    const headerVersion = req.headers['mcp-protocol-version']?.trim();
    // A session-era client (an initialize, or an older revision in the header and no _meta) is told what is spoken.
    if (meta?.[META_VERSION] === undefined && (method === 'initialize' || LEGACY_VERSIONS.has(headerVersion))) {
      const requested = String(params.protocolVersion ?? headerVersion ?? 'unknown');
      throw new RpcError(UNSUPPORTED_VERSION, `Unsupported protocol version ${requested}: this server speaks only ${PROTOCOL_VERSION} (no initialize; use server/discover)`, { supported: SUPPORTED_VERSIONS, requested });
    }
    if (!headerVersion) throw new RpcError(HEADER_MISMATCH, 'MCP-Protocol-Version header is missing');
    if (!meta || meta[META_VERSION] === undefined || !isObject(meta[META_CAPABILITIES])) {
      throw new RpcError(INVALID_PARAMS, `Invalid params: _meta must carry ${META_VERSION} and ${META_CAPABILITIES}`, undefined, 400);
    }
    if (meta[META_VERSION] !== headerVersion) {
      throw new RpcError(HEADER_MISMATCH, 'MCP-Protocol-Version header does not match _meta protocolVersion');
    }
    if (!SUPPORTED_VERSIONS.includes(headerVersion)) {
      throw new RpcError(UNSUPPORTED_VERSION, 'Unsupported protocol version', { supported: SUPPORTED_VERSIONS, requested: String(headerVersion) });
    }
    checkRoutingHeaders(req.headers, method, params);
    const caps = meta[META_CAPABILITIES];
    if (method === 'subscriptions/listen') return listen(req, res, id, params, caps);
    const handler = Object.hasOwn(METHODS, method) ? METHODS[method] : undefined;
    if (!handler) throw new RpcError(METHOD_NOT_FOUND, `Method not found: ${method}`);
    const result = await handler(params, caps);
    sendJson(res, 200, { jsonrpc: '2.0', id, result: { resultType: 'complete', ...result } });
  } catch (err) {
    const e =
      err instanceof RpcError ? err : new RpcError(INTERNAL_ERROR, `Internal error: ${err?.message ?? err}`, undefined, 500);
    if (!(err instanceof RpcError)) console.error(err);
    if (res.headersSent) return res.end();
    sendJson(res, e.httpStatus, { jsonrpc: '2.0', id, error: e.toJSON() });
  }
}

/** DNS-rebinding protection: this server listens on loopback only, so Host (and Origin, if sent) must be loopback. */
const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);
function loopbackOnly(req) {
  const hostOf = (value) => {
    try {
      return new URL(value).hostname;
    } catch {
      return undefined;
    }
  };
  const host = hostOf(`http://${req.headers.host ?? ''}`);
  const origin = req.headers.origin;
  return LOOPBACK.has(host) && (origin === undefined || LOOPBACK.has(hostOf(origin)));
}

const server = http.createServer((req, res) => {
  const path = new URL(req.url, 'http://localhost').pathname;
  if (path !== '/mcp') return sendJson(res, 404, { error: 'not found: the MCP endpoint is /mcp' });
  if (!loopbackOnly(req)) return sendJson(res, 403, { error: 'forbidden: Host and Origin must be loopback' });
  if (req.method !== 'POST') {
    res.writeHead(405, { Allow: 'POST' }).end();
    return;
  }
  handlePost(req, res).catch((err) => {
    console.error(err);
    if (!res.headersSent) sendJson(res, 500, { jsonrpc: '2.0', id: null, error: { code: INTERNAL_ERROR, message: 'Internal error' } });
  });
});

const PORT = Number(process.env.PORT ?? 3000);
server.listen(PORT, '127.0.0.1', () => {
  console.log(`tasks-server (MCP ${PROTOCOL_VERSION}, ${TASKS}) listening on http://127.0.0.1:${server.address().port}/mcp`);
});
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}
