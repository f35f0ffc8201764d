// The fabric's trust boundary against the real processes: a prefill, a decode and a router
// sharing a cluster key, two tenants with canary prompts, and hostile peers beside them.
//
//   node fabric_e2e.mjs --kvfence EXE --work DIR [--ns-a NETNS --host-a ADDR --host-b ADDR]
//
// With --ns-a, the prefill and the decode worker run in the network namespace NETNS and listen on
// host-a (a veth address), and everything else, this script included, where it was started
// (host-b): the fabric on a real interface, attacked from another host (fabric_netns.sh).
//
// Checked, each on content (token ids and logprobs equal to `kvfence run`):
//   - a router holding another key (naming a prefill of the attacker's) is refused: it never
//     serves, and the attacker's prefill never receives a connection, while the tenants'
//     concurrent requests through the operator's router are all answered correctly;
//   - a router dialing a listener without the key (a fake decode worker) sends its greeting and
//     proof (72 bytes) and nothing more: no HELLO, no prompt;
//   - a stranger on a fabric port gets the greeting (magic and 32 random bytes) and, after a
//     wrong proof, the end of the stream: no fingerprint, no limits, nothing else;
//   - a port sweep: every listening socket of every process (read from /proc) is bound to the
//     configured address, and takes the 16-byte packet that aborted UCX's listener, UCX's
//     interface header with a huge length, truncated and oversized handshakes and 1,000 random
//     packets; every process stays up and the tenants' requests are still answered correctly;
//   - 300 failed joins against each fabric port, then a new router with the key joins and serves;
//   - `kvfence serve`: its one internal fabric port is on 127.0.0.1, refuses a stranger, and
//     serves correctly after the sweep;
//   - the prefill workers a router names are used while it is connected: a router that filled
//     the decode's table (16) leaves, and the operator's next prefill, refused while it was full,
//     is taken and granted prompts;
//   - every process ends with SIGTERM, exit 0, no sanitizer report.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import crypto from 'node:crypto';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['kvfence', 'work']) if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
const KVF = args.kvfence, W = args.work;
const NS_A = args['ns-a'] ?? null, HOST_A = args['host-a'] ?? '127.0.0.1', HOST_B = args['host-b'] ?? '127.0.0.1';
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the whole suite ran past 300 s'); killAll(); process.exit(1); }, 300000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function launch(name, argv, env = {}, ns = null) {
  // `ip netns exec` execs the command in place: the pid is the worker's (its /proc is read below).
  const child = spawn(ns ? 'ip' : KVF, ns ? ['netns', 'exec', ns, KVF, ...argv] : argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1', ...env } });
  children.add(child);
  const p = { name, child, out: '', err: '', exited: null };
  child.stdout.on('data', (d) => { p.out += d; });
  child.stderr.on('data', (d) => { p.err += d; });
  p.exitP = new Promise((r) => child.on('exit', (code, sig) => { p.exited = { code, sig }; children.delete(child); r(p.exited); }));
  return p;
}
async function waitFor(p, re, ms, where = 'out') {
  const until = Date.now() + ms;
  for (;;) {
    const m = p[where].match(re);
    if (m) return m;
    if (p.exited) throw new Error(`${p.name} exited early (${JSON.stringify(p.exited)}): ${p.err.slice(-2000)}`);
    if (Date.now() > until) throw new Error(`${p.name}: no ${re} in ${ms} ms`);
    await sleep(20);
  }
}
async function stopClean(p) {
  p.child.kill('SIGTERM');
  const ex = await Promise.race([p.exitP, sleep(30000).then(() => null)]);
  if (!ex) { p.child.kill('SIGKILL'); throw new Error(`${p.name} did not stop on SIGTERM`); }
  assert.equal(ex.code, 0, `${p.name} exit ${JSON.stringify(ex)}\n${p.err.slice(-3000)}`);
  assert.doesNotMatch(p.err, /AddressSanitizer|LeakSanitizer|runtime error/, p.err.slice(-3000));
}
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

// ---- the reference and the requests ----
const MODEL = path.join(W, 'tiny.gguf');
execFileSync(KVF, ['mkmodel', MODEL, '--shape', 'tiny', '--type', 'q8_0', '--seed', '5'], { stdio: 'ignore' });
const refCache = new Map();
function reference(prompt, maxTokens) {
  const key = `${prompt}\u0000${maxTokens}`;
  if (!refCache.has(key)) {
    const out = execFileSync(KVF, ['run', '--model', MODEL, '--prompt', prompt, '--max-tokens', String(maxTokens), '--temperature', '0',
      '--threads', '1', '--print-token-ids', '--print-logprobs'], { encoding: 'utf8' });
    const lines = out.split('\n');
    const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
    const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
    refCache.set(key, { ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround) });
  }
  return refCache.get(key);
}
async function complete(url, key, prompt, maxTokens) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, logprobs: 0, return_tokens_as_token_ids: true }),
    signal: AbortSignal.timeout(60000),
  });
  const body = await r.json();
  return { status: r.status, body };
}
async function sameAsRun(url, key, prompt, maxTokens, what) {
  const { status, body } = await complete(url, key, prompt, maxTokens);
  assert.equal(status, 200, `${what}: ${JSON.stringify(body)}`);
  const ids = body.choices[0].logprobs.tokens.map((t) => Number(/^token_id:(\d+)$/.exec(t)[1]));
  const lps = body.choices[0].logprobs.token_logprobs.map(Math.fround);
  const ref = reference(prompt, maxTokens);
  assert.deepEqual(ids, ref.ids, `${what}: token ids`);
  assert.deepEqual(lps, ref.lps, `${what}: logprobs`);
}
const TENANTS = [['key-alpha-0123456789', 'alpha', 'alpha canary zebra quartz'], ['key-bravo-0123456789', 'bravo', 'bravo canary apple violet']];
const KEYS = path.join(W, 'api.keys');
fs.writeFileSync(KEYS, TENANTS.map(([k, t]) => `${k} ${t}`).join('\n') + '\n', { mode: 0o600 });
async function tenantsServed(url, rounds, what) {
  const jobs = [];
  for (let i = 0; i < rounds; i++)
    for (const [k, t, canary] of TENANTS) jobs.push(sameAsRun(url, k, `${canary} number ${i}`, 4 + (i % 3), `${what}: ${t} #${i}`));
  await Promise.all(jobs);
}

// ---- /proc: the listening TCP sockets of a process ----
function listening(pid) {
  const inodes = new Set();
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try { const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`)); if (m) inodes.add(m[1]); } catch { /* closed meanwhile */ }
  }
  const out = [];
  for (const f of ['tcp', 'tcp6']) {
    let text = '';
    try { text = fs.readFileSync(`/proc/${pid}/net/${f}`, 'utf8'); } catch { continue; }
    for (const line of text.split('\n').slice(1)) {
      const c = line.trim().split(/\s+/);
      if (c.length < 10 || c[3] !== '0A' || !inodes.has(c[9])) continue;
      const [hex, port] = c[1].split(':');
      const addr = f === 'tcp' ? hex.match(/../g).reverse().map((b) => parseInt(b, 16)).join('.') : hex;
      out.push({ addr, port: parseInt(port, 16) });
    }
  }
  return out;
}

// ---- raw sockets ----
function rawExchange(port, chunks, { readMs = 1500, host = '127.0.0.1' } = {}) {
  return new Promise((resolve) => {
    const got = [];
    const s = net.connect(port, host);
    let ended = false;
    const finish = () => { if (!ended) { ended = true; s.destroy(); resolve({ bytes: Buffer.concat(got), closed: closedByPeer }); } };
    let closedByPeer = false;
    s.on('data', (d) => got.push(d));
    s.on('end', () => { closedByPeer = true; finish(); });
    s.on('error', () => { closedByPeer = true; finish(); });
    s.on('connect', async () => {
      for (const c of chunks) { if (typeof c === 'number') await sleep(c); else s.write(c); }
      setTimeout(finish, readMs);
    });
  });
}
function blast(port, buf, host) {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    s.on('error', () => resolve());
    s.on('connect', () => s.end(buf, () => { s.destroy(); resolve(); }));
  });
}
const P16 = Buffer.concat([Buffer.alloc(8, 0xff), Buffer.alloc(8)]);
const UCX_IFACE = Buffer.from([0x78, 0x56, 0x34, 0x12, 0xbe, 0xba, 0xfe, 0xca, 32, 0xff, 0xff, 0xff, 0x7f]);
async function sweep(host, port, randomCount) {
  await blast(port, P16, host);
  await blast(port, UCX_IFACE, host);
  for (let k = 1; k < 40; k += 6) await blast(port, Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(40)]).subarray(0, k), host);
  await blast(port, Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(70000)]), host);
  const batch = [];
  for (let i = 0; i < randomCount; i++) {
    const b = crypto.randomBytes(1 + crypto.randomInt(512));
    if (i % 3 === 0) Buffer.from('KVFFAB1C').copy(b);
    batch.push(blast(port, b, host));
    if (batch.length >= 32) await Promise.all(batch.splice(0));
  }
  await Promise.all(batch);
}

// ======================================================================================
const KEY = path.join(W, 'cluster.key'), WRONG = path.join(W, 'other.key');
execFileSync(KVF, ['keygen', KEY], { stdio: 'ignore' });
execFileSync(KVF, ['keygen', WRONG], { stdio: 'ignore' });
const withKey = { KVFENCE_CLUSTER_KEY_FILE: KEY };
const [P1, D1] = [await freePort(), await freePort()];
const prefill = launch('prefill', ['prefill', '--model', MODEL, '--listen', `${HOST_A}:${P1}`, '--threads', '1'], withKey, NS_A);
const decode = launch('decode', ['decode', '--model', MODEL, '--listen', `${HOST_A}:${D1}`, '--threads', '1', '--kv-memory', '8M'], withKey, NS_A);
await waitFor(prefill, /listening \S+ (\d+)/, 60000);
await waitFor(decode, /listening \S+ (\d+)/, 60000);
const router = launch('router', ['router', '--model', MODEL, '--port', '0', '--decode', `${HOST_A}:${D1}`, '--prefill', `${HOST_A}:${P1}`,
  '--api-keys', KEYS], withKey);
const URL = `http://127.0.0.1:${(await waitFor(router, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;

// The attacker's prefill: a listener that records every connection and byte.
const rogue = { conns: 0, bytes: 0 };
const rogueSrv = net.createServer((s) => { rogue.conns++; s.on('data', (d) => { rogue.bytes += d.length; }); s.on('error', () => {}); });
await new Promise((r) => rogueSrv.listen(0, HOST_B, r));
const RP = rogueSrv.address().port;

await test('the operator\'s router serves both tenants, each equal to kvfence run', async () => {
  const until = Date.now() + 30000;
  while ((await fetch(`${URL}/health`)).status !== 200) { assert.ok(Date.now() < until, 'never healthy'); await sleep(100); }
  await tenantsServed(URL, 2, 'before');
});

let rogueRouter;
await test('a router with another key (naming the attacker\'s prefill) is refused; no prompt reaches that prefill', async () => {
  rogueRouter = launch('rogue-router', ['router', '--model', MODEL, '--port', '0', '--decode', `${HOST_A}:${D1}`, '--prefill', `${HOST_B}:${RP}`,
    '--no-auth', '--admit-timeout', '2000'], { KVFENCE_CLUSTER_KEY_FILE: WRONG });
  const rurl = `http://127.0.0.1:${(await waitFor(rogueRouter, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  // The tenants keep working meanwhile, while the rogue router keeps trying.
  const tenants = tenantsServed(URL, 4, 'beside the rogue router');
  await sleep(3000);
  const h = await fetch(`${rurl}/health`);
  assert.equal(h.status, 503, 'the rogue router must not be healthy');
  const r = await complete(rurl, null, 'alpha canary zebra quartz', 4);
  assert.notEqual(r.status, 200, `the rogue router served: ${JSON.stringify(r.body)}`);
  await tenants;
  assert.match(rogueRouter.err, /fabric authentication failed/, 'the rogue router is told why');
  assert.equal(rogue.conns, 0, 'the decode connected to the attacker\'s prefill');
  assert.equal(rogue.bytes, 0);
  // The decode's prefill set is the operator's alone (the router's /health lists the workers).
  const hb = await (await fetch(`${URL}/health`)).json();
  const prefills = JSON.stringify(hb).match(new RegExp(`"port":${RP}\\b`, 'g'));
  assert.equal(prefills, null, `the attacker's prefill appears in /health: ${JSON.stringify(hb)}`);
});

await test('a stranger on a fabric port learns the greeting and nothing else', async () => {
  for (const port of [P1, D1]) {
    const hello = Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(32)]);
    const r = await rawExchange(port, [hello, 300, crypto.randomBytes(32)], { readMs: 3000, host: HOST_A });
    assert.equal(r.bytes.length, 40, `${port}: got ${r.bytes.length} bytes`);
    assert.match(r.bytes.subarray(0, 8).toString(), /^KVFFAB1[AC]$/);
    assert.ok(r.closed, `${port}: the stream did not end after a wrong proof`);
    const silent = await rawExchange(port, [Buffer.from('GET / HTTP/1.0\r\n\r\n')], { readMs: 1000, host: HOST_A });
    assert.equal(silent.bytes.length, 0, `${port} answered a non-peer: ${silent.bytes}`);
  }
});

const serve = launch('serve', ['serve', '--model', MODEL, '--port', '0', '--threads', '1', '--kv-memory', '8M', '--api-keys', KEYS]);
const SURL = `http://127.0.0.1:${(await waitFor(serve, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;

await test('every listening socket is bound to its configured address and survives the sweep', async () => {
  const procs = [prefill, decode, router, serve];
  let swept = 0;
  for (const p of procs) {
    const socks = listening(p.child.pid);
    assert.ok(socks.length >= 1, `${p.name}: no listening socket found`);
    const want = p === prefill || p === decode ? HOST_A : '127.0.0.1';
    for (const s of socks) {
      assert.equal(s.addr, want, `${p.name} listens on ${s.addr}:${s.port}`);
      await sweep(want, s.port, 1000);
      swept++;
    }
  }
  // serve: the HTTP port and exactly one fabric port.
  assert.equal(listening(serve.child.pid).length, 2, `serve listens on ${JSON.stringify(listening(serve.child.pid))}`);
  console.log(`# swept ${swept} listening sockets (1,000 random packets each, plus the crafted ones)`);
  await sleep(500);
  for (const p of procs) assert.equal(p.exited, null, `${p.name} died: ${p.err.slice(-2000)}`);
  await tenantsServed(URL, 2, 'after the sweep (router)');
  await tenantsServed(SURL, 2, 'after the sweep (serve)');
});

await test('serve\'s internal fabric refuses a stranger', async () => {
  const http = Number(SURL.split(':').pop());
  const fab = listening(serve.child.pid).find((s) => s.port !== http);
  assert.ok(fab, 'no internal fabric port');
  const r = await rawExchange(fab.port, [Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(32)]), 300, crypto.randomBytes(32)], { readMs: 3000 });
  assert.equal(r.bytes.length, 40);
  assert.ok(r.closed);
  await tenantsServed(SURL, 1, 'serve after the stranger');
});

await test('300 failed joins per fabric port, then a new router with the key joins and serves', async () => {
  for (const port of [P1, D1]) {
    const tries = [];
    for (let i = 0; i < 300; i++) {
      tries.push(rawExchange(port, [Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(32)]), crypto.randomBytes(32)], { readMs: 200, host: HOST_A }));
      if (tries.length >= 30) await Promise.all(tries.splice(0));
    }
    await Promise.all(tries);
  }
  const r2 = launch('router2', ['router', '--model', MODEL, '--port', '0', '--decode', `${HOST_A}:${D1}`, '--prefill', `${HOST_A}:${P1}`,
    '--api-keys', KEYS], withKey);
  const url2 = `http://127.0.0.1:${(await waitFor(r2, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  const until = Date.now() + 30000;
  while ((await fetch(`${url2}/health`)).status !== 200) { assert.ok(Date.now() < until, 'router2 never healthy'); await sleep(100); }
  await tenantsServed(url2, 2, 'router2');
  await tenantsServed(URL, 1, 'the first router still');
  await stopClean(r2);
});

await test('a router dialing a listener without the key sends its greeting and proof, then nothing', async () => {
  // A fake decode worker: answers with a well-formed greeting and a proof it cannot make.
  const seen = [];
  const fake = net.createServer((sock) => {
    const got = [];
    seen.push(got);
    sock.on('data', (d) => {
      got.push(d);
      const n = Buffer.concat(got).length;
      if (n >= 40 && !sock.greeted) { sock.greeted = true; sock.write(Buffer.concat([Buffer.from('KVFFAB1C'), crypto.randomBytes(32)])); }
      if (n >= 72 && !sock.proved) { sock.proved = true; sock.write(crypto.randomBytes(32)); }
    });
    sock.on('error', () => {});
  });
  await new Promise((r) => fake.listen(0, '127.0.0.1', r));
  const r5 = launch('router5', ['router', '--model', MODEL, '--port', '0', '--decode', `127.0.0.1:${fake.address().port}`,
    '--prefill', `${HOST_A}:${P1}`, '--no-auth', '--admit-timeout', '1000'], withKey);
  const url5 = `http://127.0.0.1:${(await waitFor(r5, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  await waitFor(r5, /fabric authentication failed/, 20000, 'err');
  const r = await complete(url5, null, 'alpha canary zebra quartz', 4);
  assert.notEqual(r.status, 200);
  await stopClean(r5);
  fake.close();
  assert.ok(seen.length >= 1, 'the router never dialled');
  for (const got of seen) {
    const b = Buffer.concat(got);
    assert.equal(b.length, 72, `the router sent ${b.length} bytes to a listener without the key`);
    assert.match(b.subarray(0, 8).toString(), /^KVFFAB1[AC]$/);
    assert.equal(b.indexOf(Buffer.from('canary')), -1);
  }
});

let prefill2;
await test('a router\'s prefill names expire with it: a full table frees for the operator\'s next prefill', async () => {
  // router3 fills the decode's prefill table (16): P1 and 15 addresses where nothing listens.
  const bogus = [];
  for (let i = 0; i < 15; i++) bogus.push(`${HOST_B}:${await freePort()}`);
  const r3 = launch('router3', ['router', '--model', MODEL, '--port', '0', '--decode', `${HOST_A}:${D1}`,
    '--prefill', [`${HOST_A}:${P1}`, ...bogus].join(','), '--no-auth', '--admit-timeout', '2000'], withKey);
  await waitFor(r3, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err');
  await waitFor(r3, /decode worker \S+:\d+ is up/, 30000, 'err');
  const P2 = await freePort();
  prefill2 = launch('prefill2', ['prefill', '--model', MODEL, '--listen', `${HOST_B}:${P2}`, '--threads', '1'], withKey);
  await waitFor(prefill2, /listening \S+ (\d+)/, 60000);
  const r4 = launch('router4', ['router', '--model', MODEL, '--port', '0', '--decode', `${HOST_A}:${D1}`,
    '--prefill', `${HOST_B}:${P2}`, '--api-keys', KEYS], withKey);
  const url4 = `http://127.0.0.1:${(await waitFor(r4, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  const p2Up = async () => {
    const hb = await (await fetch(`${url4}/health`)).json();
    return (hb.workers ?? []).find((w) => w.role === 'prefill' && w.port === P2)?.up === true;
  };
  await waitFor(decode, /the routers name 1 prefill workers beyond the 16/, 30000, 'err');
  await sleep(1000);
  assert.equal(await p2Up(), false, 'the table was full, yet P2 was taken');
  // router3 goes: the names only it gave retire, and P2 takes a slot.
  await stopClean(r3);
  const until = Date.now() + 20000;
  while (!(await p2Up())) { assert.ok(Date.now() < until, 'P2 never came up after router3 left'); await sleep(100); }
  // Prompts go to the live prefill with the fewest outstanding (ties: the first), so P2 is
  // granted some once requests overlap.
  let hb;
  for (let i = 0; i < 5; i++) {
    await tenantsServed(url4, 6, `router4 #${i}`);
    hb = await (await fetch(`${url4}/health`)).json();
    if (hb.workers.find((w) => w.role === 'prefill' && w.port === P2).granted > 0) break;
  }
  const p2 = hb.workers.find((w) => w.role === 'prefill' && w.port === P2);
  assert.ok(p2.granted > 0, `P2 was granted nothing: ${JSON.stringify(hb.workers)}`);
  await tenantsServed(URL, 1, 'the first router after the churn');
  await stopClean(r4);
});

await test('every process stops cleanly', async () => {
  assert.equal(rogue.conns, 0, 'the attacker\'s prefill was reached');
  for (const p of [rogueRouter, router, serve, decode, prefill, prefill2]) if (p) await stopClean(p);
  rogueSrv.close();
});

console.log(`1..${n}`);
if (failed) console.log(`# ${failed} failed`);
process.exit(failed ? 1 : 0);
