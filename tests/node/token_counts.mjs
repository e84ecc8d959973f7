// Reference token counts for tests/tokens.rs (SB §15): for every tool of the shared corpus, the length of
// gpt-tokenizer's encoding (o200k_base, its default) of JS JSON.stringify({name, description, parameters}, null, 2).
// Special-token look-alikes are encoded as text (disallowedSpecial: empty set), as the satellite does.
//
// usage: node tests/node/token_counts.mjs <corpus.jsonl> <out.json>   (scripts/test.sh runs it)
import { readFileSync, writeFileSync } from 'node:fs';
import { encode } from 'gpt-tokenizer';
import { encode as encodeO200k } from 'gpt-tokenizer/encoding/o200k_base';

const [corpusPath, outPath] = process.argv.slice(2);
if (!corpusPath || !outPath) {
  console.error('usage: node token_counts.mjs <corpus.jsonl> <out.json>');
  process.exit(2);
}

const asText = { disallowedSpecial: new Set() };
// The package's default encoding is what the reference counts with; it must be o200k_base (OQ-44).
const probe = 'Tokenizer probe: 東京 🚀 <|endoftext|> {"type": "object"}';
if (encode(probe, asText).join() !== encodeO200k(probe, asText).join()) {
  console.error('gpt-tokenizer: the default encoding is not o200k_base');
  process.exit(1);
}
const { version } = JSON.parse(readFileSync(new URL('./node_modules/gpt-tokenizer/package.json', import.meta.url), 'utf8'));
const tools = [];
for (const line of readFileSync(corpusPath, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const tool = JSON.parse(line);
  const text = JSON.stringify(
    { name: tool.name, description: tool.description, parameters: tool.inputSchema ?? {} },
    null,
    2,
  );
  tools.push({ server: tool.server, name: tool.name, count: encode(text, asText).length });
}

// Number literals as servers may send them, and how JSON.stringify prints what JSON.parse made of them: the
// satellite's printer must agree beyond the few floats of the corpus. Seeded, so the fixture is stable.
let seed = 0x9e3779b97f4a7c15n;
const next = () => {
  seed ^= (seed << 13n) & 0xffffffffffffffffn;
  seed ^= seed >> 7n;
  seed ^= (seed << 17n) & 0xffffffffffffffffn;
  return seed;
};
const view = new DataView(new ArrayBuffer(8));
const numbers = [];
for (let i = 0; i < 3000; i++) {
  view.setBigUint64(0, next());
  const bits = view.getFloat64(0);
  const scale = Number(next() % 60n) - 30;
  const x = [bits, Number(next() % 1000000n) * 10 ** scale, Number(next() % 100n) / 100][i % 3];
  if (!Number.isFinite(x)) continue;
  const digits = 1 + Number(next() % 21n);
  for (const literal of [String(x), x.toExponential(digits - 1), x.toPrecision(digits)]) {
    numbers.push([literal, JSON.stringify(JSON.parse(literal))]);
  }
}
numbers.push(...['1.0', '-0.0', '1e21', '1E-7', '123456789012345678901234567890', '0.1e-5', '5e-324', '1.7976931348623157e308']
  .map((literal) => [literal, JSON.stringify(JSON.parse(literal))]));

// Tools the corpus lacks: special-token look-alikes, control characters, array-index keys, odd numbers, no
// description. Each is the JSON text of a tools/list entry, parsed on both sides.
const extras = [
  '{"name":"special","description":"Ends with <|endoftext|> and <|im_start|>user<|im_sep|>","inputSchema":{}}',
  '{"name":"control","description":"tab\\there\\u0001\\u001f\\r\\n\\f\\b quote\\" slash\\\\ /path \\u2028 é 東京 🚀","inputSchema":{"type":"object"}}',
  '{"name":"indices","description":"","inputSchema":{"properties":{"b":{},"10":{"default":1.50},"2":{"enum":[1e21,1e-7,-0.0,0.1]},"01":[]}}}',
  '{"name":"no-description","inputSchema":{"type":"object","properties":{"n":{"type":"integer","maximum":9007199254740993}}}}',
  '{"name":"empty","description":"   ","inputSchema":{"a":[],"b":{},"c":[[],[{}]],"d":null,"e":true}}',
].map((json) => {
  const tool = JSON.parse(json);
  const text = JSON.stringify({ name: tool.name, description: tool.description, parameters: tool.inputSchema ?? {} }, null, 2);
  return { json, text, count: encode(text, asText).length };
});

const fixture = { encoding: 'o200k_base', generator: `gpt-tokenizer@${version}`, tools, extras, numbers };
writeFileSync(outPath, JSON.stringify(fixture) + '\n');
console.log(`token_counts: ${tools.length} tools, ${numbers.length} number literals -> ${outPath}`);
