// A forwarder with two uses in the conformance run; it changes nothing else: method, path, Host, Origin,
// every other header and both bodies pass through as streams.
// - In front of the satellite: the conformance CLI cannot send an Authorization header, and the satellite
//   needs one on every request. With USER_TOKEN and INSTANCE_TOKENS (JSON: instance path -> token) set,
//   /i/{path}/... gets that instance's token, every other path the user token.
// - In front of the reference server: with HANDSHAKE_ONLY=1 it refuses 2026-07-28 requests the way a
//   server that predates that revision does, so the satellite meets a handshake-era upstream.
//   LISTEN=port TARGET=http://127.0.0.1:port [USER_TOKEN=.. INSTANCE_TOKENS={..}] [HANDSHAKE_ONLY=1] node auth-proxy.mjs
import http from 'node:http';

const target = new URL(process.env.TARGET);
const listen = Number(process.env.LISTEN);
const instanceTokens = JSON.parse(process.env.INSTANCE_TOKENS || '{}');

const server = http.createServer((req, res) => {
  if (process.env.HANDSHAKE_ONLY && req.headers['mcp-protocol-version'] === '2026-07-28') {
    res.writeHead(400, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Bad Request: Unsupported protocol version: 2026-07-28' } }));
    req.resume();
    return;
  }
  const instance = req.url.match(/^\/i\/([^/?]+)/);
  const token = instance ? instanceTokens[instance[1]] : process.env.USER_TOKEN;
  const headers = token ? { ...req.headers, authorization: `Bearer ${token}` } : { ...req.headers };
  const upstream = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    },
  );
  upstream.on('error', (err) => {
    res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`auth-proxy: ${err.message}`);
  });
  req.on('aborted', () => upstream.destroy());
  res.on('close', () => upstream.destroy());
  req.pipe(upstream);
});
server.listen(listen, '127.0.0.1', () => console.log(`auth-proxy on ${listen} -> ${target.href}`));
