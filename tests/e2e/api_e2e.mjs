// Model names, system_fingerprint, CORS, compressed bodies and kept-alive GETs, against real
// `kvfence serve` processes driven by the official `openai` npm client and by raw HTTP.
//
//   node api_e2e.mjs --kvfence EXE --node-modules DIR --work DIR
//
// 1. --served-model-name alpha,beta: responses name alpha, /v1/models lists both, a request
//    naming gamma gets OpenAI's 404 model_not_found (the client's NotFoundError), one naming
//    beta or none is served; without the option any name is served under the file's name.
// 2. system_fingerprint on every response and chunk: the same across requests and servers of
//    one model, another for another model.
// 3. CORS with --cors-origins: a browser-style preflight (OPTIONS with Origin and
//    Access-Control-Request-*) and the cross-origin request pass for a listed origin, fail for
//    another (403, no Access-Control-Allow-Origin); "*" answers "*" and never
//    Access-Control-Allow-Credentials; without the option no CORS header and OPTIONS is 405.
// 4. A gzip body gets 415; GET answers keep the connection for the next request.
// Prints TAP; exits 1 on any failure. Every server is killed on any exit.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import zlib from 'node:zlib';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'node-modules', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = args.kvfence;
const entry = path.join(args['node-modules'], 'openai', 'index.mjs');
if (!fs.existsSync(entry)) { console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`); process.exit(1); }
const { default: OpenAI, NotFoundError } = await import(pathToFileURL(entry).href);
const W = args.work;
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the suite ran past 240 s'); killAll(); process.exit(1); }, 240000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

async function startServe(name, extra) {
  const child = spawn(KVF, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--kv-memory', '16M', ...extra],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1' } });
  children.add(child);
  const srv = { name, child, err: '', exited: null };
  child.stderr.on('data', (d) => { srv.err += d; });
  srv.exitP = new Promise((r) => child.on('exit', (code, sig) => { srv.exited = { code, sig }; children.delete(child); r(srv.exited); }));
  for (const until = Date.now() + 90000; !srv.port; await sleep(20)) {
    const m = srv.err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) srv.port = Number(m[1]);
    if (srv.exited || Date.now() > until) throw new Error(`${name} did not start: ${srv.err}`);
  }
  srv.url = `http://127.0.0.1:${srv.port}`;
  srv.client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  return srv;
}
async function stopServe(srv) {
  srv.child.kill('SIGTERM');
  const ex = await Promise.race([srv.exitP, sleep(30000).then(() => null)]);
  assert.ok(ex, `${srv.name}: no exit in 30 s`);
  assert.equal(ex.code, 0, srv.err.slice(-3000));
  assert.doesNotMatch(srv.err, /AddressSanitizer|LeakSanitizer|runtime error/, srv.err.slice(-3000));
}

const A = path.join(W, 'a.gguf'), B = path.join(W, 'b.gguf');
execFileSync(KVF, ['mkmodel', A, '--shape', 'tiny', '--type', 'q8_0', '--seed', '5'], { stdio: 'ignore' });
execFileSync(KVF, ['mkmodel', B, '--shape', 'tiny', '--type', 'q8_0', '--seed', '6'], { stdio: 'ignore' });
const named = await startServe('named', ['--model', A, '--served-model-name', 'alpha,beta', '--cors-origins', 'https://app.example,http://localhost:3000']);
const plain = await startServe('plain', ['--model', A]);
const star = await startServe('star', ['--model', B, '--cors-origins', '*']);

// ---- 1. model names ----
await test('--served-model-name: responses name the first, /v1/models lists each, another name is a 404 model_not_found', async () => {
  const list = await named.client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['alpha', 'beta']);
  assert.equal((await named.client.models.retrieve('beta')).id, 'beta');
  for (const model of ['alpha', 'beta']) {
    const r = await named.client.completions.create({ model, prompt: 'hi', max_tokens: 2 });
    assert.equal(r.model, 'alpha');
  }
  const none = await fetch(`${named.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 2 }) });
  assert.equal(none.status, 200, 'a request that names no model is served');
  for (const call of [
    () => named.client.completions.create({ model: 'gamma', prompt: 'hi', max_tokens: 2 }),
    () => named.client.chat.completions.create({ model: 'gamma', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    () => named.client.models.retrieve('gamma'),
  ]) {
    await assert.rejects(call, (e) => e instanceof NotFoundError && e.status === 404 && e.code === 'model_not_found');
  }
  const plainList = await plain.client.models.list();
  assert.deepEqual(plainList.data.map((m) => m.id), ['a.gguf']);
  const r = await plain.client.completions.create({ model: 'anything', prompt: 'hi', max_tokens: 2 });
  assert.equal(r.model, 'a.gguf', 'without the option any name is served under the file name');
});

// ---- 2. system_fingerprint ----
await test('system_fingerprint: on responses and chunks, fixed by the model and the build', async () => {
  const fp = async (srv) => (await srv.client.chat.completions.create({ model: srv === named ? 'alpha' : 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 })).system_fingerprint;
  const a1 = await fp(named), a2 = await fp(plain), b = await fp(star);
  assert.match(a1, /^fp_[0-9a-f]{16}$/);
  assert.equal(a1, a2, 'one model, one fingerprint');
  assert.notEqual(a1, b, 'another model, another fingerprint');
  const st = await plain.client.completions.create({ model: 'x', prompt: 'hi', max_tokens: 3, stream: true });
  for await (const ch of st) assert.equal(ch.system_fingerprint, a1);
});

// ---- 3. CORS ----
const preflight = (srv, origin, p = '/v1/chat/completions') => fetch(srv.url + p, {
  method: 'OPTIONS',
  headers: { Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type,x-stainless-os' },
});
const crossPost = (srv, origin) => fetch(`${srv.url}/v1/chat/completions`, {
  method: 'POST',
  headers: { Origin: origin, 'Content-Type': 'application/json', Authorization: 'Bearer unused' },
  body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
});
await test('CORS: a listed origin passes the preflight and the cross-origin request', async () => {
  for (const origin of ['https://app.example', 'http://localhost:3000']) {
    const pf = await preflight(named, origin);
    assert.equal(pf.status, 204);
    assert.equal(pf.headers.get('access-control-allow-origin'), origin);
    assert.match(pf.headers.get('access-control-allow-methods'), /\bPOST\b/);
    assert.match(pf.headers.get('access-control-allow-headers'), /authorization/i);
    assert.match(pf.headers.get('access-control-allow-headers'), /content-type/i);
    assert.equal(pf.headers.get('access-control-allow-credentials'), null);
    const r = await crossPost(named, origin);
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('access-control-allow-origin'), origin);
    assert.match(r.headers.get('vary') ?? '', /Origin/);
    const g = await fetch(`${named.url}/v1/models`, { headers: { Origin: origin } });
    assert.equal(g.headers.get('access-control-allow-origin'), origin);
  }
});
await test('CORS: another origin fails the preflight and gets no Access-Control-Allow-Origin', async () => {
  for (const origin of ['https://evil.example', 'https://app.example.evil', 'null']) {
    const pf = await preflight(named, origin);
    assert.equal(pf.status, 403);
    assert.equal(pf.headers.get('access-control-allow-origin'), null);
    const r = await crossPost(named, origin);
    assert.equal(r.headers.get('access-control-allow-origin'), null, 'a browser would block the answer');
  }
  assert.equal((await preflight(named, 'https://app.example', '/v1/nowhere')).status, 404);
});
await test('CORS: "*" answers "*" and never allows credentials; without --cors-origins nothing', async () => {
  const pf = await preflight(star, 'https://anywhere.example');
  assert.equal(pf.status, 204);
  assert.equal(pf.headers.get('access-control-allow-origin'), '*');
  assert.equal(pf.headers.get('access-control-allow-credentials'), null);
  const r = await crossPost(star, 'https://anywhere.example');
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
  assert.equal(r.headers.get('access-control-allow-credentials'), null);
  const p0 = await preflight(plain, 'https://app.example');
  assert.equal(p0.status, 405, 'no CORS without the option');
  assert.equal(p0.headers.get('access-control-allow-origin'), null);
  const r0 = await crossPost(plain, 'https://app.example');
  assert.equal(r0.headers.get('access-control-allow-origin'), null);
});

// ---- 4. gzip bodies, kept-alive GETs ----
await test('a gzip body gets 415 naming the encoding, and nothing runs', async () => {
  const served = async () => {
    const text = await (await fetch(`${plain.url}/metrics`)).text();
    return [...text.matchAll(/^kvfence_requests_total\{[^}]*outcome="ok"[^}]*\} (\d+)$/gm)].reduce((a, m) => a + Number(m[1]), 0);
  };
  const before = await served();
  const body = zlib.gzipSync(JSON.stringify({ prompt: 'hi', max_tokens: 2 }));
  const r = await fetch(`${plain.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'gzip' }, body });
  assert.equal(r.status, 415);
  const j = await r.json();
  assert.equal(j.error.code, 'unsupported_content_encoding');
  assert.match(j.error.message, /gzip/);
  assert.equal(await served(), before, 'the compressed request ran');
});
await test('GET answers keep the connection: three GETs on one socket', async () => {
  const sock = net.connect(plain.port, '127.0.0.1');
  await new Promise((r, j) => { sock.once('connect', r); sock.once('error', j); });
  let buf = '';
  sock.on('data', (d) => { buf += d; });
  for (const p of ['/v1/models', '/health', '/v1/models']) {
    const before = buf.length;
    sock.write(`GET ${p} HTTP/1.1\r\nHost: x\r\n\r\n`);
    for (const until = Date.now() + 5000; !/\r\n\r\n[\s\S]*\}\s*$/.test(buf.slice(before)); await sleep(10))
      if (Date.now() > until || sock.destroyed) throw new Error(`no answer to ${p} on the kept connection: ${buf.slice(before)}`);
    const head = buf.slice(before).split('\r\n\r\n')[0];
    assert.match(head, /^HTTP\/1\.1 200/);
    assert.doesNotMatch(head, /connection: close/i, `${p}: ${head}`);
  }
  sock.destroy();
});

await test('SIGTERM: each server exits 0, nothing reported by the sanitizers', async () => {
  for (const srv of [named, plain, star]) await stopServe(srv);
});

console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
