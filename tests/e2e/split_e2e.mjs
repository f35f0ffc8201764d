// The split roles end to end: `kvfence router`, two `kvfence prefill` and two `kvfence decode`
// processes over the authenticated fabric (TCP), driven by the official `openai` npm client and by raw HTTP.
//
//   node split_e2e.mjs --kvfence EXE --node-modules DIR --work DIR [--readme README.md]
//                      [--ns-a NETNS --host-a ADDR --host-b ADDR]
//
// With --ns-a, prefill 1 and decode 1 run in the network namespace NETNS (reached at host-a) and
// everything else, this script included, where it was started (host-b): two hosts joined by a
// veth pair (split_netns.sh sets that up). Without, every process is on 127.0.0.1.
//
// Checked, each on content (token ids and logprobs equal to `kvfence run`):
//   - the router starts first and says in /health why it cannot serve (503 with the reason);
//     the workers then start in any order and it serves as soon as they are up;
//   - alone, streamed and 16 at once, every completion equals `kvfence run`; both decode workers
//     commit handoffs and both prefill workers are granted prompts;
//   - SIGKILL of a prefill worker under load: each request equals `kvfence run` or fails with a
//     clear error (never a 200 with other content); restarted on its address (a new epoch), it is
//     granted prompts again; the same for a decode worker; the decode pools end all free;
//   - a decode worker serving another model, and a prefill worker with another context limit,
//     are refused with the mismatch named (the logs and /health);
//   - with no prefill worker up, a request waits the admission bound and gets 503 no_prefill
//     with Retry-After (no decode worker up: no_decode), counted in /metrics; requests failed by
//     a killed worker are answered worker_down (or another worker fault's code) and counted so;
//   - SIGTERM of the router with requests in flight: they finish, it exits 0; the workers too;
//   - with --readme: the README's one-host commands, run as printed (ports and paths made free),
//     print what the README shows.
// Every process is killed on any exit. Prints TAP; exits 1 on any failure.
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'node-modules', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = args.kvfence;
const NS_A = args['ns-a'] ?? null;
const HOST_A = args['host-a'] ?? '127.0.0.1';
const HOST_B = args['host-b'] ?? '127.0.0.1';
const entry = path.join(args['node-modules'], 'openai', 'index.mjs');
if (!fs.existsSync(entry)) {
  console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`);
  process.exit(1);
}
const { default: OpenAI } = await import(pathToFileURL(entry).href);
const W = args.work;
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });
// Every role shares one cluster key, as a deployment across hosts must (the workers listen on
// host-a/host-b, beyond loopback, in the namespace run).
const KEY = path.join(W, 'cluster.key');
execFileSync(KVF, ['keygen', KEY], { stdio: 'ignore' });

// ---- processes: each tracked and killed on any exit ----
const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the whole suite ran past 400 s'); killAll(); process.exit(1); }, 400000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const withTimeout = (p, ms, what) => Promise.race([p, sleep(ms).then(() => { throw new Error(`${what}: no answer in ${ms} ms`); })]);

function launch(name, argv, ns = null, env = {}) {
  const cmd = ns ? 'ip' : KVF;
  const full = ns ? ['netns', 'exec', ns, KVF, ...argv] : argv;
  const child = spawn(cmd, full, { stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1', KVFENCE_CLUSTER_KEY_FILE: KEY, ...env } });
  children.add(child);
  const p = { name, child, out: '', err: '', exited: null };
  child.stdout.on('data', (d) => { p.out += d; });
  child.stderr.on('data', (d) => { p.err += d; });
  p.exitP = new Promise((r) => child.on('exit', (code, sig) => { p.exited = { code, sig }; children.delete(child); r(p.exited); }));
  return p;
}
async function waitFor(p, re, ms, where = 'out') {
  return withTimeout(new Promise((resolve, reject) => {
    const poll = setInterval(() => {
      const m = p[where].match(re);
      if (m) { clearInterval(poll); resolve(m); }
      if (p.exited) { clearInterval(poll); reject(new Error(`${p.name} exited early (${JSON.stringify(p.exited)}): ${p.err.slice(-2000)}`)); }
    }, 20);
  }), ms, `${p.name}: ${re}`);
}
// A worker on a fixed port (so a restart comes back at the same address).
async function worker(role, name, host, port, model, ns, extra = [], env = {}) {
  const argv = [role, '--model', model, '--listen', `${host}:${port}`, '--threads', '1', ...extra];
  if (role === 'decode') argv.push('--kv-memory', '8M');
  const p = launch(name, argv, ns, env);
  const m = await waitFor(p, /listening (\S+) (\d+)/, 60000);
  assert.equal(Number(m[2]), port);
  return p;
}
async function stopClean(p, sig = 'SIGTERM') {
  p.child.kill(sig);
  const ex = await withTimeout(p.exitP, 30000, `${p.name} ${sig}`).catch((e) => { p.child.kill('SIGKILL'); throw e; });
  assert.equal(ex.code, 0, `${p.name} exit ${JSON.stringify(ex)}\n${p.err.slice(-3000)}`);
  assert.doesNotMatch(p.err, /AddressSanitizer|LeakSanitizer|runtime error/, p.err.slice(-3000));
}
async function kill9(p) {
  p.child.kill('SIGKILL');
  await withTimeout(p.exitP, 10000, `${p.name} SIGKILL`);
}
// A free TCP port on this host (the workers' UCX listeners bind it next).
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// ---- TAP ----
let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}

// ---- the reference: kvfence run ----
const refCache = new Map();
function reference(model, prompt, s) {
  const key = JSON.stringify([model, prompt, s]);
  if (refCache.has(key)) return refCache.get(key);
  const out = execFileSync(KVF, ['run', '--model', model, '--prompt', prompt, '--max-tokens', String(s.max_tokens),
    '--temperature', String(s.temperature ?? 0), '--top-k', String(s.top_k ?? 0), '--top-p', String(s.top_p ?? 1),
    '--seed', String(s.seed ?? 1), '--threads', '1', '--print-token-ids', '--print-logprobs'], { encoding: 'utf8', maxBuffer: 1 << 24 });
  const lines = out.split('\n');
  const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
  const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
  const ref = { ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround), max: s.max_tokens };
  refCache.set(key, ref);
  return ref;
}
const idOf = (t) => { const m = /^token_id:(\d+)$/.exec(t); assert.ok(m, `not a token id: ${t}`); return Number(m[1]); };

async function served(client, prompt, s, { stream = false } = {}) {
  const body = { model: 'm', prompt, max_tokens: s.max_tokens, temperature: s.temperature ?? 0, logprobs: 0, return_tokens_as_token_ids: true };
  for (const k of ['top_k', 'top_p', 'seed']) if (s[k] !== undefined) body[k] = s[k];
  const got = { ids: [], lps: [] };
  if (!stream) {
    const r = await client.completions.create(body);
    got.ids = r.choices[0].logprobs.tokens.map(idOf);
    got.lps = r.choices[0].logprobs.token_logprobs.map(Math.fround);
    return got;
  }
  const st = await client.completions.create({ ...body, stream: true });
  for await (const ch of st) {
    const c = ch.choices[0];
    if (c?.logprobs) { got.ids.push(...c.logprobs.tokens.map(idOf)); got.lps.push(...c.logprobs.token_logprobs.map(Math.fround)); }
  }
  return got;
}
function sameAsRun(got, ref, what) {
  assert.deepEqual(got.ids, ref.ids, `${what}: token ids`);
  assert.deepEqual(got.lps, ref.lps, `${what}: logprobs (float32)`);
}

// ======================================================================================
const MODEL = path.join(W, 'tiny.gguf');
const OTHER = path.join(W, 'other.gguf');
execFileSync(KVF, ['mkmodel', MODEL, '--shape', 'tiny', '--type', 'q8_0', '--seed', '5'], { stdio: 'ignore' });
execFileSync(KVF, ['mkmodel', OTHER, '--shape', 'tiny', '--type', 'q8_0', '--seed', '6'], { stdio: 'ignore' });
const cases = [
  { prompt: 'the quick brown fox', s: { max_tokens: 24, temperature: 0 } },
  { prompt: 'one two three four five six seven eight nine ten eleven twelve thirteen', s: { max_tokens: 20, temperature: 0.8, top_k: 40, top_p: 0.9, seed: 7 } },
  { prompt: 'a', s: { max_tokens: 30, temperature: 1.3, seed: 12345 } },
  { prompt: 'zebra apple zebra apple zebra apple zebra apple zebra apple zebra apple zebra apple', s: { max_tokens: 16, temperature: 1.0, top_p: 0.5, seed: 3 } },
];
const refs = cases.map((c) => reference(MODEL, c.prompt, c.s));

const ports = { p1: await freePort(), p2: await freePort(), d1: await freePort(), d2: await freePort() };
if (NS_A) for (const k of ['p1', 'd1']) ports[k] = 20000 + Math.floor(Math.random() * 20000);
const addr = { p1: `${HOST_A}:${ports.p1}`, p2: `${HOST_B}:${ports.p2}`, d1: `${HOST_A}:${ports.d1}`, d2: `${HOST_B}:${ports.d2}` };
const nsOf = { p1: NS_A, d1: NS_A, p2: null, d2: null };
const hostOf = { p1: HOST_A, d1: HOST_A, p2: HOST_B, d2: HOST_B };
const W_ = {};
// Prefill 1's first process writes slowly (test builds: every put 1 s late), so that its kill
// lands with writes in flight.
const startW = (k, env = {}) => worker(k[0] === 'p' ? 'prefill' : 'decode', k, hostOf[k], ports[k], MODEL, nsOf[k], [], env).then((p) => { W_[k] = p; return p; });

// The router first, on an ephemeral HTTP port; options from the environment for some.
const router = launch('router', ['router', '--model', MODEL, '--port', '0', '--decode', `${addr.d1},${addr.d2}`, '--admit-timeout', '20000'],
  null, { KVFENCE_PREFILL: `${addr.p1},${addr.p2}` });
const rport = Number((await waitFor(router, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]);
const URL_ = `http://127.0.0.1:${rport}`;
const client = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const health = async () => { const r = await fetch(`${URL_}/health`); return { status: r.status, body: await r.json() }; };
const worker_ = (h, role, a) => h.body.workers.find((w) => w.role === role && `${w.host}:${w.port}` === a);
async function until(what, pred, ms = 30000) {
  const t = Date.now() + ms;
  let h;
  for (;;) {
    h = await health();
    if (pred(h)) return h;
    if (Date.now() > t) throw new Error(`${what}: not within ${ms} ms: ${JSON.stringify(h)}`);
    await sleep(50);
  }
}
// kvfence_request_errors_total by reason, from a router's /metrics.
async function requestErrors(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const m of text.matchAll(/^kvfence_request_errors_total\{reason="([a-z_]+)"\} (\d+)$/gm)) out[m[1]] = Number(m[2]);
  return { out, text };
}
// What a request that failed because a worker died may be told (docs/SERVER.md).
const WORKER_FAULT_CODES = new Set(['worker_down', 'prefill_stalled', 'no_prefill', 'worker_failed', 'kv_verification_failed']);
const allUp = (h) => h.status === 200 && h.body.workers.every((w) => w.up);
const idle = (h) => h.body.decode.free === h.body.decode.pages && h.body.decode.reserved === 0 && h.body.in_flight === 0 && h.body.running === 0;

await test('router alone: /health 503, the reason named, every worker listed as unreachable', async () => {
  const h = await health();
  assert.equal(h.status, 503);
  assert.equal(h.body.reason, 'no decode worker is reachable');
  assert.equal(h.body.workers.length, 4);
  for (const w of h.body.workers) assert.equal(w.up, false, JSON.stringify(w));
});

await test('workers started after the router, in any order: it serves once they are up', async () => {
  await startW('d2');
  await startW('p2');
  await startW('d1');
  await startW('p1', { KVF_FAULTS: 'put_delay_ms=1000,seed=3' });
  await until('every worker up', allUp);
});

await test('each case alone and streamed equals kvfence run', async () => {
  for (const [i, c] of cases.entries()) {
    sameAsRun(await served(client, c.prompt, c.s), refs[i], `case ${i}`);
    sameAsRun(await served(client, c.prompt, c.s, { stream: true }), refs[i], `case ${i} streamed`);
  }
});

await test('16 at once equal kvfence run; both decode workers commit, both prefills are granted', async () => {
  const before = await health();
  const jobs = [];
  for (let k = 0; k < 16; k++) {
    const i = k % cases.length;
    jobs.push(served(client, cases[i].prompt, cases[i].s, { stream: k % 2 === 0 }).then((g) => sameAsRun(g, refs[i], `request ${k}`)));
  }
  await withTimeout(Promise.all(jobs), 120000, '16 concurrent');
  const h = await until('idle', idle);
  for (const d of ['d1', 'd2']) assert.ok(worker_(h, 'decode', addr[d]).committed > 0, `${d} committed nothing: ${JSON.stringify(h.body.workers)}`);
  for (const p of ['p1', 'p2']) assert.ok(worker_(h, 'prefill', addr[p]).granted > worker_(before, 'prefill', addr[p]).granted, `${p} was granted nothing`);
});

// Whether this build has the fault hooks (test builds): a slow prefill 1 then has writes in flight.
const slowPuts = /KVF_FAULTS/.test(execFileSync('strings', [KVF], { encoding: 'utf8', maxBuffer: 1 << 28 }));

await test('/metrics: valid under promtool, one series per worker, figures equal to /health', async () => {
  const h = await until('idle', idle);
  const text = await (await fetch(`${URL_}/metrics`)).text();
  const pc = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(pc.error, undefined, `promtool: ${pc.error} (Debian's prometheus package; scripts/install-deps.sh installs it)`);
  assert.equal(pc.status, 0, `promtool check metrics: ${pc.stdout}${pc.stderr}`);
  for (const k of ['p1', 'p2', 'd1', 'd2']) {
    const role = k[0] === 'p' ? 'prefill' : 'decode';
    assert.match(text, new RegExp(`kvfence_worker_up\\{role="${role}",worker="${addr[k].replaceAll('.', '\\.')}"\\} 1`), `${k} up in /metrics`);
  }
  for (const d of ['d1', 'd2']) {
    const w = worker_(h, 'decode', addr[d]);
    const m = text.match(new RegExp(`kvfence_worker_pages\\{worker="${addr[d].replaceAll('.', '\\.')}",state="KVF_PAGE_FREE"\\} (\\d+)`));
    assert.ok(m, `${d} free pages in /metrics`);
    assert.equal(Number(m[1]), w.free, `${d} free pages: /metrics and /health`);
  }
});

// Under load, a worker dies: each request is right or clearly failed; nothing else is disturbed.
async function churn(victim, expectFailures) {
  const outcomes = { ok: 0, failed: 0, codes: {} };
  const jobs = [];
  const before = await health();
  const errs0 = (await requestErrors(URL_)).out;
  for (let k = 0; k < 16; k++) {
    const i = k % cases.length;
    const s = { ...cases[i].s, max_tokens: victim[0] === 'd' ? 1500 : 160 };
    const ref = reference(MODEL, cases[i].prompt, s);
    jobs.push(served(client, cases[i].prompt, s, { stream: k % 2 === 1 }).then(
      (g) => { sameAsRun(g, ref, `request ${k}`); outcomes.ok++; },
      (e) => {
        // Answered with an error (a status, or an SSE error event: the SDK's APIError with the
        // event's code) naming a worker fault, or a stream cut short.
        const code = e.code ?? e.error?.code;
        if (code !== undefined || e.status !== undefined)
          assert.ok(WORKER_FAULT_CODES.has(code) && (e.status === undefined || e.status === 502 || e.status === 503), `request ${k}: not a worker fault's answer: ${e.status} ${code} ${e.message}`);
        else
          assert.match(String(e.message), /terminated|aborted/i, `request ${k}: not a clear error: ${e.message}`);
        outcomes.codes[code ?? 'cut'] = (outcomes.codes[code ?? 'cut'] ?? 0) + 1;
        outcomes.failed++;
      }));
  }
  // Killed while it has work: a decode worker running requests, a prefill worker granted prompts.
  const role = victim[0] === 'p' ? 'prefill' : 'decode';
  await until(`${victim} busy`, (h) => (role === 'decode' ? worker_(h, 'decode', addr[victim]).running > 0
    : worker_(h, 'prefill', addr[victim]).granted > worker_(before, 'prefill', addr[victim]).granted), 30000);
  await kill9(W_[victim]);
  await withTimeout(Promise.all(jobs), 120000, 'requests under churn');
  assert.equal(outcomes.ok + outcomes.failed, 16);
  // A floor on correct answers: requests spread over both workers of the victim's role (the
  // clean binary: 8 of 16 complete), so the survivor's must complete — a server that fails
  // everything cannot pass.
  assert.ok(outcomes.ok >= 4, `only ${outcomes.ok} of 16 completed equal to kvfence run (floor 4)`);
  if (expectFailures) assert.ok(outcomes.failed > 0, 'the killed decode worker had running requests: they must fail');
  // Each failure answered is counted under the code its client was told (a stream when the
  // server lets go of it, just after its last bytes); a stream seen cut short may be counted
  // under any reason, and nothing else is counted.
  const told = Object.entries(outcomes.codes).filter(([c]) => c !== 'cut');
  let errs1, sum;
  for (let t = Date.now() + 5000; ; await sleep(50)) {
    errs1 = (await requestErrors(URL_)).out;
    sum = Object.keys(errs0).reduce((a, r) => a + errs1[r] - errs0[r], 0);
    if (told.every(([c, k]) => errs1[c] - errs0[c] >= k) || Date.now() > t) break;
  }
  for (const [c, k] of told) assert.ok(errs1[c] - errs0[c] >= k, `kvfence_request_errors_total{reason="${c}"} grew ${errs1[c] - errs0[c]}, ${k} told ${JSON.stringify(outcomes.codes)}`);
  assert.ok(sum <= outcomes.failed, `${sum} errors counted for ${outcomes.failed} failed requests`);
  return outcomes;
}

for (const victim of ['p1', 'd1']) {
  await test(`SIGKILL of ${victim} under load: each request equals kvfence run or fails clearly; restarted, it is used again`, async () => {
    const o = await churn(victim, victim[0] === 'd' || slowPuts);
    console.log(`# ${victim} killed: ${o.ok} completed and equal to kvfence run, ${o.failed} failed with a clear error ${JSON.stringify(o.codes)}`);
    if (victim[0] === 'd') assert.ok((o.codes.worker_down ?? 0) > 0, `the decode worker's running requests: 502 worker_down ${JSON.stringify(o.codes)}`);
    const role = victim[0] === 'p' ? 'prefill' : 'decode';
    await until(`${victim} seen down`, (h) => !worker_(h, role, addr[victim]).up);
    // Meanwhile the others serve.
    sameAsRun(await served(client, cases[0].prompt, cases[0].s), refs[0], 'served while it is down');
    await startW(victim);
    const back = await until(`${victim} back`, allUp);
    const g0 = role === 'prefill' ? worker_(back, 'prefill', addr[victim]).granted : 0;
    // Used again within a bound (a decode worker first connects to its prefills; a decode
    // worker retries a lost prefill with backoff up to 2 s): batches of 8 until it is.
    const used = (h) => (role === 'prefill' ? worker_(h, 'prefill', addr[victim]).granted > g0
      : worker_(h, 'decode', addr[victim]).committed > 0);
    let rounds = 0;
    for (let t = Date.now() + 20000; ; rounds++) {
      const jobs = [];
      for (let k = 0; k < 8; k++) jobs.push(served(client, cases[k % 4].prompt, cases[k % 4].s).then((g) => sameAsRun(g, refs[k % 4], `after restart ${k}`)));
      await withTimeout(Promise.all(jobs), 120000, 'after restart');
      if (used(await health())) break;
      if (Date.now() > t) throw new Error(`${victim} not used again within 20 s: ${JSON.stringify((await health()).body.workers)}`);
      await sleep(200);
    }
    console.log(`# ${victim} used again after ${rounds + 1} batch(es) of 8`);
    await until('idle after restart', idle);
  });
}

await test('a decode worker of another model and a prefill with another context limit are refused, named', async () => {
  const dx = await worker('decode', 'dx', '127.0.0.1', await freePort(), OTHER, null);
  const px = await worker('prefill', 'px', '127.0.0.1', await freePort(), MODEL, null, ['--context-length', '256']);
  const pxa = `127.0.0.1:${px.out.match(/listening \S+ (\d+)/)[1]}`;
  const dxa = `127.0.0.1:${dx.out.match(/listening \S+ (\d+)/)[1]}`;
  const r2 = launch('router2', ['router', '--model', MODEL, '--port', '0', '--decode', `${dxa},${addr.d2}`, '--prefill', pxa]);
  const p2 = Number((await waitFor(r2, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]);
  await waitFor(r2, /not using the decode worker at 127\.0\.0\.1:\d+: model fingerprint/, 20000, 'err');
  await waitFor(dx, /refusing a router: model fingerprint/, 20000, 'err');
  await waitFor(px, /refusing a decode worker: context limit/, 20000, 'err');
  let h;
  for (let t = Date.now() + 20000; ; await sleep(100)) {
    const r = await fetch(`http://127.0.0.1:${p2}/health`);
    h = { status: r.status, body: await r.json() };
    const d = h.body.workers.find((w) => w.role === 'decode' && `${w.host}:${w.port}` === dxa);
    const p = h.body.workers.find((w) => w.role === 'prefill');
    if (/model fingerprint/.test(d.reason ?? '') && /context limit 256 tokens there/.test(p.reason ?? '')) break;
    // (d2 serves router2 with the prefills router 1 named: a decode worker uses the union.)
    if (Date.now() > t) throw new Error(`reasons not shown: ${JSON.stringify(h.body.workers)}`);
  }
  await stopClean(r2);
  await stopClean(dx);
  await stopClean(px);
});

await test('no prefill worker up: 503 no_prefill with Retry-After 5; no decode worker up: 503 no_decode; each counted in /metrics (promtool-valid)', async () => {
  // A decode worker whose only prefill (as its router names it) has nothing listening, and a
  // router that waits 1 s for a decode worker with a live prefill.
  const dport = await freePort();
  const deadPrefill = `127.0.0.1:${await freePort()}`, deadDecode = `127.0.0.1:${await freePort()}`;
  const dy = await worker('decode', 'dy', '127.0.0.1', dport, MODEL, null, ['--admit-timeout', '1000']);
  const r3 = launch('router3', ['router', '--model', MODEL, '--port', '0', '--decode', `127.0.0.1:${dport}`, '--prefill', deadPrefill, '--admit-timeout', '1000']);
  const r4 = launch('router4', ['router', '--model', MODEL, '--port', '0', '--decode', deadDecode, '--prefill', deadPrefill, '--admit-timeout', '1000']);
  const u3 = `http://127.0.0.1:${(await waitFor(r3, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  const u4 = `http://127.0.0.1:${(await waitFor(r4, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000, 'err'))[1]}`;
  for (let t = Date.now() + 20000; ; await sleep(100)) {
    const h = await (await fetch(`${u3}/health`)).json();
    if (h.workers.find((w) => w.role === 'decode').up) break;
    if (Date.now() > t) throw new Error(`dy not up at router3: ${JSON.stringify(h.workers)}`);
  }
  await sleep(500); // its status (no prefill up) reaches the router
  for (const [u, code, says] of [[u3, 'no_prefill', /no prefill worker is connected/], [u4, 'no_decode', /no decode worker is connected/]]) {
    const e0 = (await requestErrors(u)).out;
    assert.ok(Object.keys(e0).length >= 10 && Object.values(e0).every((v) => v === 0), `every reason at 0 from the start: ${JSON.stringify(e0)}`);
    const t0 = Date.now();
    const r = await fetch(`${u}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: 'm', prompt: 'Hello', max_tokens: 4 }) });
    const waited = Date.now() - t0;
    const j = await r.json();
    assert.equal(r.status, 503, JSON.stringify(j));
    assert.equal(r.headers.get('retry-after'), '5', `${code}: Retry-After`);
    assert.equal(j.error.code, code, JSON.stringify(j));
    assert.equal(j.error.type, 'server_error');
    assert.match(j.error.message, says);
    assert.ok(waited >= 900 && waited < 10000, `${code} after ${waited} ms (admission bound 1000 ms)`);
    const c = new OpenAI({ baseURL: `${u}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
    // Streamed: the 200 went out at submit, so the same error comes as the stream's error event.
    await assert.rejects((async () => { for await (const _ of await c.completions.create({ model: 'm', prompt: 'Hello', max_tokens: 4, stream: true })); })(),
      (e) => e instanceof OpenAI.APIError && e.code === code && says.test(e.message));
    // (A stream is counted when the server lets go of it, just after its last bytes.)
    let e1, text;
    for (let t = Date.now() + 5000; ; await sleep(50)) {
      ({ out: e1, text } = await requestErrors(u));
      if (e1[code] === 2 || Date.now() > t) break;
    }
    for (const k of Object.keys(e0)) assert.equal(e1[k], k === code ? 2 : 0, `kvfence_request_errors_total{reason="${k}"}`);
    const pc = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    assert.equal(pc.status, 0, `promtool check metrics: ${pc.error ?? ''}${pc.stdout}${pc.stderr}`);
  }
  await stopClean(r3);
  await stopClean(r4);
  await stopClean(dy);
});

await test('SIGTERM of the router with requests in flight: they finish equal to kvfence run, exit 0', async () => {
  const jobs = [];
  for (let k = 0; k < 4; k++) jobs.push(served(client, cases[k].prompt, cases[k].s, { stream: true }).then((g) => sameAsRun(g, refs[k], `in flight ${k}`)));
  await sleep(100);
  router.child.kill('SIGTERM');
  await withTimeout(Promise.all(jobs), 60000, 'in-flight requests');
  await stopClean(router);
});

await test('SIGTERM of every worker: exit 0, no sanitizer report', async () => {
  for (const k of ['d1', 'd2', 'p1', 'p2']) await stopClean(W_[k]);
});

if (args.readme) {
  await test('README: the split roles on one host, as printed, answer what the README shows', async () => {
    const md = fs.readFileSync(args.readme, 'utf8');
    const m = md.match(/```sh\n(build\/kvfence mkmodel \/tmp\/kvf-hist\.gguf[\s\S]*?)```\n+```json\n([\s\S]*?)```/);
    assert.ok(m, 'README has the one-host split-roles commands with their output');
    let script = m[1].replaceAll('build/kvfence', KVF).replaceAll('/tmp/kvf-hist.gguf', path.join(W, 'kvf-hist.gguf'));
    for (const p of ['7001', '7002', '7101', '8090']) {
      const f = await freePort();
      script = script.replaceAll(`127.0.0.1:${p}`, `127.0.0.1:${f}`).replaceAll(`--port ${p}`, `--port ${f}`);
    }
    const sh = spawn('bash', ['-c', script], { detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=0' } });
    let out = '';
    sh.stdout.on('data', (d) => { out += d; });
    const done = new Promise((r) => sh.on('exit', r));
    try {
      await withTimeout(done, 90000, 'the README commands');
    } finally {
      try { process.kill(-sh.pid, 'SIGKILL'); } catch { /* gone */ }
    }
    const norm = (x) => x.replace(/"id":"[^"]*"/g, '"id":"*"').replace(/"created":\d+/g, '"created":*').trim();
    // The workers' "listening HOST PORT" lines and mkmodel's line come first: the reply is last.
    const reply = out.slice(out.lastIndexOf('{"id"'));
    assert.equal(norm(reply), norm(m[2]), `README commands printed:\n${out}`);
  });
}

console.log(`1..${n}`);
if (failed) { console.log(`# ${failed} of ${n} failed`); process.exit(1); }
process.exit(0);
