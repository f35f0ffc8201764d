// Provenance and the canary on the real server, driven by the official `openai` npm client.
// `kvfence serve` (or, with --topology split, `kvfence router` over a prefill and a decode worker)
// runs with tenant keys, admin keys, --log-commits and --canary-interval 1:
//   - a completion asked with `X-Kvfence-Provenance: 1` carries its provenance in that header;
//     every page it names (page, tag, checksum), its request, writer epoch, grant nonce and token
//     counts are those of the decode worker's own commit line for that request (--log-commits);
//     asked without the header, no header comes; a stream asked with it ends with the record as
//     an SSE comment before [DONE] (which the openai client skips);
//   - GET /admin/provenance/{id}: the same record with an admin key; 403 with a tenant's key,
//     401 without a key; 404 for an id never served; 400 for what is not an id; a huge id 4xx;
//   - the request's log line carries the record's brief form (ids and numbers only);
//   - the canary under load: runs counted, no failure, /health ok with its figures, and
//     /metrics (canary and provenance series) valid under `promtool check metrics`.
// --mutant unverified|binary (make canary-mutant, not in make test): a prefill forging stale
// writes (KVF_TEST_FORGE: another tenant's page bytes written over a granted page) against a
// decode that does not check them — `unverified`: the test build with its checks off
// (KVF_TEST_UNVERIFIED=1); `binary`: --kvfence is a mutant build (e.g. -DKVF_MUTANT=
// no_checksum_check, docs/MUTANTS.md) and decode runs as built. The canary counts failures,
// /health answers 503 "degraded" with the reason, and the failing response's provenance is
// logged. TAP on stdout.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'node-modules', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = args.kvfence;
const TOPOLOGY = args.topology ?? 'serve';
const MUTANT = args.mutant ?? '';
if (!['', 'unverified', 'binary'].includes(MUTANT)) { console.log(`Bail out! --mutant ${MUTANT}: unverified or binary`); process.exit(1); }
if (!['serve', 'split'].includes(TOPOLOGY)) { console.log(`Bail out! --topology ${TOPOLOGY}: serve or split`); process.exit(1); }
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
setTimeout(() => { console.log('Bail out! the suite ran past 220 s'); killAll(); process.exit(1); }, 220000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  try { await fn(); console.log(`ok ${n} - ${name}`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

const DATA = path.join(W, 'data');
const KEY_T = 'sk-tenant-prov-4c1d9e', KEY_ADMIN = 'sk-admin-prov-9a7f21';
const KEYS = path.join(W, 'keys.txt'), AKEYS = path.join(W, 'admin.txt');
fs.writeFileSync(KEYS, `${KEY_T} alpha\n`, { mode: 0o600 });
fs.writeFileSync(AKEYS, `${KEY_ADMIN} ops\n`, { mode: 0o600 });

function launch(argv, env = {}) {
  const c = spawn(KVF, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1', ...env } });
  children.add(c);
  const p = { child: c, err: '', exited: null };
  c.stderr.on('data', (d) => { p.err += d; });
  p.exitP = new Promise((r) => c.on('exit', (code, sig) => { p.exited = { code, sig }; children.delete(c); r(p.exited); }));
  return p;
}
async function waitErr(p, re, what) {
  for (let i = 0; ; i++) {
    const m = p.err.match(re);
    if (m) return m;
    if (p.exited || i > 3000) { console.log(`Bail out! ${what} did not start: ${p.err}`); process.exit(1); }
    await sleep(20);
  }
}

const front_flags = ['--api-keys', KEYS, '--admin-keys', AKEYS, '--canary-interval', '1'];
const mutant_env = MUTANT === 'unverified' ? { KVF_TEST_UNVERIFIED: '1', KVF_TEST_FORGE: 'every=2,token=5' }
  : MUTANT === 'binary' ? { KVF_TEST_FORGE: 'every=2,token=5' } : {};
const procs = [];
let decodeProc;
if (TOPOLOGY === 'serve') {
  decodeProc = launch(['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--data-dir', DATA, '--kv-memory', '64M', '--log-commits', ...front_flags], mutant_env);
  procs.push(decodeProc);
} else {
  const MODEL = path.join(W, 'hist.gguf'), CKEY = path.join(W, 'cluster.key');
  spawnSync(KVF, ['mkmodel', MODEL, '--shape', 'hist'], { stdio: 'ignore' });
  spawnSync(KVF, ['keygen', CKEY], { stdio: 'ignore' });
  const env = { KVFENCE_CLUSTER_KEY_FILE: CKEY };
  const net = await import('node:net');
  const free = () => new Promise((r) => { const srv = net.createServer(); srv.listen(0, '127.0.0.1', () => { const q = srv.address().port; srv.close(() => r(q)); }); });
  const [pp, dp] = [await free(), await free()];
  const pre = launch(['prefill', '--model', MODEL, '--listen', `127.0.0.1:${pp}`, '--threads', '1'], { ...env, ...mutant_env });
  await waitErr(pre, /listening \S+ \d+/, 'prefill');
  decodeProc = launch(['decode', '--model', MODEL, '--listen', `127.0.0.1:${dp}`, '--threads', '1', '--kv-memory', '64M', '--log-commits'], { ...env, ...mutant_env });
  await waitErr(decodeProc, /listening \S+ \d+/, 'decode');
  procs.push(pre, decodeProc, launch(['router', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--prefill', `127.0.0.1:${pp}`,
    '--decode', `127.0.0.1:${dp}`, ...front_flags], env));
}
const front = procs[procs.length - 1];
const port = Number((await waitErr(front, /listening on http:\/\/127\.0\.0\.1:(\d+)/, TOPOLOGY))[1]);
const url = `http://127.0.0.1:${port}`;
const adminH = { Authorization: `Bearer ${KEY_ADMIN}` };
const health = async () => (await fetch(`${url}/health?detail=1`, { headers: adminH })).json();
for (let i = 0; ; i++) {
  const h = await health().catch(() => ({}));
  if (h.prefill_up && (TOPOLOGY === 'serve' || ((h.workers ?? []).length === 2 && h.workers.every((w) => w.up)))) break;
  if (i > 1500) { console.log(`Bail out! not up: ${JSON.stringify(h)}`); process.exit(1); }
  await sleep(20);
}
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY_T, maxRetries: 0, timeout: 60000 });
const hasPages = (rec) => rec && Array.isArray(rec.pages) && rec.pages.length >= 1;

// The decode worker's commit lines (--log-commits), by request id: every page's tag and checksum.
function commitsOf(err) {
  const by = new Map();
  for (const m of err.matchAll(/kvfence decode: commit decode=(\w+) req=(\w+) prefill=(\S+) peer=(\d+) epoch=(\d+) nonce=(\w+) tenant=(\d+) tokens=(\d+)\/(\d+) verified=(\d) pages=(\d+) digest=(\w+) from=(\d+) page:tag:checksum((?: \d+:\w+:\w+)*)/g)) {
    const rec = by.get(m[2]) ?? { decode: m[1], prefill: m[3], epoch: Number(m[5]), nonce: m[6], tenant: Number(m[7]), verified_tokens: Number(m[8]), granted: Number(m[9]), verified: m[10] === '1', n_pages: Number(m[11]), digest: m[12], pages: [] };
    for (const t of m[14].trim().split(' ').filter(Boolean)) { const [page, tag, checksum] = t.split(':'); rec.pages.push({ page: Number(page), tag, checksum }); }
    by.set(m[2], rec);
  }
  return by;
}
function checkAgainstDecode(rec) {
  const c = commitsOf(decodeProc.err).get(rec.request);
  assert.ok(c, `no commit line of request ${rec.request} in the decode worker's log`);
  assert.equal(rec.decode.id, c.decode);
  assert.equal(rec.prefill.addr, c.prefill);
  assert.equal(rec.prefill.epoch, c.epoch);
  assert.equal(rec.grant.nonce, c.nonce);
  assert.equal(rec.grant.tokens, c.granted);
  assert.equal(rec.verified.tokens, c.verified_tokens);
  assert.equal(rec.verified.ok, c.verified);
  assert.equal(rec.verified.pages, c.n_pages);
  assert.equal(rec.verified.digest, c.digest);
  assert.deepEqual(rec.pages, c.pages.slice(0, 32));
  if (TOPOLOGY === 'split') assert.match(rec.decode.addr, /^127\.0\.0\.1:\d+$/);
  return c;
}

let firstId = null;
if (!MUTANT) await test('X-Kvfence-Provenance: 1 → the header names the pages, tags and checksums decode verified (its own commit line)', async () => {
  // A prompt of several pages (16 tokens a page).
  const prompt = 'red blue green '.repeat(14);
  const { data, response } = await client.completions.create({ model: 'm', prompt, max_tokens: 4, temperature: 0 }, { headers: { 'X-Kvfence-Provenance': '1' } }).withResponse();
  const h = response.headers.get('x-kvfence-provenance');
  assert.ok(h, 'no X-Kvfence-Provenance header');
  const prov = JSON.parse(h);
  assert.equal(prov.id, data.id);
  assert.equal(prov.choices.length, 1);
  const rec = prov.choices[0];
  assert.ok(hasPages(rec) && rec.pages.length >= 2, h);
  assert.equal(rec.verified.ok, true);
  assert.equal(rec.verified.tokens, data.usage.prompt_tokens);
  assert.equal(rec.grant.tokens, data.usage.prompt_tokens);
  assert.equal(rec.grant.tenant, 1);
  await sleep(200); // the commit line is written by the decode process
  const c = checkAgainstDecode(rec);
  assert.equal(c.tenant, 1);
  for (const p of rec.pages) assert.match(p.tag, /^[0-9a-f]{16}$/);
  firstId = data.id;
});

if (!MUTANT) await test('without the header, no provenance header; n=2: one record per choice', async () => {
  const { response } = await client.completions.create({ model: 'm', prompt: 'red red blue', max_tokens: 2 }).withResponse();
  assert.equal(response.headers.get('x-kvfence-provenance'), null);
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY_T}`, 'X-Kvfence-Provenance': '1' }, body: JSON.stringify({ prompt: 'red red blue', max_tokens: 2, n: 2 }) });
  const prov = JSON.parse(r.headers.get('x-kvfence-provenance'));
  assert.deepEqual(prov.choices.map((c) => c.index), [0, 1]);
  assert.notEqual(prov.choices[0].request, prov.choices[1].request);
});

if (!MUTANT) await test('a stream asked for it ends with the record as an SSE comment; the openai client reads the stream as ever', async () => {
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY_T}`, 'X-Kvfence-Provenance': '1' }, body: JSON.stringify({ prompt: 'blue blue red', max_tokens: 3, stream: true }) });
  assert.equal(r.headers.get('x-kvfence-provenance'), 'sse-comment');
  const text = await r.text();
  const m = text.match(/\n: kvfence-provenance (\{.*\})\n\ndata: \[DONE\]\n\n$/);
  assert.ok(m, text.slice(-400));
  const prov = JSON.parse(m[1]);
  assert.ok(text.includes(`"id":"${prov.id}"`));
  await sleep(200);
  checkAgainstDecode(prov.choices[0]);
  const s = await client.completions.create({ model: 'm', prompt: 'blue blue red', max_tokens: 3, stream: true }, { headers: { 'X-Kvfence-Provenance': '1' } });
  let chunks = 0;
  for await (const ch of s) chunks += ch.choices.length;
  assert.ok(chunks >= 1);
});

if (!MUTANT) await test('GET /admin/provenance/{id}: the record with an admin key; 403 tenant key, 401 none, 404 unknown, 400 not an id', async () => {
  const get = (id, h = adminH) => fetch(`${url}/admin/provenance/${id}`, { headers: h }).then(async (r) => ({ status: r.status, body: await r.text() }));
  const ok = await get(firstId);
  assert.equal(ok.status, 200, ok.body);
  const j = JSON.parse(ok.body);
  assert.equal(j.id, firstId);
  await sleep(100);
  checkAgainstDecode(j.choices[0]);
  const t = await get(firstId, { Authorization: `Bearer ${KEY_T}` });
  assert.equal(t.status, 403, t.body);
  assert.equal(JSON.parse(t.body).error.code, 'admin_only');
  assert.equal((await get(firstId, {})).status, 401);
  const unknown = await get('cmpl-0123456789abcdef');
  assert.equal(unknown.status, 404, unknown.body);
  assert.equal(JSON.parse(unknown.body).error.code, 'provenance_not_found');
  for (const bad of ['cmpl-XYZ', 'cmpl-0123456789ABCDEF', 'nothex', 'cmpl-0123456789abcdef0', '%00']) {
    const b = await get(bad);
    assert.equal(b.status, 400, `${bad}: ${b.body}`);
    assert.equal(JSON.parse(b.body).error.code, 'invalid_id');
  }
  const huge = await get('a'.repeat(20000));
  assert.ok(huge.status >= 400 && huge.status < 500, `a huge id: ${huge.status}`);
  const post = await fetch(`${url}/admin/provenance/${firstId}`, { method: 'POST', headers: adminH });
  assert.equal(post.status, 405);
  // The request's log line: the record's brief form, ids and numbers only.
  const rec = j.choices[0];
  assert.match(front.err, new RegExp(`event=finished .*completion_id=${firstId} .* prov=${rec.decode.id}:${rec.request}:`));
});

if (!MUTANT) await test('the canary under load: runs counted, no failure; /health ok; /metrics valid under promtool', async () => {
  const load = [];
  const t0 = Date.now();
  while (Date.now() - t0 < 6000) {
    load.push(...Array.from({ length: 3 }, (_, i) => client.completions.create({ model: 'm', prompt: `red blue ${'green '.repeat(i * 9)}`, max_tokens: 12, ignore_eos: true, temperature: 0.7 })));
    await Promise.all(load.splice(0));
  }
  let h;
  for (let i = 0; ; i++) {
    h = await health();
    if (h.canary?.runs >= 3) break;
    assert.ok(i < 600, JSON.stringify(h.canary));
    await sleep(50);
  }
  assert.equal(h.status, 'ok');
  assert.equal(h.canary.status, 'ok');
  assert.equal(h.canary.failures, 0);
  assert.equal(h.canary.references, 3);
  assert.equal((await fetch(`${url}/health`)).status, 200);
  const text = await (await fetch(`${url}/metrics`, { headers: adminH })).text();
  const v = (s) => { const m = text.match(new RegExp(`^${s} (\\S+)$`, 'm')); assert.ok(m, `${s} missing`); return Number(m[1]); };
  assert.ok(v('kvfence_canary_runs_total') >= 3);
  assert.equal(v('kvfence_canary_failures_total'), 0);
  assert.ok(v('kvfence_provenance_records_total') >= 4);
  const pc = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(pc.error, undefined, `promtool: ${pc.error}`);
  assert.equal(pc.status, 0, `promtool check metrics: ${pc.stdout}${pc.stderr}`);
  assert.match(front.err, /event=canary_ready references=3 interval_ms=1000/);
  assert.doesNotMatch(front.err, /event=canary_failure/);
});

if (MUTANT) await test(`a broken build (${MUTANT === 'binary' ? 'a mutant binary' : 'decode\'s checks off'}, a prefill forging stale writes): the canary fails, /health degraded, provenance logged`, async () => {
  // Tenants' traffic gives the forging prefill other tenants' pages to write over the canary's.
  let h;
  const t0 = Date.now();
  for (;;) {
    await Promise.all(Array.from({ length: 3 }, (_, i) => client.completions.create({ model: 'm', prompt: `red blue ${'green '.repeat(i * 9 + 3)}`, max_tokens: 6 }).catch(() => null)));
    h = await health();
    if (h.canary?.failures >= 1) break;
    assert.ok(Date.now() - t0 < 120000, `no canary failure in 120 s: ${JSON.stringify(h.canary)}`);
  }
  const r = await fetch(`${url}/health`);
  assert.equal(r.status, 503);
  assert.equal((await r.json()).status, 'degraded');
  const d = await fetch(`${url}/health?detail=1`, { headers: adminH });
  assert.equal(d.status, 503);
  const dj = await d.json();
  assert.equal(dj.status, 'degraded');
  assert.match(dj.reason, /^canary prompt \d: /);
  const text = await (await fetch(`${url}/metrics`, { headers: adminH })).text();
  assert.match(text, /^kvfence_canary_failures_total [1-9]\d*$/m);
  const m = front.err.match(/event=canary_failure prompt=\d reason="[^"]+" prov=(\w+):(\w+):\S+ decode=\S+ pages=(\d+:\w+:\w+)/);
  assert.ok(m, front.err.slice(-3000));
  console.log(`# ${m[0]}`);
});

await test('SIGTERM exits 0, sanitizers clean', async () => {
  for (const p of [...procs].reverse()) {
    p.child.kill('SIGTERM');
    const ex = await Promise.race([p.exitP, sleep(30000).then(() => null)]);
    assert.ok(ex, 'no exit in 30 s');
    assert.equal(ex.code, 0, p.err.slice(-3000));
    assert.doesNotMatch(p.err, /AddressSanitizer|LeakSanitizer|runtime error/);
  }
  for (const k of [KEY_T, KEY_ADMIN]) assert.ok(!procs.some((p) => p.err.includes(k)), 'a key in a log');
});

console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
