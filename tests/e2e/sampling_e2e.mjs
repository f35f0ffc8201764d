// Sampling controls and the request-field rule, against a real `kvfence serve` driven by the
// official `openai` npm client.
//
//   node sampling_e2e.mjs --kvfence EXE --node-modules DIR --work DIR --fields docs/API_FIELDS.md
//
// 1. min_p, presence_penalty, frequency_penalty, repetition_penalty and logit_bias each change a
//    greedy (or seeded) completion, and each served completion — streamed or not, every choice
//    of n = 2, alone and 8 at once — equals `kvfence run` with the same options, token id for
//    token id and logprob for logprob. presence/frequency and logit_bias are also checked against
//    a reference computed here from the top-20 logprobs (shift-invariant, so the logprobs fix
//    them); min_p against the drawn tokens' logprobs.
// 2. Bad values of each field get a 400 naming it, and nothing runs; top_k -1 is off.
// 3. docs/API_FIELDS.md's tables, row by row: every refused field's example gets its 400 naming
//    the field (its accepted value a 200), every implemented field's example a 200.
// Prints TAP; exits 1 on any failure. The server is killed on any exit.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'node-modules', 'work', 'fields']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = args.kvfence;
const entry = path.join(args['node-modules'], 'openai', 'index.mjs');
if (!fs.existsSync(entry)) { console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`); process.exit(1); }
const { default: OpenAI } = await import(pathToFileURL(entry).href);
const W = args.work;
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the suite ran past 400 s'); killAll(); process.exit(1); }, 400000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

// ---- the server ----
const MODEL = path.join(W, 'tiny.gguf');
execFileSync(KVF, ['mkmodel', MODEL, '--shape', 'tiny', '--type', 'q8_0', '--seed', '5'], { stdio: 'ignore' });
const child = spawn(KVF, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--model', MODEL, '--kv-memory', '16M'],
  { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1' } });
children.add(child);
let err = '', exited = null;
child.stderr.on('data', (d) => { err += d; });
const exitP = new Promise((r) => child.on('exit', (code, sig) => { exited = { code, sig }; children.delete(child); r(exited); }));
let port = 0;
for (const until = Date.now() + 90000; !port; await sleep(20)) {
  const m = err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
  if (m) port = Number(m[1]);
  if (exited || Date.now() > until) { console.log(`Bail out! the server did not start: ${err}`); process.exit(1); }
}
const URL_ = `http://127.0.0.1:${port}`;
const client = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
async function post(p, body) {
  const r = await fetch(URL_ + p, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE */ }
  return { status: r.status, text, json };
}
async function submits() {
  const text = await (await fetch(`${URL_}/metrics`)).text();
  let s = 0;
  for (const m of text.matchAll(/^kvfence_requests_total\{[^}]*outcome="ok"[^}]*\} (\d+)$/gm)) s += Number(m[1]);
  return s;
}

// ---- the reference: kvfence run with the same options ----
const PROMPT = 'the cat sat on the mat and the cat';
const MAX = 20;
function runRef(s) {
  const a = ['run', '--model', MODEL, '--prompt', PROMPT, '--max-tokens', String(MAX), '--threads', '1',
    '--temperature', String(s.temperature ?? 0), '--seed', String(s.seed ?? 1), '--print-token-ids', '--print-logprobs'];
  if (s.min_p !== undefined) a.push('--min-p', String(s.min_p));
  if (s.presence_penalty !== undefined) a.push('--presence-penalty', String(s.presence_penalty));
  if (s.frequency_penalty !== undefined) a.push('--frequency-penalty', String(s.frequency_penalty));
  if (s.repetition_penalty !== undefined) a.push('--repetition-penalty', String(s.repetition_penalty));
  if (s.logit_bias) a.push('--logit-bias', Object.entries(s.logit_bias).map(([k, v]) => `${k}:${v}`).join(','));
  const lines = execFileSync(KVF, a, { encoding: 'utf8' }).split('\n');
  const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
  const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
  return { prompt: nums(lines[at]), ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround) };
}
const idOf = (t) => { const m = /^token_id:(\d+)$/.exec(t); assert.ok(m, `not a token id: ${t}`); return Number(m[1]); };

// A served completion's choices: ids, float32 logprobs, and the top-20 maps per token.
async function served(s, { stream = false, nChoices = 1 } = {}) {
  const body = { model: 'm', prompt: PROMPT, max_tokens: MAX, logprobs: 20, return_tokens_as_token_ids: true, n: nChoices, ...s };
  const ch = Array.from({ length: nChoices }, () => ({ ids: [], lps: [], tops: [] }));
  const take = (c) => {
    const o = ch[c.index];
    o.ids.push(...c.logprobs.tokens.map(idOf));
    o.lps.push(...c.logprobs.token_logprobs.map(Math.fround));
    o.tops.push(...c.logprobs.top_logprobs.map((t) => Object.entries(t).map(([k, v]) => [idOf(k), v])));
  };
  if (!stream) {
    const r = await client.completions.create(body);
    for (const c of r.choices) take(c);
  } else {
    for await (const chunk of await client.completions.create({ ...body, stream: true }))
      for (const c of chunk.choices) if (c.logprobs) take(c);
  }
  return ch;
}
const same = (got, ref, what) => {
  assert.deepEqual(got.ids, ref.ids, `${what}: token ids`);
  assert.deepEqual(got.lps, ref.lps, `${what}: logprobs`);
};

// Greedy under presence/frequency/bias from the raw top-20 logprobs: each token is the argmax of
// lp + bias − f × count − p × [count > 0] over the top 20, wherever that argmax is certain (it
// beats the 20th raw logprob plus the largest bias, so nothing outside the 20 can pass it).
function checkShiftInvariant(c, s, what) {
  const count = new Map();
  const bias = new Map(Object.entries(s.logit_bias ?? {}).map(([k, v]) => [Number(k), v]));
  const maxBias = Math.max(0, ...bias.values());
  let checked = 0;
  for (let i = 0; i < c.ids.length; i++) {
    const score = (id, lp) => {
      const k = count.get(id) ?? 0;
      return lp + (bias.get(id) ?? 0) - (s.frequency_penalty ?? 0) * k - (k ? (s.presence_penalty ?? 0) : 0);
    };
    const sc = c.tops[i].map(([id, lp]) => [id, score(id, lp)]).sort((a, b) => b[1] - a[1]);
    const floor = Math.min(...c.tops[i].map(([, lp]) => lp)) + maxBias;
    if (sc[0][1] > floor + 1e-3 && sc[0][1] - sc[1][1] > 1e-3) {
      assert.equal(c.ids[i], sc[0][0], `${what}: token ${i} is ${c.ids[i]}, the reference's is ${sc[0][0]}`);
      checked++;
    }
    count.set(c.ids[i], (count.get(c.ids[i]) ?? 0) + 1);
  }
  assert.ok(checked >= c.ids.length / 2, `${what}: only ${checked} of ${c.ids.length} tokens could be checked`);
}

const base = runRef({});
const controls = [
  { name: 'presence_penalty', s: { presence_penalty: 2 }, shift: true },
  { name: 'frequency_penalty', s: { frequency_penalty: 1.5 }, shift: true },
  { name: 'repetition_penalty', s: { repetition_penalty: 3 } },
  { name: 'logit_bias', s: { logit_bias: { [String(base.ids[0] === 7 ? 8 : 7)]: 100, [String(base.ids[0])]: -100 } } },
  { name: 'logit_bias -100', s: { logit_bias: { [String(base.ids[0])]: -100 } }, shift: true },
  { name: 'min_p', s: { temperature: 1.5, seed: 11, min_p: 0.3 }, plain: { temperature: 1.5, seed: 11 } },
  { name: 'all together', s: { temperature: 0.9, seed: 5, min_p: 0.05, presence_penalty: 0.5, frequency_penalty: 0.3, repetition_penalty: 1.3, logit_bias: { 9: 3 } }, plain: { temperature: 0.9, seed: 5 } },
];

await test('the baseline (greedy, no controls) equals kvfence run', async () => {
  same((await served({ temperature: 0 }))[0], base, 'baseline');
});

for (const c of controls) {
  await test(`${c.name}: changes the output, equals kvfence run (plain, streamed, n = 2), as specified`, async () => {
    const s = { temperature: 0, ...c.s };
    const ref = runRef(s);
    const plainRef = c.plain ? runRef(c.plain) : base;
    assert.notDeepEqual(ref.ids, plainRef.ids, `${c.name} changes nothing on this prompt`);
    const [one] = await served(s);
    same(one, ref, `${c.name}`);
    same((await served(s, { stream: true }))[0], ref, `${c.name} streamed`);
    const two = await served(s, { nChoices: 2 });
    same(two[0], ref, `${c.name} n=2 choice 0`);
    if ((s.temperature ?? 0) > 0) same(two[1], runRef({ ...s, seed: (s.seed ?? 1) + 1 }), `${c.name} n=2 choice 1 (seed + 1)`);
    else same(two[1], ref, `${c.name} n=2 choice 1`);
    if (c.shift) checkShiftInvariant(one, s, c.name);
    if (c.name === 'logit_bias') {
      const [up] = Object.entries(s.logit_bias).find(([, v]) => v === 100);
      assert.ok(one.ids.every((t) => t === Number(up)), 'a +100 bias makes its token every greedy token');
    }
    if (c.name === 'logit_bias -100') assert.ok(!one.ids.includes(base.ids[0]), 'a -100 bias keeps its token out');
    if (c.name === 'min_p') {
      // At temperature T, p_i / p_max = exp((lp_i − lp_max) / T): every drawn token passes the cut.
      for (let i = 0; i < one.ids.length; i++) {
        const top = one.tops[i][0][1];
        assert.ok((one.lps[i] - top) / s.temperature >= Math.log(s.min_p) - 1e-4, `token ${i} is below min_p`);
      }
    }
  });
}

await test('the controls are per request: 8 concurrent requests with different controls each equal kvfence run', async () => {
  const jobs = controls.concat(controls.slice(0, 2)).map(async (c, k) => {
    const s = { temperature: 0, ...c.s };
    same((await served(s, { stream: k % 2 === 1 }))[0], runRef(s), `request ${k} (${c.name})`);
  });
  await Promise.all(jobs);
});

await test('chat: the controls reach the draw (presence_penalty and logit_bias change the output)', async () => {
  const msgs = [{ role: 'user', content: PROMPT }];
  const get = async (extra) => (await client.chat.completions.create({ model: 'm', messages: msgs, max_tokens: MAX, temperature: 0, ...extra })).choices[0].message.content;
  const plain = await get({});
  assert.notEqual(await get({ repetition_penalty: 3, presence_penalty: 2, frequency_penalty: 2 }), plain);
  const r = await client.chat.completions.create({ model: 'm', messages: msgs, max_tokens: 4, temperature: 0, logprobs: true, logit_bias: { 7: 100 }, return_tokens_as_token_ids: true });
  assert.deepEqual(r.choices[0].logprobs.content.map((t) => idOf(t.token)), [7, 7, 7, 7]);
});

await test('bad values get a 400 naming the field, and nothing runs; top_k -1 is off', async () => {
  const bad = [
    ['min_p', 1.5], ['min_p', -0.1], ['min_p', 'x'], ['presence_penalty', 2.5], ['presence_penalty', -3],
    ['frequency_penalty', '1'], ['frequency_penalty', 2.0001], ['repetition_penalty', 0], ['repetition_penalty', -1],
    ['logit_bias', [1, 2]], ['logit_bias', { abc: 1 }], ['logit_bias', { '-1': 1 }], ['logit_bias', { '01': 1 }],
    ['logit_bias', { 5: 100.5 }], ['logit_bias', { 5: '1' }], ['logit_bias', { 99999999: 1 }],
    ['logit_bias', Object.fromEntries(Array.from({ length: 301 }, (_, i) => [String(i), 1]))], ['top_k', -2],
  ];
  const before = await submits();
  for (const [k, v] of bad) {
    for (const p of ['/v1/completions', '/v1/chat/completions']) {
      const body = p.endsWith('chat/completions') ? { messages: [{ role: 'user', content: 'hi' }] } : { prompt: 'hi' };
      const r = await post(p, { ...body, max_tokens: 2, [k]: v });
      assert.equal(r.status, 400, `${p} ${k}=${JSON.stringify(v).slice(0, 40)}: ${r.text}`);
      assert.equal(r.json.error.param, k, `${k}: ${r.text}`);
    }
  }
  assert.equal(await submits(), before, 'a refused request ran');
  const a = await post('/v1/completions', { prompt: PROMPT, max_tokens: 8, temperature: 1, seed: 3, top_k: -1 });
  const b = await post('/v1/completions', { prompt: PROMPT, max_tokens: 8, temperature: 1, seed: 3 });
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.choices[0].text, b.json.choices[0].text);
});

// ---- docs/API_FIELDS.md against the server ----
function readTables(file) {
  const rows = { implemented: [], refused: [] };
  let section = null;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line.startsWith('## Implemented')) section = 'implemented';
    else if (line.startsWith('## Refused')) section = 'refused';
    else if (line.startsWith('## ')) section = null;
    const m = section && /^\| `([a-z_]+)` \| (both|completions|chat) \| `(.*)` \| (.*) \|$/.exec(line);
    if (!m) continue;
    const neutral = /^`(.*)`$/.exec(m[4].trim());
    rows[section].push({ field: m[1], where: m[2], example: JSON.parse(m[3]), neutral: section === 'refused' && neutral ? JSON.parse(neutral[1]) : undefined });
  }
  return rows;
}
const fields = readTables(args.fields);
await test(`docs/API_FIELDS.md: ${fields.refused.length} refused and ${fields.implemented.length} implemented rows read`, async () => {
  assert.ok(fields.refused.length >= 40 && fields.implemented.length >= 20, JSON.stringify(fields).slice(0, 200));
  for (const f of ['echo', 'suffix', 'tools', 'tool_choice', 'guided_json']) assert.ok(fields.refused.some((r) => r.field === f), `${f} is not listed as refused`);
  for (const f of ['response_format', 'grammar']) assert.ok(fields.implemented.some((r) => r.field === f), `${f} is not listed as implemented`);
});
const endpoints = (where) => (where === 'both' ? ['completions', 'chat'] : [where]);
const bodyFor = (ep) => (ep === 'chat' ? { model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 } : { model: 'm', prompt: 'hi', max_tokens: 2 });
await test('docs/API_FIELDS.md: every refused field gets its 400 naming it; its accepted value a 200', async () => {
  const before = await submits();
  for (const r of fields.refused) {
    for (const ep of endpoints(r.where)) {
      const p = `/v1/${ep === 'chat' ? 'chat/completions' : 'completions'}`;
      const got = await post(p, { ...bodyFor(ep), [r.field]: r.example });
      assert.equal(got.status, 400, `${p} ${r.field}: ${got.text}`);
      assert.equal(got.json.error.param, r.field, `${p} ${r.field}: ${got.text}`);
      assert.equal(got.json.error.code, 'unsupported_field', `${p} ${r.field}: ${got.text}`);
    }
  }
  assert.equal(await submits(), before, 'a refused request ran');
  for (const r of fields.refused) {
    if (r.neutral === undefined) continue;
    for (const ep of endpoints(r.where)) {
      const p = `/v1/${ep === 'chat' ? 'chat/completions' : 'completions'}`;
      const got = await post(p, { ...bodyFor(ep), [r.field]: r.neutral });
      assert.equal(got.status, 200, `${p} ${r.field}=${JSON.stringify(r.neutral)}: ${got.text}`);
    }
  }
});
await test('docs/API_FIELDS.md: every implemented field is accepted', async () => {
  for (const r of fields.implemented) {
    for (const ep of endpoints(r.where)) {
      const p = `/v1/${ep === 'chat' ? 'chat/completions' : 'completions'}`;
      const body = { ...bodyFor(ep), [r.field]: r.example };
      if (r.field === 'top_logprobs') body.logprobs = true;
      const got = await post(p, body);
      assert.equal(got.status, 200, `${p} ${r.field}=${JSON.stringify(r.example)}: ${got.text}`);
    }
  }
});
await test('fields outside both APIs stay ignored', async () => {
  const got = await post('/v1/completions', { prompt: 'hi', max_tokens: 2, x_custom_extra: { a: 1 } });
  assert.equal(got.status, 200, got.text);
});

await test('SIGTERM: exit 0, nothing reported by the sanitizers', async () => {
  child.kill('SIGTERM');
  const ex = await Promise.race([exitP, sleep(30000).then(() => null)]);
  assert.ok(ex, 'no exit in 30 s');
  assert.equal(ex.code, 0, err.slice(-3000));
  assert.doesNotMatch(err, /AddressSanitizer|LeakSanitizer|runtime error/, err.slice(-3000));
});

console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
