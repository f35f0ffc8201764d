// The real `kvfence serve` with API keys and per-tenant limits, driven by the official `openai`
// npm client: a malformed key file and a non-loopback address without keys refuse to start;
// 401 without a valid key (typed AuthenticationError, nothing of the key echoed); two tenants
// with --tenant-max-running 1: a burst of one gets 429 with Retry-After while the other is
// served; n beyond the tenant's sequences is 400 at once; GET /metrics passes `promtool check
// metrics` and agrees with /health; after SIGTERM (exit 0) the captured stderr holds the event
// lines and none of the canary prompt, the canary key or the real keys. A second serve behind
// --trusted-proxy answers 128 concurrent requests with distinct X-Forwarded-For clients, and a
// client past --max-conn-per-ip gets 503 with Retry-After (not a reset). TAP on stdout.
// --topology split runs the same tenant checks through `kvfence router` over a prefill and a
// decode worker (the keys, limits, /metrics labels and log redaction are the router's; every
// process's stderr is checked for the canary); the startup refusals and the trusted-proxy serve
// are serve's own and run with --topology serve (the default).
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
setTimeout(() => { console.log('Bail out! the suite ran past 200 s'); killAll(); process.exit(1); }, 200000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  try { await fn(); console.log(`ok ${n} - ${name}`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

const DATA = path.join(W, 'data');
const KEY_A = 'sk-tenant-alpha-5b1f0c', KEY_B = 'sk-tenant-bravo-77e2a9';
const CANARY_PROMPT = 'zqxcanaryprompt', CANARY_KEY = 'sk-zqxcanarykey-000';
const KEYS = path.join(W, 'keys.txt');
fs.writeFileSync(KEYS, `# kvfence API keys\n\n${KEY_A} alpha\n${KEY_B}\tbravo\n`, { mode: 0o600 });

// A serve that must refuse to start: exit 2 and the message.
function refuses(extra, re) {
  const r = spawnSync(KVF, ['serve', '--port', '0', '--data-dir', DATA, ...extra], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 2, `exit ${r.status}: ${r.stderr}`);
  assert.match(r.stderr, re);
  return r.stderr;
}

if (TOPOLOGY === 'serve') await test('a malformed key file refuses to start, naming the line (not the key)', async () => {
  const bad = path.join(W, 'bad.txt');
  fs.writeFileSync(bad, `# ok\n${KEY_A} alpha\n${CANARY_KEY} two words\n`);
  const err = refuses(['--api-keys', bad], /line 3/);
  assert.ok(!err.includes(CANARY_KEY), err);
});
if (TOPOLOGY === 'serve') await test('beyond loopback without keys refuses to start unless --no-auth', async () => {
  refuses(['--host', '0.0.0.0'], /without API keys.*--no-auth/);
});

// One process (serve, or a split role); its stderr kept for the redaction check.
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
const tenantFlags = ['--api-keys', KEYS, '--tenant-max-running', '1', '--tenant-max-queued', '0'];
// The processes in the order they are stopped; the last is the HTTP front (serve or router).
const procs = [];
if (TOPOLOGY === 'serve') {
  procs.push(launch(['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--data-dir', DATA, '--kv-memory', '64M', ...tenantFlags]));
} else {
  const MODEL = path.join(W, 'hist.gguf'), CKEY = path.join(W, 'cluster.key');
  spawnSync(KVF, ['mkmodel', MODEL, '--shape', 'hist'], { stdio: 'ignore' });
  spawnSync(KVF, ['keygen', CKEY], { stdio: 'ignore' });
  const env = { KVFENCE_CLUSTER_KEY_FILE: CKEY };
  const net = await import('node:net');
  const free = () => new Promise((r) => { const srv = net.createServer(); srv.listen(0, '127.0.0.1', () => { const q = srv.address().port; srv.close(() => r(q)); }); });
  const [pp, dp] = [await free(), await free()];
  const pre = launch(['prefill', '--model', MODEL, '--listen', `127.0.0.1:${pp}`, '--threads', '1'], env);
  await waitErr(pre, /listening \S+ \d+/, 'prefill');
  const dec = launch(['decode', '--model', MODEL, '--listen', `127.0.0.1:${dp}`, '--threads', '1', '--kv-memory', '64M'], env);
  await waitErr(dec, /listening \S+ \d+/, 'decode');
  procs.push(pre, dec, launch(['router', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--prefill', `127.0.0.1:${pp}`,
    '--decode', `127.0.0.1:${dp}`, ...tenantFlags], env));
}
const front = procs[procs.length - 1];
const port = Number((await waitErr(front, /listening on http:\/\/127\.0\.0\.1:(\d+)/, TOPOLOGY))[1]);
if (TOPOLOGY === 'split') {
  // Ready when the router sees both workers up.
  for (let i = 0; ; i++) {
    const h = await (await fetch(`http://127.0.0.1:${port}/health`)).json().catch(() => ({}));
    if ((h.workers ?? []).length === 2 && h.workers.every((w) => w.up)) break;
    if (i > 1500) { console.log(`Bail out! the router's workers are not up: ${JSON.stringify(h)}`); process.exit(1); }
    await sleep(20);
  }
}
const url = `http://127.0.0.1:${port}`;
const client = (key) => new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const A = client(KEY_A), B = client(KEY_B);

await test('401 without a valid key: typed AuthenticationError, nothing of the key echoed', async () => {
  for (const key of ['', CANARY_KEY]) {
    const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) }, body: JSON.stringify({ prompt: CANARY_PROMPT, max_tokens: 2 }) });
    const text = await r.text();
    assert.equal(r.status, 401, text);
    assert.equal(JSON.parse(text).error.code, 'invalid_api_key');
    assert.ok(!text.includes('canary'), text);
  }
  await assert.rejects(client(CANARY_KEY).completions.create({ model: 'm', prompt: 'red', max_tokens: 2 }), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  assert.equal((await fetch(`${url}/health`)).status, 200, '/health needs no key');
});

await test('a key serves its tenant; the canary prompt is answered', async () => {
  const r = await A.completions.create({ model: 'm', prompt: `${CANARY_PROMPT} red red blue`, max_tokens: 4 });
  assert.equal(r.choices[0].finish_reason === 'length' || r.choices[0].finish_reason === 'stop', true);
  assert.ok(r.choices[0].text.length > 0, 'an empty completion');
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 4, JSON.stringify(r.usage));
  // The stream says what the same request says whole (greedy): its deltas, joined, and its end.
  const messages = [{ role: 'user', content: `${CANARY_PROMPT} red` }];
  const whole = await B.chat.completions.create({ model: 'm', messages, max_tokens: 3, temperature: 0 });
  const c = await B.chat.completions.create({ model: 'm', messages, max_tokens: 3, temperature: 0, stream: true });
  let text = '', finish = null;
  for await (const ch of c) {
    text += ch.choices?.[0]?.delta?.content ?? '';
    finish = ch.choices?.[0]?.finish_reason ?? finish;
  }
  assert.ok(whole.choices[0].message.content.length > 0, 'an empty chat answer');
  assert.equal(text, whole.choices[0].message.content, 'the stream differs from the whole answer');
  assert.equal(finish, whole.choices[0].finish_reason);
});

await test('tenant limit: a burst of alpha gets 429 with Retry-After while bravo is served', async () => {
  const body = { prompt: `${CANARY_PROMPT} red red blue`, max_tokens: 48, ignore_eos: true };
  const raw = (key) => fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` }, body: JSON.stringify(body) })
    .then(async (r) => ({ status: r.status, retry: r.headers.get('retry-after'), text: await r.text() }));
  const burst = Array.from({ length: 6 }, () => raw(KEY_A));
  const b = raw(KEY_B);
  const got = await Promise.all(burst);
  const bb = await b;
  assert.equal(bb.status, 200, `bravo: ${bb.text}`);
  const s429 = got.filter((r) => r.status === 429), s200 = got.filter((r) => r.status === 200);
  assert.ok(s429.length >= 1 && s200.length >= 1, `alpha statuses ${got.map((r) => r.status)}`);
  for (const r of s429) {
    assert.ok(Number(r.retry) >= 1, 'Retry-After');
    assert.equal(JSON.parse(r.text).error.code, 'tenant_limit');
  }
  await assert.rejects(Promise.all([A.completions.create({ model: 'm', ...body }), A.completions.create({ model: 'm', ...body }), A.completions.create({ model: 'm', ...body })]),
    (e) => e instanceof OpenAI.RateLimitError);
});

await test('/metrics: valid under promtool check metrics, consistent with /health', async () => {
  for (let i = 0; ; i++) { const h = await (await fetch(`${url}/health`)).json(); if (h.in_flight === 0) break; assert.ok(i < 400); await sleep(25); }
  const r = await fetch(`${url}/metrics`);
  assert.equal(r.status, 200);
  const text = await r.text();
  const h = await (await fetch(`${url}/health`)).json();
  const pc = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(pc.error, undefined, `promtool: ${pc.error} (Debian's prometheus package; scripts/install-deps.sh installs it)`);
  assert.equal(pc.status, 0, `promtool check metrics: ${pc.stdout}${pc.stderr}`);
  const v = (series) => { const m = text.match(new RegExp(`^${series.replace(/[{}"=+.]/g, (c) => `\\${c}`)} (\\S+)$`, 'm')); assert.ok(m, `${series} missing`); return Number(m[1]); };
  assert.equal(v('kvfence_pool_pages{pool="decode"}'), h.decode.pages);
  assert.equal(v('kvfence_pool_pages{pool="prefill"}'), h.prefill.pages);
  assert.equal(v('kvfence_pool_free_pages{pool="decode"}'), h.decode.free);
  assert.equal(v('kvfence_served_limit_tokens'), h.served_limit);
  assert.equal(v('kvfence_fences_total'), h.counters.fences);
  // The commit's three checks sum to /health's verify_failed; tail is the foreign tails.
  assert.equal(['count', 'trailer', 'checksum'].reduce((a, r) => a + v(`kvfence_verify_failures_total{reason="${r}"}`), 0), h.counters.verify_failed);
  assert.equal(v('kvfence_verify_failures_total{reason="tail"}'), h.counters.foreign_tails);
  assert.equal(v('kvfence_quarantines_total'), h.counters.quarantines);
  assert.equal(v('kvfence_prefill_up'), 1);
  assert.ok(v('kvfence_requests_total{tenant="alpha",outcome="rate_limited"}') >= 2);
  assert.ok(v('kvfence_requests_total{tenant="bravo",outcome="ok"}') >= 2);
  assert.ok(v('kvfence_requests_total{tenant="_none",outcome="unauthorized"}') >= 3);
  assert.ok(v('kvfence_generation_tokens_total{tenant="alpha"}') >= 52);
  assert.ok(v('kvfence_time_to_first_token_seconds_count') >= 4);
});

await test('n beyond the tenant\'s sequences is 400 tenant_share_exceeded at once, naming the bound', async () => {
  const t0 = Date.now();
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY_A}` }, body: JSON.stringify({ prompt: 'red red blue', max_tokens: 4, n: 2 }) });
  const text = await r.text();
  assert.equal(r.status, 400, text);
  const e = JSON.parse(text).error;
  assert.equal(e.code, 'tenant_share_exceeded');
  assert.equal(e.param, 'n');
  assert.match(e.message, /--tenant-max-running/);
  assert.ok(Date.now() - t0 < 5000);
});

await test('SIGTERM exits 0; the logs hold the events and no canary, prompt text or key', async () => {
  // The front first (serve, or the router), then the workers.
  for (const p of [...procs].reverse()) {
    p.child.kill('SIGTERM');
    const ex = await Promise.race([p.exitP, sleep(30000).then(() => null)]);
    assert.ok(ex, 'no exit in 30 s');
    assert.equal(ex.code, 0, p.err.slice(-3000));
    assert.doesNotMatch(p.err, /AddressSanitizer|LeakSanitizer|runtime error/);
  }
  const err = front.err, all = procs.map((p) => p.err).join('\n');
  assert.match(err, /event=request id=req-\w+ tenant=alpha/);
  assert.match(err, /event=finished id=req-\w+ tenant=bravo .*outcome=ok status=200 .*prompt_tokens=\d+ completion_tokens=\d+/);
  assert.match(err, /event=rejected id=req-\w+ tenant=alpha outcome=rate_limited status=429 code=tenant_limit/);
  assert.match(err, /event=unauthorized id=req-\w+/);
  for (const c of ['canary', CANARY_KEY, KEY_A, KEY_B, 'sk-']) assert.ok(!all.includes(c), `a process's stderr contains '${c}'`);
});

// A second serve, without keys, behind a trusted proxy (this host, 127.0.0.1).
if (TOPOLOGY === 'serve') await test('behind --trusted-proxy: 128 requests at once with distinct X-Forwarded-For clients all 200; past --max-conn-per-ip: 503 with Retry-After, no reset', async () => {
  const net = await import('node:net');
  const p2 = spawn(KVF, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--data-dir', DATA,
    '--kv-memory', '64M', '--trusted-proxy', '127.0.0.1', '--max-conn-per-ip', '4'],
  { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1' } });
  children.add(p2);
  let err2 = '';
  p2.stderr.on('data', (d) => { err2 += d; });
  const exit2 = new Promise((r) => p2.on('exit', (code) => { children.delete(p2); r(code); }));
  let port2 = 0;
  for (let i = 0; !port2; i++) {
    const m = err2.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) port2 = Number(m[1]);
    assert.ok(i < 3000, `serve did not start: ${err2}`);
    await sleep(20);
  }
  const url2 = `http://127.0.0.1:${port2}`;
  const got = await Promise.all(Array.from({ length: 128 }, (_, i) => fetch(`${url2}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Forwarded-For': `203.0.113.${i}, 10.1.${i >> 8}.${i & 255}` },
    body: JSON.stringify({ prompt: 'red red blue', max_tokens: 1 }),
  }).then(async (r) => ({ status: r.status, text: await r.text() }), (e) => ({ status: 0, text: String(e.cause ?? e) }))));
  const bad = got.filter((r) => r.status !== 200);
  assert.equal(bad.length, 0, `not 200: ${bad.slice(0, 3).map((r) => `${r.status} ${r.text}`).join('; ')}`);
  // 127.0.0.2 is not trusted: four idle connections are its cap; a fifth request is answered 503.
  const idle = [];
  for (let i = 0; i < 4; i++) {
    const sk = net.connect({ host: '127.0.0.1', port: port2, localAddress: '127.0.0.2' });
    await new Promise((r, j) => { sk.once('connect', r); sk.once('error', j); });
    idle.push(sk);
  }
  await sleep(100);
  const reply = await new Promise((resolve, reject) => {
    const sk = net.connect({ host: '127.0.0.1', port: port2, localAddress: '127.0.0.2' });
    let data = '';
    sk.on('data', (d) => { data += d; });
    sk.on('error', (e) => reject(new Error(`the fifth connection: ${e.code} (a reset?) after ${data.length} bytes`)));
    sk.on('end', () => resolve(data));
    sk.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.9\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{"prompt":"red blue","max_tokens":1}');
  });
  for (const sk of idle) sk.destroy();
  assert.match(reply, /^HTTP\/1\.1 503 /, reply);
  assert.match(reply, /\r\nRetry-After: \d+\r\n/i, reply);
  assert.match(reply, /"too_many_connections"/, reply);
  p2.kill('SIGTERM');
  assert.equal(await Promise.race([exit2, sleep(30000).then(() => 'no exit')]), 0, err2.slice(-2000));
  assert.doesNotMatch(err2, /AddressSanitizer|LeakSanitizer|runtime error/);
});

console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
