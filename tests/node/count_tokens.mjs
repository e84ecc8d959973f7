// o200k_base token counts for scripts/toolsearch_budget.py: reads a JSON array of strings on stdin and prints a
// JSON array of their token counts, in order. Counted with gpt-tokenizer's o200k_base encoding; special-token
// look-alikes (<|endoftext|> ...) are encoded as text, as the satellite does and as tests/node/token_counts.mjs counts.
//
// usage: echo '["hello world", ""]' | node tests/node/count_tokens.mjs      -> [2,0]
// needs tests/node/node_modules (npm ci --prefix tests/node); exits 3 with a message when gpt-tokenizer is missing,
// 2 when stdin is not a JSON array of strings.
let encode;
try {
  ({ encode } = await import('gpt-tokenizer/encoding/o200k_base'));
} catch (err) {
  console.error(`count_tokens: gpt-tokenizer is not installed (run \`npm ci --prefix tests/node\`): ${err.message}`);
  process.exit(3);
}

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
let texts;
try {
  texts = JSON.parse(Buffer.concat(chunks).toString('utf8'));
} catch (err) {
  console.error(`count_tokens: stdin is not JSON: ${err.message}`);
  process.exit(2);
}
if (!Array.isArray(texts) || !texts.every((t) => typeof t === 'string')) {
  console.error('count_tokens: stdin must be a JSON array of strings');
  process.exit(2);
}

const asText = { disallowedSpecial: new Set() };
process.stdout.write(JSON.stringify(texts.map((t) => encode(t, asText).length)) + '\n');
