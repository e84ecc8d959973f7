// The reference server's handshake-era fixtures, asked the 2026-07-28 way. A forwarder in front of the
// reference server (tests/conformance/upstream) for the conformance run's fourth pairing: a 2025-11-25 client,
// through the satellite, to a 2026-07-28 upstream.
//
// Why it exists: the 2025-11-25 scenarios that test server-to-client requests (tools-call-sampling,
// tools-call-elicitation, elicitation-sep1034-defaults, elicitation-sep1330-enums) and resource subscriptions
// (resources-subscribe, resources-unsubscribe) call fixtures that the reference server serves only on its
// handshake path. On its 2026-07-28 path the same tools run against an in-memory client that answers every
// server request with -32601, and it declares no resource subscriptions: no gateway can pass those scenarios
// against it, and a client of 2026-07-28 cannot either. This forwarder gives the 2026-07-28 path what a server of
// that revision would do instead, and nothing else:
// - `tools/call` of those four tools asks through an `input_required` result (SEP-2322) with the very request the
//   handshake-era tool sends, and on the retry answers with the text the handshake-era tool writes;
// - `server/discover` declares `resources.subscribe` (subscriptions are watched on `subscriptions/listen`, whose
//   `resourceSubscriptions` the reference server ignores: it never updates a resource anyway).
// Every other request, and everything of older revisions, passes through unchanged.
//   LISTEN=port TARGET=http://127.0.0.1:port node era-twin.mjs
import http from 'node:http';

const target = new URL(process.env.TARGET);
const listen = Number(process.env.LISTEN);

// Each tool: the request its handshake-era twin sends (from its arguments), and its answer from the client's.
const TWINS = {
  test_sampling: {
    ask: (args) => ({
      method: 'sampling/createMessage',
      params: { messages: [{ role: 'user', content: { type: 'text', text: args.prompt } }], maxTokens: 100 },
    }),
    text: (r) => `LLM response: ${r.content?.text || r.message?.content?.text || 'No response'}`,
  },
  test_elicitation: {
    ask: (args) => ({
      method: 'elicitation/create',
      params: {
        message: args.message,
        requestedSchema: {
          type: 'object',
          properties: { response: { type: 'string', description: "User's response" } },
          required: ['response'],
        },
      },
    }),
    text: (r) => `User response: action=${r.action}, content=${JSON.stringify(r.content || {})}`,
  },
  test_elicitation_sep1034_defaults: {
    ask: () => ({
      method: 'elicitation/create',
      params: {
        message: 'Please review and update the form fields with defaults',
        requestedSchema: {
          type: 'object',
          properties: {
            name: { type: 'string', description: 'User name', default: 'John Doe' },
            age: { type: 'integer', description: 'User age', default: 30 },
            score: { type: 'number', description: 'User score', default: 95.5 },
            status: { type: 'string', description: 'User status', enum: ['active', 'inactive', 'pending'], default: 'active' },
            verified: { type: 'boolean', description: 'Verification status', default: true },
          },
          required: [],
        },
      },
    }),
    text: (r) => `Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content || {})}`,
  },
  test_elicitation_sep1330_enums: {
    ask: () => ({
      method: 'elicitation/create',
      params: {
        message: 'Please select options from the enum fields',
        requestedSchema: {
          type: 'object',
          properties: {
            untitledSingle: { type: 'string', description: 'Select one option', enum: ['option1', 'option2', 'option3'] },
            titledSingle: {
              type: 'string',
              description: 'Select one option with titles',
              oneOf: [
                { const: 'value1', title: 'First Option' },
                { const: 'value2', title: 'Second Option' },
                { const: 'value3', title: 'Third Option' },
              ],
            },
            legacyEnum: {
              type: 'string',
              description: 'Select one option (legacy)',
              enum: ['opt1', 'opt2', 'opt3'],
              enumNames: ['Option One', 'Option Two', 'Option Three'],
            },
            untitledMulti: {
              type: 'array',
              description: 'Select multiple options',
              minItems: 1,
              maxItems: 3,
              items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
            },
            titledMulti: {
              type: 'array',
              description: 'Select multiple options with titles',
              minItems: 1,
              maxItems: 3,
              items: {
                anyOf: [
                  { const: 'value1', title: 'First Choice' },
                  { const: 'value2', title: 'Second Choice' },
                  { const: 'value3', title: 'Third Choice' },
                ],
              },
            },
          },
          required: [],
        },
      },
    }),
    text: (r) => `Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content || {})}`,
  },
};

function answer(res, id, result) {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', id, result: { resultType: 'complete', ...result } }));
}

// A tool call of one of the twins: the question first, the handshake-era tool's answer on the retry.
function twinCall(res, id, params) {
  const twin = TWINS[params.name];
  const response = params.inputResponses?.request;
  if (response) {
    answer(res, id, { content: [{ type: 'text', text: twin.text(response) }] });
  } else {
    answer(res, id, { resultType: 'input_required', inputRequests: { request: twin.ask(params.arguments || {}) } });
  }
}

// Pass a request on; `body` is the buffered body (or null to stream it), `edit` rewrites a JSON answer's result.
function forward(req, res, body, edit) {
  const headers = { ...req.headers };
  if (body !== null) headers['content-length'] = Buffer.byteLength(body);
  const upstream = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (reply) => {
      const json = (reply.headers['content-type'] || '').startsWith('application/json');
      if (!edit || !json) {
        res.writeHead(reply.statusCode, reply.headers);
        reply.pipe(res);
        return;
      }
      const chunks = [];
      reply.on('data', (c) => chunks.push(c));
      reply.on('end', () => {
        const message = JSON.parse(Buffer.concat(chunks).toString());
        if (message.result) edit(message.result);
        const text = JSON.stringify(message);
        const { 'content-length': _, 'transfer-encoding': __, ...rest } = reply.headers;
        res.writeHead(reply.statusCode, { ...rest, 'content-length': Buffer.byteLength(text) });
        res.end(text);
      });
    },
  );
  upstream.on('error', (err) => {
    if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`era-twin: ${err.message}`);
  });
  req.on('aborted', () => upstream.destroy());
  res.on('close', () => upstream.destroy());
  if (body === null) req.pipe(upstream);
  else upstream.end(body);
}

const server = http.createServer((req, res) => {
  if (req.method !== 'POST' || req.headers['mcp-protocol-version'] !== '2026-07-28') {
    forward(req, res, null, null);
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString();
    let message;
    try {
      message = JSON.parse(body);
    } catch {
      forward(req, res, body, null);
      return;
    }
    if (message?.method === 'tools/call' && TWINS[message.params?.name]) {
      twinCall(res, message.id, message.params);
    } else if (message?.method === 'server/discover') {
      forward(req, res, body, (result) => {
        result.capabilities = result.capabilities || {};
        result.capabilities.resources = { ...(result.capabilities.resources || {}), subscribe: true };
      });
    } else {
      forward(req, res, body, null);
    }
  });
});
server.listen(listen, '127.0.0.1', () => console.log(`era-twin on ${listen} -> ${target.href}`));
