// Long prompts end to end, on an optimised binary (a sanitizer build computes a 8,000-token prompt
// about twenty times slower): `kvfence serve`, and the split roles, on smol135m Q8_0 (8,192-token
// context).
//
//   node long_e2e.mjs --kvfence EXE --work DIR [--test-kvfence EXE] [--big 1]
//
// Checked, each on content (token ids and logprobs equal to `kvfence run` of the same prompt):
//   - a prompt that fills the context (8,192 tokens less the 8 generated) is served;
//   - four prompts of about 2,100 tokens at once, each equal to its solo run, and a short prompt
//     sent behind them gets its first token before any of them finishes (chunks interleave,
//     shortest first); the TTFT and the long ones' latencies are printed;
//   - a client that disconnects while its long prompt is being computed: the pools come back all
//     free, and the next request is right;
//   - split roles: a prefill SIGSTOPped halfway through a long prompt: the request fails within
//     the no-progress bound with 503 prefill_stalled; its pages stay held (not freed by time)
//     until the hold timeout quarantines them and the fence frees them; SIGCONTed, the prefill is
//     at a new epoch and serves a long prompt right;
//   - split roles: a prefill SIGKILLed halfway: the request fails at once (worker_down), the fence
//     frees the pages, a prefill restarted on the address serves right;
//   - with --test-kvfence (a test build, which has the fault hooks), on the tiny model with 16-token
//     chunks each 60 ms slow and a 1.5 s bound: the prefill drops 10% of the frames it sends
//     (PROGRESS among them). Every request equals its solo run or fails with a clear error;
//     nothing leaks, nothing wedges.
//   - with --big 1 (`make long`; outside `make test` for its time, about two minutes more): a
//     4,000-token prompt on the llama3.2-1b shape (Q4_K_M), served by `kvfence serve`, equals
//     `kvfence run`.
// Prints TAP; exits 1 on any failure. Every process is killed on any exit.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'work']) if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
const KVF = args.kvfence;
if (!fs.existsSync(KVF)) {
  console.log(`Bail out! ${KVF} does not exist: the long-prompt suite runs the release build (the CTest fixture release_kvfence, or make release)`);
  process.exit(1);
}
const W = args.work;
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the whole suite ran past 560 s'); killAll(); process.exit(1); }, 560000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const withTimeout = (p, ms, what) => Promise.race([p, sleep(ms).then(() => { throw new Error(`${what}: no answer in ${ms} ms`); })]);

function launch(name, exe, argv, env = {}) {
  const child = spawn(exe, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
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
async function stop(p) {
  if (p.exited) return;
  p.child.kill('SIGTERM');
  const ex = await withTimeout(p.exitP, 30000, `${p.name} SIGTERM`).catch((e) => { p.child.kill('SIGKILL'); throw e; });
  assert.equal(ex.code, 0, `${p.name} exit ${JSON.stringify(ex)}\n${p.err.slice(-3000)}`);
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

// ---- the reference: kvfence run ----
function reference(exe, model, prompt, maxTokens) {
  const out = execFileSync(exe, ['run', '--model', model, '--prompt', prompt, '--max-tokens', String(maxTokens),
    '--temperature', '0', '--threads', '2', '--print-token-ids', '--print-logprobs'],
  { encoding: 'utf8', maxBuffer: 1 << 26, env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=0' } });
  const lines = out.split('\n');
  const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
  const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
  return { prompt_len: nums(lines[at]).length, ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround) };
}

// ---- requests ----
const idOf = (s) => { const m = /^token_id:(\d+)$/.exec(s); return m ? Number(m[1]) : NaN; };
// One completion, streamed: { status, ids, lps, ttft, total, err }. abortMs: disconnect then.
async function complete(url, prompt, maxTokens, { abortMs } = {}) {
  const t0 = Date.now();
  const ac = new AbortController();
  const timer = abortMs !== undefined ? setTimeout(() => ac.abort(), abortMs) : null;
  const got = { ids: [], lps: [], ttft: null, total: null, status: null, err: null, aborted: false, times: [] };
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ model: 'm', prompt, max_tokens: maxTokens, temperature: 0, stream: true, logprobs: 0,
        return_tokens_as_token_ids: true }),
    });
    got.status = r.status;
    if (r.status !== 200) { got.err = await r.json(); got.retryAfter = r.headers.get('retry-after'); return got; }
    const dec = new TextDecoder();
    let buf = '';
    for await (const chunk of r.body) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('');
        if (!data || data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) { got.err = j; continue; }
        const x = j.choices?.[0];
        if (x?.logprobs?.tokens?.length) {
          if (got.ttft === null) got.ttft = Date.now() - t0;
          got.ids.push(...x.logprobs.tokens.map(idOf));
          for (let k = 0; k < x.logprobs.tokens.length; k++) got.times.push(Date.now() - t0);
          got.lps.push(...x.logprobs.token_logprobs.map(Math.fround));
        }
      }
    }
  } catch (e) {
    if (e?.name === 'AbortError') got.aborted = true; else throw e;
  } finally {
    clearTimeout(timer);
  }
  got.total = Date.now() - t0;
  return got;
}
function assertSame(got, ref, what) {
  assert.equal(got.status, 200, `${what}: status ${got.status} ${JSON.stringify(got.err)}`);
  assert.equal(got.err, null, `${what}: an error event ${JSON.stringify(got.err)}`);
  assert.deepEqual(got.ids, ref.ids, `${what}: token ids differ from kvfence run`);
  assert.deepEqual(got.lps, ref.lps, `${what}: logprobs differ from kvfence run`);
}
async function health(url) {
  const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(10000) });
  return r.json();
}
const held = (h) => (h.decode?.by_state?.KVF_PAGE_HELD ?? 0) + (h.decode?.by_state?.KVF_PAGE_QUARANTINED ?? 0);
// Every pool all free, nothing reserved, held or quarantined, nothing in flight.
async function quiesce(url, ms) {
  const until = Date.now() + ms;
  let h;
  for (;;) {
    h = await health(url);
    const idle = h.decode && h.decode.free === h.decode.pages && h.decode.reserved === 0 && h.in_flight === 0 &&
      held(h) === 0 && (!h.prefill || !h.prefill.pages || h.prefill.free === h.prefill.pages);
    if (idle) return h;
    if (Date.now() > until) throw new Error(`not back to all free after ${ms} ms: ${JSON.stringify(h)}`);
    await sleep(200);
  }
}
// A count of exactly `want` prompt tokens (BOS included), from /tokenize: text of words, cut.
const WORDS = ['river', 'stone', 'cloud', 'paper', 'seven', 'orange', 'maple', 'window', 'silver', 'garden'];
async function promptOf(url, want, seed) {
  let x = seed;
  const rnd = () => { x = (x * 1103515245 + 12345) % 2147483648; return x; };
  const words = [];
  for (let i = 0; i < want; i++) words.push(WORDS[rnd() % WORDS.length]);
  let text = words.join(' ');
  const count = async (s) => (await (await fetch(`${url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: s }) })).json()).count;
  // Byte-level vocabulary: one token a byte (a space three); trim to the exact count.
  let c = await count(text);
  while (c > want) { text = text.slice(0, Math.max(1, text.length - Math.max(1, Math.floor((c - want) / 2)))); c = await count(text); }
  while (c < want) { text += 'x'; c = await count(text); }
  assert.equal(c, want, `a prompt of ${want} tokens`);
  return text;
}

const CTX = 8192, GEN = 8;
const MODEL = path.join(W, 'smol135m-q8_0.gguf');
execFileSync(KVF, ['mkmodel', MODEL, '--shape', 'smol135m', '--type', 'q8_0'], { stdio: 'ignore' });

// ---- serve ----
const srv = launch('serve', KVF, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '2',
  '--kv-memory', '1G', '--context-length', String(CTX)]);
const m0 = await waitFor(srv, /listening on (http:\/\/127\.0\.0\.1:\d+)/, 60000, 'err');
const URL_ = m0[1];
const figures = [];

await test(`a prompt that fills the context (${CTX - GEN} tokens + ${GEN} generated) equals kvfence run`, async () => {
  const prompt = await promptOf(URL_, CTX - GEN, 11);
  const got = await complete(URL_, prompt, GEN);
  const ref = reference(KVF, MODEL, prompt, GEN);
  assert.equal(ref.prompt_len, CTX - GEN);
  assertSame(got, ref, 'full context');
  figures.push(`full-context prompt (${CTX - GEN} tokens): served in ${(got.total / 1000).toFixed(1)} s, TTFT ${(got.ttft / 1000).toFixed(1)} s`);
});

await test('four ~2,100-token prompts at once, each equal to its solo run; a short prompt behind them gets its first token before any of them finishes', async () => {
  const longs = [];
  for (let i = 0; i < 4; i++) longs.push(await promptOf(URL_, 2100 + 37 * i, 100 + i));
  const short = await promptOf(URL_, 40, 7);
  const running = await promptOf(URL_, 30, 8);
  // A stream already decoding when the long prompts arrive: its gaps between tokens.
  const rj = complete(URL_, running, 96);
  await sleep(300);
  const t0 = Date.now();
  const jobs = longs.map((p) => complete(URL_, p, GEN).then((g) => ({ ...g, end: Date.now() - t0 })));
  await sleep(1500); // the long ones are being computed
  const ts = Date.now() - t0;
  const sj = complete(URL_, short, 4).then((g) => ({ ...g, end: Date.now() - t0 }));
  const [s, rg, ...ls] = await Promise.all([sj, rj, ...jobs]);
  assertSame(s, reference(KVF, MODEL, short, 4), 'the short prompt');
  assertSame(rg, reference(KVF, MODEL, running, 96), 'the running stream');
  const gaps = rg.times.slice(1).map((t, k) => t - rg.times[k]).sort((a, b) => a - b);
  const gp = (q) => gaps[Math.min(gaps.length - 1, Math.floor(q * gaps.length))];
  for (const [i, g] of ls.entries()) assertSame(g, reference(KVF, MODEL, longs[i], GEN), `long prompt ${i}`);
  const firstLongEnd = Math.min(...ls.map((g) => g.end));
  const shortFirst = ts + s.ttft;
  figures.push(`a stream decoding while they were computed: gaps between its tokens p50 ${gp(0.5)} ms, p90 ${gp(0.9)} ms, max ${gaps[gaps.length - 1]} ms`);
  figures.push(`4 x ~2,100-token prompts at once: latencies ${ls.map((g) => (g.total / 1000).toFixed(1)).join(', ')} s; a 40-token prompt sent 1.5 s in: TTFT ${(s.ttft / 1000).toFixed(2)} s (its first token at ${(shortFirst / 1000).toFixed(1)} s, the first long one done at ${(firstLongEnd / 1000).toFixed(1)} s)`);
  assert.ok(shortFirst < firstLongEnd, `the short prompt's first token at ${shortFirst} ms, after a long one finished at ${firstLongEnd} ms`);
});

await test('a client that disconnects while its 4,000-token prompt is computed: its work stops, the pools come back all free, the next request is right', async () => {
  const p = await promptOf(URL_, 4000, 55);
  const t0 = (await health(URL_)).counters.decoded_tokens;
  // 64 tokens asked: a server that ignores the disconnect finishes the prompt and decodes 63.
  const job = complete(URL_, p, 64, { abortMs: 2000 });
  await sleep(1800);
  // Still in prefill, by the server's own state, just before the disconnect.
  const h = await health(URL_);
  assert.ok(h.counters.decoded_tokens === t0 && (h.decode?.by_state?.KVF_PAGE_GRANTED ?? 0) > 0, `not in prefill at 1.8 s: ${JSON.stringify(h)}`);
  const got = await job;
  assert.ok(got.aborted, 'the request was still running at 2 s');
  await quiesce(URL_, 60000);
  const made = (await health(URL_)).counters.decoded_tokens - t0;
  figures.push(`a disconnect during a 4,000-token prefill: ${made} of 63 decode tokens made after it`);
  assert.ok(made < 32, `${made} tokens decoded for a request whose client left during its prefill: the cancel did not stop it`);
  const q = await promptOf(URL_, 600, 56);
  assertSame(await complete(URL_, q, GEN), reference(KVF, MODEL, q, GEN), 'after the disconnect');
});
await stop(srv);

// ---- split roles: a prefill stopped, then killed, halfway through a long prompt ----
const BOUND = 2000, HOLD = 3000;
const pport = await freePort(), dport = await freePort();
const prefillArgs = ['prefill', '--model', MODEL, '--listen', `127.0.0.1:${pport}`, '--threads', '1', '--context-length', String(CTX)];
let pre = launch('prefill', KVF, prefillArgs);
await waitFor(pre, /listening \S+ \d+/, 60000);
const dec = launch('decode', KVF, ['decode', '--model', MODEL, '--listen', `127.0.0.1:${dport}`, '--threads', '1', '--kv-memory', '1G',
  '--context-length', String(CTX), '--progress-timeout', String(BOUND), '--hold-timeout', String(HOLD)]);
await waitFor(dec, /listening \S+ \d+/, 60000);
const rtr = launch('router', KVF, ['router', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--prefill', `127.0.0.1:${pport}`,
  '--decode', `127.0.0.1:${dport}`, '--context-length', String(CTX)]);
const mr = await waitFor(rtr, /listening on (http:\/\/127\.0\.0\.1:\d+)/, 60000, 'err');
const RURL = mr[1];
await waitFor(rtr, /decode worker \S+ is up/, 60000, 'err');

await test(`split: a prefill SIGSTOPped halfway through a 4,000-token prompt fails it within the ${BOUND} ms bound (503 prefill_stalled); its pages are held, not freed by time, until the fence; SIGCONTed it serves right at a new epoch`, async () => {
  const p = await promptOf(RURL, 4000, 77);
  const t0 = Date.now();
  const job = complete(RURL, p, GEN);
  await sleep(3000); // one prefill thread: a 4,000-token prompt takes several seconds
  pre.child.kill('SIGSTOP');
  const tStop = Date.now();
  const got = await job;
  const waited = Date.now() - tStop;
  // A stream's headers went out at once: the error comes as its SSE error event, no token before.
  assert.ok(got.status === 503 || got.status === 200, `status ${got.status}`);
  assert.equal(got.ids.length, 0, 'tokens before the error');
  assert.equal(got.err?.error?.code, 'prefill_stalled', JSON.stringify(got.err));
  assert.ok(waited < BOUND + 1500, `answered ${waited} ms after the stop (bound ${BOUND} ms)`);
  // Held, not freed by time: until the hold timeout quarantines them and the fence frees them.
  // (The router's /health carries the decode worker's last status frame: polled.)
  let h1 = await health(RURL), seenHeld = held(h1) > 0;
  const f0 = h1.counters?.fences ?? 0;
  for (let k = 0; k < 20 && !seenHeld; k++) { await sleep(100); h1 = await health(RURL); seenHeld = held(h1) > 0; }
  assert.ok(seenHeld, `no page held after the failure: ${JSON.stringify(h1.decode)}`);
  assert.ok((h1.counters?.fences ?? 0) === f0, 'fenced before the hold timeout');
  await quiesce(RURL, HOLD + 10000);
  const h2 = await health(RURL);
  assert.ok((h2.counters?.fences ?? 0) > f0, `the pages came back without a fence: ${JSON.stringify(h2.counters)}`);
  figures.push(`SIGSTOP at ${((tStop - t0) / 1000).toFixed(1)} s into a 4,000-token prompt: 503 prefill_stalled ${waited} ms later; pages freed by the fence`);
  pre.child.kill('SIGCONT');
  const q = await promptOf(RURL, 2500, 78);
  let g2;
  for (let k = 0; k < 20; k++) { // the prefill reconnects at the next epoch
    g2 = await complete(RURL, q, GEN);
    if (g2.status === 200 && !g2.err) break;
    await sleep(500);
  }
  assertSame(g2, reference(KVF, MODEL, q, GEN), 'after SIGCONT');
});

await test('split: a prefill SIGKILLed halfway through a 4,000-token prompt: the request fails at once (worker_down), the fence frees its pages, a restarted prefill serves right', async () => {
  const p = await promptOf(RURL, 4000, 79);
  const job = complete(RURL, p, GEN);
  await sleep(3000);
  pre.child.kill('SIGKILL');
  const tKill = Date.now();
  await pre.exitP;
  const got = await job;
  const waited = Date.now() - tKill;
  assert.equal(got.ids.length, 0, 'tokens from a killed prefill');
  assert.ok(['worker_down', 'worker_failed', 'prefill_stalled', 'no_prefill'].includes(got.err?.error?.code), JSON.stringify(got.err));
  assert.ok(waited < 3000, `answered ${waited} ms after the kill`);
  await quiesce(RURL, HOLD + 10000);
  pre = launch('prefill-2', KVF, prefillArgs);
  await waitFor(pre, /listening \S+ \d+/, 60000);
  const q = await promptOf(RURL, 3000, 80);
  let g2;
  for (let k = 0; k < 20; k++) {
    g2 = await complete(RURL, q, GEN);
    if (g2.status === 200 && !g2.err) break;
    await sleep(500);
  }
  assertSame(g2, reference(KVF, MODEL, q, GEN), 'after the restart');
});
await stop(rtr);
await stop(dec);
await stop(pre);

// ---- lost frames (PROGRESS among them), on a test build with fault hooks ----
if (args['test-kvfence']) {
  const TK = args['test-kvfence'];
  const TINY = path.join(W, 'tiny.gguf');
  execFileSync(TK, ['mkmodel', TINY, '--shape', 'tiny', '--seed', '5'], { stdio: 'ignore' });
  await test('split, test build: a prefill that drops 10% of the frames it sends (PROGRESS among them), 16-token chunks 60 ms slow, 1.5 s bound: every request equals its solo run or fails with a clear error; nothing leaks or wedges', async () => {
    const pp = await freePort(), dp = await freePort();
    const env = { ASAN_OPTIONS: 'detect_leaks=1' };
    const p = launch('prefill-lossy', TK, ['prefill', '--model', TINY, '--listen', `127.0.0.1:${pp}`, '--threads', '1', '--prefill-chunk', '16'],
      { ...env, KVF_FAULTS: 'frame_drop_pct=10,seed=3', KVF_TEST_CHUNK_MS: '60' });
    await waitFor(p, /listening \S+ \d+/, 60000);
    const d = launch('decode-lossy', TK, ['decode', '--model', TINY, '--listen', `127.0.0.1:${dp}`, '--threads', '1', '--kv-memory', '64M',
      '--progress-timeout', '1500', '--hold-timeout', '2000'], env);
    await waitFor(d, /listening \S+ \d+/, 60000);
    const r = launch('router-lossy', TK, ['router', '--model', TINY, '--host', '127.0.0.1', '--port', '0', '--prefill', `127.0.0.1:${pp}`,
      '--decode', `127.0.0.1:${dp}`, '--admit-timeout', '20000'], env);
    const m = await waitFor(r, /listening on (http:\/\/127\.0\.0\.1:\d+)/, 60000, 'err');
    await waitFor(r, /decode worker \S+ is up/, 60000, 'err');
    const url = m[1];
    const prompts = [];
    for (let i = 0; i < 12; i++) prompts.push(await promptOf(url, 150 + 60 * (i % 4), 300 + i));
    const outs = await Promise.all(prompts.map((q) => complete(url, q, 6)));
    const codes = {};
    let same = 0;
    for (const [i, g] of outs.entries()) {
      if (g.status === 200 && !g.err && g.ids.length) { assertSame(g, reference(TK, TINY, prompts[i], 6), `lossy ${i}`); same++; continue; }
      const code = g.err?.error?.code ?? 'none';
      codes[code] = (codes[code] ?? 0) + 1;
      assert.ok(['prefill_stalled', 'worker_down', 'worker_failed', 'kv_verification_failed', 'pool_exhausted', 'no_prefill'].includes(code),
        `an unclear error: ${g.status} ${JSON.stringify(g.err)}`);
    }
    await quiesce(url, 30000);
    figures.push(`lossy prefill (10% of its frames dropped): ${same} of 12 equal to their solo runs, the rest failed clearly ${JSON.stringify(codes)}`);
    for (const x of [r, d, p]) await stop(x);
  });
}

if (args.big === '1') {
  const BIG = path.join(W, 'llama3.2-1b-q4_k_m.gguf');
  execFileSync(KVF, ['mkmodel', BIG, '--shape', 'llama3.2-1b', '--type', 'q4_k_m'], { stdio: 'ignore' });
  await test('llama3.2-1b shape, Q4_K_M: a 4,000-token prompt served by kvfence serve equals kvfence run', async () => {
    const b = launch('serve-1b', KVF, ['serve', '--model', BIG, '--host', '127.0.0.1', '--port', '0', '--threads', '2', '--context-length', '8192']);
    const mb = await waitFor(b, /listening on (http:\/\/127\.0\.0\.1:\d+)/, 120000, 'err');
    const p = await promptOf(mb[1], 4000, 91);
    const got = await complete(mb[1], p, GEN);
    await stop(b);
    const ref = reference(KVF, BIG, p, GEN);
    assert.equal(ref.prompt_len, 4000);
    assertSame(got, ref, 'llama3.2-1b, 4,000 tokens');
    figures.push(`llama3.2-1b Q4_K_M, a 4,000-token prompt: served in ${(got.total / 1000).toFixed(1)} s, TTFT ${(got.ttft / 1000).toFixed(1)} s`);
  });
}

for (const f of figures) console.log(`# ${f}`);
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
