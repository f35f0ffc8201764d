// The isolation suite: the real `kvfence` processes under chaos, several tenants with canaries,
// every completed response compared bit for bit with the same request run alone.
//
//   node isolation.mjs --kvfence EXE --node-modules DIR --work DIR
//                      [--mode smoke|soak] [--topologies serve,split] [--seed N] [--report FILE]
//                      [--fail-fast 1|content] [--phases NAME,...] [--unverified 1]
//
// The mode defaults to soak when KVF_SOAK=1 (make soak, make isolation), the seed to KVF_ISO_SEED
// or 1; a failure prints the seed, and the same seed replays the same schedule of requests and
// faults (the timing of the processes still varies).
//
// Tenants: each has its own API key and its own canary word for the readable `hist` model (which
// answers with the most frequent word it attended to: docs/TEST_MODELS.md). Tenant alpha's
// prompts are made of "zebra", bravo's of "apple", and so on; any other tenant's canary in
// alpha's output (text or token ids), in a partial stream or in an error body is a leak. A
// random-weight model (`tiny`) with logprobs checks bit-exactness where no word can be read.
//
// Topologies (an object with start/stop and the faults it can inject):
//   serve  one `kvfence serve` (router + prefill + decode in one process over UCX loopback);
//   split  `kvfence prefill` ×2, `kvfence decode`, `kvfence router`, each its own process, over
//          UCX TCP; used when `kvfence router --help` and `kvfence decode --help` say the
//          commands are available, reported as not run otherwise.
//
// Faults, each counted in the report: client disconnects (queued, during prefill, mid-stream,
// a non-streaming request in progress); prompts at exactly the served limit and at limit + 1;
// pool exhaustion (bursts past a small pool, a short admission bound); KVF_FAULTS in every UCX
// transport (put and frame delays, duplicated and (soak, split) dropped control frames, a flush
// that never completes: H17); forged DONEs for a stale epoch and an unknown grant, and a stale
// page's bytes written into a page granted to another request (H18, KVF_TEST_FORGE, a test-build
// hook of the prefill worker); granted prompts the prefill engine refuses, and prompts handed
// off short (only page 0 put, the DONE counting its tokens: H6); in split: prefill SIGKILLed mid-transfer and restarted, prefill
// SIGSTOPped past the hold timeout then SIGCONTed, decode restarted.
//
// Checks: every completed response equal to `kvfence run` of the same prompt and sampling (token
// ids, float32 logprobs, text, finish_reason); no foreign canary anywhere; every request that did
// not complete got a clear error (an HTTP error or an SSE error event with a JSON error object;
// what it streamed before was a prefix of the reference), never a 200 with other content; after
// each phase every pool returns to all free with nothing held or quarantined, and the counters
// agree with the faults injected (foreign tails and undecodable frames 0, verify failures at most the
// forged writes and short handoffs, stale messages at least the forged DONEs, quarantines and fences only where
// a fault can cause them); every process exits as expected (0 on SIGTERM), with no sanitizer
// report in its stderr. Every process started is killed on any exit. Exits 1 on any failure; the
// report (also written as JSON to --report) names the first thing that caught it.
import { spawn, execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const args = { mode: process.env.KVF_SOAK === '1' ? 'soak' : 'smoke', topologies: 'serve,split', seed: process.env.KVF_ISO_SEED || '1' };
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['kvfence', 'node-modules', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const KVF = path.resolve(args.kvfence);
const SOAK = args.mode === 'soak';
// --unverified 1: decode commits what arrives unread (KVF_TEST_UNVERIFIED, a test-build switch:
// no trailer, checksum or tail check), and the forgeries only those checks refuse are not made.
// What then reaches a reply is what the page lifetime rules alone let through: the mutants' runs
// use it for the bugs those checks would otherwise stop before any reply (docs/ISOLATION.md).
const UNVERIFIED = args.unverified === '1';
// --canary-interval S: serve and the router run the production canary (docs/SERVER.md, "Canary")
// every S seconds through the phase's chaos; at each phase's end /health's canary must show no
// failure (a clean binary's output does not depend on batching, faults or forgeries: a request
// they break fails with an error, which the canary counts apart). Off by default (make test's
// smoke and the mutants' runs are as recorded without it).
const CANARY_S = Number(args['canary-interval'] ?? 0);
const entry = path.join(args['node-modules'], 'openai', 'index.mjs');
if (!fs.existsSync(entry)) { console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`); process.exit(1); }
const { default: OpenAI } = await import(pathToFileURL(entry).href);
const W = path.resolve(args.work);
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });
const T0 = Date.now();
// --fail-fast content goes on past hangs (30 s each) in search of a read on content: more time.
const BUDGET_S = SOAK ? 600 : args['fail-fast'] === 'content' ? 420 : 240;

// ---- the report, and what caught the first failure ----
const report = {
  mode: args.mode, unverified: UNVERIFIED, seed: Number(args.seed), binary: KVF, topologies: {}, tenants: {}, outcomes: {},
  errors_by_code: {}, faults: {}, mismatches: 0, foreign_canaries: 0, foreign_words_in_pages: 0, unclear_errors: 0,
  leaked_pages: 0, crashes: 0, counter_violations: 0, checks_failed: [], first_failure: null,
  first_content_failure: null,
};
// Failures on content: a completed response that read what was not written for it.
const CONTENT_KINDS = new Set(['mismatched response', 'foreign canary', 'foreign words in a page']);
const bump = (o, k, n = 1) => { o[k] = (o[k] ?? 0) + n; };
function fail(kind, detail) {
  const line = `${kind}: ${detail}`;
  if (report.checks_failed.length < 40) report.checks_failed.push(line);
  if (!report.first_failure) report.first_failure = { kind, detail: String(detail).slice(0, 600) };
  const content = CONTENT_KINDS.has(kind);
  if (content && !report.first_content_failure) report.first_content_failure = { kind, detail: String(detail).slice(0, 600) };
  console.log(`not ok - ${line.slice(0, 2000)}`);
  // --fail-fast 1: the first failure is the answer; stop everything. --fail-fast content (the
  // mutants' runs): stop at the first failure on content; after any other failure (a counter, a
  // leaked page, a hang) go on through the phases in search of one, so that the answer is the
  // stale or foreign read itself wherever a phase shows it.
  const ff = args['fail-fast'];
  if (ff === '1' || (ff === 'content' && (content || kind === 'harness' || kind === 'setup'))) setImmediate(finish);
}
const ok = (what) => console.log(`ok - ${what}`);

// ---- processes: every one tracked, killed on any exit ----
const children = new Set();
const killAll = () => { for (const p of children) { try { p.child.kill('SIGCONT'); p.child.kill('SIGKILL'); } catch { /* gone */ } } };
let finished = false;
function finish() {
  if (finished) return;
  finished = true;
  killAll();
  report.seconds = Math.round((Date.now() - T0) / 1000);
  printReport();
  if (args.report) fs.writeFileSync(args.report, JSON.stringify(report, null, 1));
  process.exit(report.first_failure ? 1 : 0);
}
process.on('exit', killAll);
process.on('uncaughtException', (e) => { fail('harness', e?.stack ?? e); finish(); });
process.on('unhandledRejection', (e) => { fail('harness', e?.stack ?? e); finish(); });
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => { fail('harness', `${s} received`); finish(); });
setTimeout(() => { fail('harness', `the suite ran past ${BUDGET_S} s`); finish(); }, BUDGET_S * 1000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const withTimeout = (p, ms, what) => Promise.race([p, sleep(ms).then(() => { throw new Error(`${what}: nothing in ${ms} ms`); })]);
const SANITIZER = /AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|Assertion .* failed|ALWAYS\(|page check failed/;

// A process of the topology. Its stderr (and stdout) are kept, also in WORK/<name>.log.
// Each process's test events (KVF_TEST_EVENTS: one JSON object per line, src/common/test_events.c)
// go to a file of its own: what the test switches did is counted from there, never from the log.
let procSeq = 0;
function startProc(name, argv, env = {}) {
  const events = path.join(W, `${name}.${++procSeq}.events`);
  const child = spawn(KVF, argv, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1:abort_on_error=0', KVF_POISON: '1', KVF_TEST_AUDIT_TAIL: '1', ...env, KVF_TEST_EVENTS: events },
  });
  const p = { name, argv, env, child, out: '', log: path.join(W, `${name}.log`), events, exited: null, expectKill: false };
  children.add(p);
  const logf = fs.createWriteStream(p.log, { flags: 'a' });
  logf.write(`# ${name}: kvfence ${argv.join(' ')} ${JSON.stringify(env)}\n`);
  const take = (d) => { p.out += d; logf.write(d); if (p.out.length > 4e6) p.out = p.out.slice(-2e6); };
  child.stdout.on('data', take);
  child.stderr.on('data', take);
  p.exitP = new Promise((r) => child.on('exit', (code, sig) => { p.exited = { code, sig }; children.delete(p); logf.end(); r(p.exited); }));
  return p;
}
async function waitOut(p, re, ms) {
  const until = Date.now() + ms;
  for (;;) {
    const m = p.out.match(re);
    if (m) return m;
    if (p.exited) throw new Error(`${p.name} exited (${JSON.stringify(p.exited)}) before saying ${re}: ${p.out.slice(-1500)}`);
    if (Date.now() > until) throw new Error(`${p.name} did not say ${re} in ${ms} ms: ${p.out.slice(-1500)}`);
    await sleep(20);
  }
}
// Stops p with SIGTERM (SIGKILL after the bound) and checks how it ended.
async function stopProc(p, { graceMs = 30000 } = {}) {
  if (!p.exited) {
    try { p.child.kill('SIGCONT'); p.child.kill('SIGTERM'); } catch { /* gone */ }
    const ex = await Promise.race([p.exitP, sleep(graceMs).then(() => null)]);
    if (!ex) {
      p.child.kill('SIGKILL');
      await p.exitP;
      fail('crash', `${p.name} did not exit within ${graceMs} ms of SIGTERM (killed); log ${p.log}`);
      report.crashes++;
      return;
    }
  }
  checkEnded(p);
}
function checkEnded(p) {
  const ex = p.exited;
  const killed = p.expectKill && ex.sig === 'SIGKILL';
  if (!killed && ex.code !== 0) {
    report.crashes++;
    fail('crash', `${p.name} ended with ${JSON.stringify(ex)}; log ${p.log}: ${p.out.slice(-1200)}`);
  }
  const m = p.out.match(SANITIZER);
  if (m) {
    report.crashes++;
    const at = p.out.indexOf(m[0]);
    fail('crash', `${p.name}: sanitizer or check report in its output; log ${p.log}: ${p.out.slice(Math.max(0, at - 200), at + 1500)}`);
  }
}

// ---- the seeded schedule ----
let rng = (Number(args.seed) * 2654435761) >>> 0 || 1;
const rand = () => { rng ^= rng << 13; rng >>>= 0; rng ^= rng >>> 17; rng ^= rng << 5; rng >>>= 0; return rng / 4294967296; };
const randInt = (a, b) => a + Math.floor(rand() * (b - a + 1));
const pick = (a) => a[Math.floor(rand() * a.length)];

// ---- tenants ----
const TENANTS = [
  { name: 'alpha', key: 'sk-iso-alpha-4c1e9a', canary: 'zebra' },
  { name: 'bravo', key: 'sk-iso-bravo-7d20f3', canary: 'apple' },
  { name: 'charlie', key: 'sk-iso-charlie-0b8e51', canary: 'tiger' },
  { name: 'delta', key: 'sk-iso-delta-93aa26', canary: 'falcon' },
];
const FILLER = ['the', 'red', 'cat', 'sun', 'tree', 'blue', 'dog'];
const KEYS = path.join(W, 'keys.txt');
fs.writeFileSync(KEYS, `# isolation suite tenants\n${TENANTS.map((t) => `${t.key} ${t.name}`).join('\n')}\n`, { mode: 0o600 });
for (const t of TENANTS) report.tenants[t.name] = { canary: t.canary, requests: 0, ok: 0 };

// ---- models and the solo reference (`kvfence run`) ----
const HIST = path.join(W, 'hist.gguf'), TINY = path.join(W, 'tiny.gguf');
execFileSync(KVF, ['mkmodel', HIST, '--shape', 'hist'], { stdio: 'ignore' });
execFileSync(KVF, ['mkmodel', TINY, '--shape', 'tiny', '--seed', '5'], { stdio: 'ignore' });
// The solo runs are child processes awaited, never run synchronously: a phase computes the
// references of the prompts it makes up as it goes, and a blocked event loop would hold its
// other requests' connections silent past the server's header bounds (a 2 s bound before a
// key is shown), which the server rightly closes.
const refCache = new Map();
const execFileP = promisify(execFile);
function reference(model, prompt, s) {
  const key = JSON.stringify([model, prompt, s]);
  if (!refCache.has(key)) refCache.set(key, referenceRun(model, prompt, s));
  return refCache.get(key);
}
async function referenceRun(model, prompt, s) {
  const { stdout: out } = await execFileP(KVF, ['run', '--model', model, '--prompt', prompt, '--max-tokens', String(s.max_tokens),
    '--temperature', String(s.temperature ?? 0), '--top-k', String(s.top_k ?? 0), '--top-p', String(s.top_p ?? 1),
    '--seed', String(s.seed ?? 1), '--threads', '1', '--print-token-ids', '--print-logprobs'],
  { encoding: 'utf8', maxBuffer: 1 << 24, env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=0' } });
  const lines = out.split('\n');
  const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
  const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
  const ref = { text: lines.slice(0, at).join('\n'), prompt_ids: nums(lines[at]), ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround) };
  ref.finish = ref.ids.length < s.max_tokens ? 'stop' : 'length';
  return ref;
}
// Each canary's token id, from the tokenizer itself ("▁word" is one token of hist).
for (const t of TENANTS) {
  const ids = (await reference(HIST, t.canary, { max_tokens: 1 })).prompt_ids;
  if (ids.length !== 2) { console.log(`Bail out! hist does not spell '${t.canary}' as one token: ${ids}`); process.exit(1); }
  t.canaryId = ids[1];
}
const wordRe = (w) => new RegExp(`(^|[^a-z])${w}([^a-z]|$)`);
// The foreign canaries in what tenant t was shown: words in text, ids among tokens.
function foreignIn(t, text, ids = []) {
  const found = [];
  for (const o of TENANTS) {
    if (o === t) continue;
    if (wordRe(o.canary).test(text ?? '') || ids.includes(o.canaryId)) found.push(o.canary);
  }
  return found;
}

// ---- the workload's cases ----
// hist: a tenant's prompt is its canary repeated (most of the words) with a few fillers; short
// prompts (within one page), medium and long ones (many pages, so a stale page weighs).
function histPrompt(t, words) {
  const w = [];
  for (let i = 0; i < words; i++) w.push(i % 4 === 3 ? pick(FILLER) : t.canary);
  return w.join(' ');
}
const GREEDY = (mt) => ({ max_tokens: mt, temperature: 0 });
// Seeded sampling on hist: top_k 3 keeps the draw among the visible words (and the digits that
// head the vocabulary on ties), so a reference never shows another tenant's canary.
const SEEDED_HIST = (mt, seed) => ({ max_tokens: mt, temperature: 0.8, top_k: 3, seed });
function histCases(t) {
  const cases = [];
  const lens = SOAK ? [3, 7, 15, 16, 17, 33, 60, 120, 200] : [3, 9, 17, 40, 120];
  for (const [i, n] of lens.entries()) {
    cases.push({ t, model: HIST, prompt: histPrompt(t, n), s: GREEDY(randInt(2, 12)) });
    if (i % 2 === 0) cases.push({ t, model: HIST, prompt: histPrompt(t, n), s: SEEDED_HIST(randInt(2, 12), randInt(1, 1e6)) });
  }
  // Long outputs: requests that keep running, and take pages for their output as they grow,
  // while other requests' late writes may still land.
  cases.push({ t, model: HIST, prompt: histPrompt(t, randInt(5, 12)), s: GREEDY(randInt(48, 96)) });
  cases.push({ t, model: HIST, prompt: histPrompt(t, randInt(20, 40)), s: SEEDED_HIST(randInt(48, 96), randInt(1, 1e6)) });
  return cases;
}
// The late-writes phase: prompts of two to four pages (a late write covers a whole page of
// them) and outputs long enough to be running when one lands.
const LATE_MS = Number(process.env.KVF_ISO_LATE_MS ?? 2500);
function lateCases(t) {
  const cases = [];
  // 28 and 60 words are 32 and 64 tokens: prompts that fill their last page (16 tokens).
  for (const n of [18, 28, 45, 60]) {
    cases.push({ t, model: HIST, prompt: histPrompt(t, n), s: GREEDY(randInt(40, 96)) });
    cases.push({ t, model: HIST, prompt: histPrompt(t, n + 3), s: SEEDED_HIST(randInt(40, 96), randInt(1, 1e6)) });
  }
  return cases;
}
function lateTinyCases(t) {
  const words = `${t.name} said that the river ran past the old mill and the boy ran after it`.split(' ');
  const cases = [];
  for (const n of [3, 6, 10, 16]) { // about 7 tokens a word: 2 to 8 pages
    const prompt = Array.from({ length: n }, (_, i) => words[i % words.length]).join(' ');
    cases.push({ t, model: TINY, prompt, s: GREEDY(randInt(40, 80)) });
    cases.push({ t, model: TINY, prompt, s: { max_tokens: randInt(40, 80), temperature: 0.9, top_p: 0.9, seed: randInt(1, 1e6) } });
  }
  return cases;
}
// Long prompts on hist: 64 to 200 words (tokens), mostly the tenant's canary, short outputs.
function longCases(t) {
  const cases = [];
  for (const n of [64, 100, 150, 200]) {
    cases.push({ t, model: HIST, prompt: histPrompt(t, n), s: GREEDY(randInt(4, 24)) });
    cases.push({ t, model: HIST, prompt: histPrompt(t, n + 5), s: SEEDED_HIST(randInt(4, 24), randInt(1, 1e6)) });
  }
  return cases;
}
const TINY_PROMPTS = ['Hello there', 'Once upon a time', 'x', 'The quick brown fox jumps over the lazy dog', '12 34 56',
  'A longer prompt with several words in it to fill more than one page of the pool'];
function tinyCases(t) {
  return TINY_PROMPTS.slice(0, SOAK ? 6 : 4).flatMap((p, i) => [
    { t, model: TINY, prompt: `${t.name} ${p}`, s: GREEDY(randInt(4, 16)) },
    ...(i % 2 ? [{ t, model: TINY, prompt: `${t.name} ${p}`, s: { max_tokens: randInt(4, 16), temperature: 0.9, top_p: 0.9, seed: randInt(1, 1e6) } }] : []),
  ]);
}

// ---- one request, and how it ended ----
const idOf = (s) => { const m = /^token_id:(\d+)$/.exec(s); return m ? Number(m[1]) : NaN; };
function clientFor(srv, t) {
  srv.clients ??= new Map();
  if (!srv.clients.has(t.name)) srv.clients.set(t.name, new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: t.key, maxRetries: 0, timeout: 120000 }));
  return srv.clients.get(t.name);
}
const ALLOWED_CLIENT_ERRORS = new Set(['queue_full', 'tenant_limit', 'pool_exhausted', 'prefill_stalled']);
// plan: { stream, abort: null | {ms} | {chunks}, expect: 'ok' | 'limit+1', label }
async function request(ph, c, plan) {
  const t = c.t;
  const ref = plan.expect === 'ok' ? await reference(c.model, c.prompt, c.s) : null;
  const body = { model: 'm', prompt: c.prompt, max_tokens: c.s.max_tokens, temperature: c.s.temperature ?? 0, logprobs: 0, return_tokens_as_token_ids: true };
  for (const k of ['top_k', 'top_p', 'seed']) if (c.s[k] !== undefined) body[k] = c.s[k];
  const ac = new AbortController();
  let aborted = false;
  const abort = () => { aborted = true; ac.abort(); };
  let timer = null;
  if (plan.abort?.ms !== undefined) timer = setTimeout(abort, plan.abort.ms);
  const got = { ids: [], lps: [], text: '', finish: null };
  report.tenants[t.name].requests++;
  let outcome;
  try {
    const client = clientFor(ph.srv, t);
    if (plan.stream) {
      const st = await client.completions.create({ ...body, stream: true }, { signal: ac.signal });
      let k = 0;
      for await (const ch of st) {
        const x = ch.choices?.[0];
        if (!x) continue;
        got.text += x.text ?? '';
        if (x.logprobs) { got.ids.push(...x.logprobs.tokens.map(idOf)); got.lps.push(...x.logprobs.token_logprobs.map(Math.fround)); }
        got.finish = x.finish_reason ?? got.finish;
        if (plan.abort?.chunks !== undefined && ++k >= plan.abort.chunks) abort();
      }
    } else {
      const r = await client.completions.create(body, { signal: ac.signal });
      const x = r.choices[0];
      got.ids = x.logprobs.tokens.map(idOf);
      got.lps = x.logprobs.token_logprobs.map(Math.fround);
      got.text = x.text;
      got.finish = x.finish_reason;
    }
    outcome = aborted ? 'cancelled' : 'ok';
  } catch (e) {
    if (aborted || e instanceof OpenAI.APIUserAbortError || e?.name === 'AbortError') outcome = 'cancelled';
    else if (e instanceof OpenAI.APIError && e.error && typeof e.error.message === 'string' && (e.status === undefined || e.status >= 400)) {
      outcome = 'error';
      got.err = { status: e.status ?? 'sse', code: e.code ?? e.error.code ?? e.error.type, message: e.error.message };
    } else {
      outcome = 'unclear';
      got.err = { what: String(e?.stack ?? e).slice(0, 400) + (e?.cause ? ` (cause: ${String(e.cause?.code ?? '')} ${String(e.cause?.message ?? e.cause).slice(0, 200)})` : '') };
    }
  } finally {
    clearTimeout(timer);
  }
  // The checks.
  const label = `${ph.name}: ${t.name} ${plan.label} ${plan.stream ? 'stream' : 'plain'} "${c.prompt.slice(0, 40)}…" ${JSON.stringify(c.s)}`;
  const foreign = foreignIn(t, `${got.text} ${got.err?.message ?? ''}`, got.ids);
  if (c.model === HIST && foreign.length) {
    report.foreign_canaries++;
    fail('foreign canary', `${label}: showed ${foreign.join(', ')} (${outcome}): "${got.text.slice(0, 120)}"`);
  }
  if (plan.expect === 'limit+1') {
    if (outcome === 'error' && got.err.status === 400 && got.err.code === 'context_length_exceeded') outcome = 'rejected_limit';
    else { report.unclear_errors++; fail('limit+1', `${label}: not a 400 context_length_exceeded: ${outcome} ${JSON.stringify(got.err ?? got.text.slice(0, 80))}`); }
  } else if (outcome === 'ok') {
    const same = JSON.stringify(got.ids) === JSON.stringify(ref.ids) && JSON.stringify(got.lps) === JSON.stringify(ref.lps) &&
      got.text === ref.text && got.finish === ref.finish;
    if (!same) {
      outcome = 'mismatch';
      report.mismatches++;
      // From the first token that differs (id or logprob), so the report shows the divergence.
      let k = 0;
      while (k < got.ids.length && k < ref.ids.length && got.ids[k] === ref.ids[k] && got.lps[k] === ref.lps[k]) k++;
      fail('mismatched response', `${label}: HTTP 200 differing from token ${k}: ids ${got.ids.slice(k, k + 8)} lps ${got.lps.slice(k, k + 3)} finish ${got.finish} "${got.text.slice(0, 60)}"; alone: ids ${ref.ids.slice(k, k + 8)} lps ${ref.lps.slice(k, k + 3)} finish ${ref.finish} "${ref.text.slice(0, 60)}"`);
    } else report.tenants[t.name].ok++;
  } else {
    // What was shown before the end must be the start of the right answer.
    const n = got.ids.length;
    if (JSON.stringify(got.ids) !== JSON.stringify(ref.ids.slice(0, n)) || JSON.stringify(got.lps) !== JSON.stringify(ref.lps.slice(0, n))) {
      report.mismatches++;
      fail('mismatched response', `${label}: ${outcome} after ${n} tokens that are not the start of the solo run: ${got.ids.slice(0, 12)} vs ${ref.ids.slice(0, 12)}`);
    }
    if (outcome === 'error') {
      bump(report.errors_by_code, `${got.err.status} ${got.err.code}`);
      // A long-prompt phase allows no stall at all: its prefills are slow but live.
      if (!ph.allowErrors && (!ALLOWED_CLIENT_ERRORS.has(got.err.code) || (ph.noStalls && got.err.code === 'prefill_stalled'))) {
        fail('unexpected error', `${label}: ${JSON.stringify(got.err)} in a phase without worker faults`);
      }
      if (got.err.status === 400) fail('unexpected error', `${label}: a valid request got 400: ${JSON.stringify(got.err)}`);
    }
    if (outcome === 'unclear') {
      report.unclear_errors++;
      fail('unclear error', `${label}: ${got.err.what}`);
    }
  }
  bump(report.outcomes, outcome);
  bump(ph.outcomes, outcome);
  // The floors count the requests that asked for a whole answer and stayed for it.
  if (plan.expect === 'ok' && !plan.abort) {
    const k = (ph.byTenant[t.name] ??= { asked: 0, ok: 0 });
    k.asked++;
    if (outcome === 'ok') k.ok++;
  }
  if (plan.mustOk && outcome !== 'ok') fail('no answer', `${label}: ${outcome} ${JSON.stringify(got.err ?? '')}: this request must be served, and right`);
  return outcome;
}

// ---- /health and quiescence ----
async function health(srv) {
  const r = await fetch(`${srv.url}/health`, { signal: AbortSignal.timeout(10000) });
  return r.json();
}
const st = (h, s) => h.decode?.by_state?.[s] ?? 0;
// Every pool all free, nothing reserved, held or quarantined, no request in flight.
async function quiesce(ph, ms) {
  const until = Date.now() + ms;
  let h;
  for (;;) {
    try { h = await health(ph.srv); } catch (e) { h = { error: String(e) }; }
    const idle = h.decode && h.decode.free === h.decode.pages && h.decode.reserved === 0 && h.in_flight === 0 &&
      h.running === 0 && h.queued === 0 && st(h, 'KVF_PAGE_HELD') === 0 && st(h, 'KVF_PAGE_QUARANTINED') === 0 &&
      (!h.prefill || !h.prefill.pages || h.prefill.free === h.prefill.pages) && h.prefill_up !== false &&
      (h.workers ?? []).every((w) => w.up);
    if (idle) return h;
    if (Date.now() > until) {
      const leaked = h.decode ? h.decode.pages - h.decode.free : -1;
      report.leaked_pages += Math.max(leaked, 0);
      fail('leaked pages', `${ph.name}: not back to all free ${ms} ms after the workload: ${JSON.stringify(h)}`);
      return h;
    }
    await sleep(200);
  }
}

// The counters against the faults this phase injected (f: the phase's fault counts).
function checkCounters(ph, h) {
  const c = { ...(h.counters ?? {}) };
  for (const [k, v] of Object.entries(ph.countersBefore ?? {})) c[k] = (c[k] ?? 0) + v;
  const f = ph.faults;
  const bad = (what) => { report.counter_violations++; fail('counters', `${ph.name}: ${what}; counters ${JSON.stringify(c)}, faults ${JSON.stringify(f)}`); };
  if ((c.foreign_tails ?? 0) !== 0) bad(`foreign_tails ${c.foreign_tails}: a prompt's last page carried bytes it did not write`);
  if ((c.bad_frames ?? 0) !== 0) bad(`bad_frames ${c.bad_frames} with no corrupt frame injected`);
  const forgedWrites = ph.forged?.writes ?? 0, forgedDones = ph.forged?.dones ?? 0, forgedShorts = ph.forged?.shorts ?? 0;
  // Every verify failure is a forged write's or a short handoff's; either goes unverified only
  // when its request ended first (a client disconnect, a timeout, or its connection fenced).
  const procFaults = f.prefill_kill || f.prefill_stop || f.decode_restart;
  const forgedVerify = forgedWrites + forgedShorts;
  if ((c.verify_failed ?? 0) > forgedVerify) bad(`verify_failed ${c.verify_failed} > the ${forgedWrites} forged writes and ${forgedShorts} short handoffs`);
  if (forgedWrites >= 2 && (c.verify_failed ?? 0) < 1) bad(`${forgedWrites} forged writes of stale bytes, and no verify failure`);
  // Of the short handoffs an honest-timed prefill made, one whose client stayed must fail the
  // count check; three make it all but certain that one did (a request may end first).
  const timelyShorts = ph.forged?.shorts_timely ?? 0;
  if (timelyShorts >= 3 && (c.verify_failed ?? 0) < 1) bad(`${timelyShorts} short handoffs (a DONE counting fewer tokens than the prompt) from timely prefills, and no verify failure`);
  // Each forged DONE is two stale messages, unless a fence dropped them with their connection.
  if (!procFaults && (c.stale_msgs ?? 0) < 2 * forgedDones) bad(`stale_msgs ${c.stale_msgs} < the ${2 * forgedDones} forged DONEs`);
  if (procFaults && forgedDones >= 2 && (c.stale_msgs ?? 0) < 1) bad(`stale_msgs ${c.stale_msgs} with ${forgedDones} forged DONE pairs`);
  const noisy = f.frame_dup || f.frame_drop || f.prefill_kill || f.prefill_stop || f.decode_restart || f.late_writer || forgedDones || ph.forged?.fenced;
  const cancels = Object.entries(ph.outcomes).filter(([k]) => k === 'cancelled').reduce((a, [, v]) => a + v, 0);
  if (!noisy && (c.stale_msgs ?? 0) > cancels) bad(`stale_msgs ${c.stale_msgs} with no duplicated, dropped or forged message and ${cancels} cancels`);
  const canFence = f.flush_never || f.frame_drop || f.prefill_kill || f.prefill_stop || f.decode_restart || f.late_writer;
  if (!canFence && ((c.quarantines ?? 0) !== 0 || (c.fences ?? 0) !== 0)) bad('a quarantine or fence with no fault that can cause one');
  if (f.flush_never && (c.quarantines ?? 0) < 1) bad('a flush that never completed, and no quarantine');
  if (f.flush_never && (c.fences ?? 0) < 1) bad('a flush that never completed, and no fence');
  // A writer slower than the grant and hold timeouts: its pages wait in quarantine for the fence.
  if (f.late_writer && (c.quarantines ?? 0) < 1) bad('a writer past the grant and hold timeouts, and no quarantine');
  if (f.late_writer && (c.fences ?? 0) < 1) bad('a writer past the grant and hold timeouts, and no fence');
  if (!report.first_failure) ok(`${ph.name}: counters ${JSON.stringify(c)} agree with the faults ${JSON.stringify(f)}`);
}

// ---- topologies ----
const CTX = 256;             // the served limit
const HIST_PAGE = 65600, TINY_PAGE = 8256;
const poolBytes = (model, pages) => String((model === HIST ? HIST_PAGE : TINY_PAGE) * pages);
const commonFlags = ['--context-length', String(CTX), '--api-keys', KEYS,
  ...(CANARY_S ? ['--canary-interval', String(CANARY_S)] : [])];

const TOPOLOGIES = {
  serve: {
    caps: new Set(),
    async start(ph) {
      const timeouts = ['--grant-timeout', String(ph.grantMs ?? 3000), '--hold-timeout', String(ph.holdTimeoutMs ?? 4000)];
      const p = startProc(`${ph.name}-serve`, ['serve', '--model', ph.model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
        '--kv-memory', poolBytes(ph.model, ph.pages), ...commonFlags, '--max-queue', String(ph.maxQueue), '--admit-timeout', String(ph.admitMs),
        ...timeouts, ...(ph.prefillFlags ?? [])], ph.env);
      const m = await waitOut(p, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 120000);
      return { url: `http://127.0.0.1:${m[1]}`, procs: [p], all: [p], prefills: [] };
    },
  },
  split: {
    caps: new Set(['prefill_kill', 'prefill_stop', 'decode_restart']),
    async start(ph) {
      // Short protocol timeouts, so a stopped prefill is fenced within the phase.
      const timeouts = ['--grant-timeout', String(ph.grantMs ?? 3000), '--hold-timeout', String(ph.holdTimeoutMs ?? 4000)];
      ph.holdMs = (ph.grantMs ?? 3000) + (ph.holdTimeoutMs ?? 4000);
      const envOf = (role, i) => ({ ...ph.env, ...(ph.envOf?.(role, i) ?? {}) });
      // Each worker first listens on a port the kernel picks (port 0: no window in which
      // another process takes a port found free), and a restart listens on the same one.
      const ports = [0, 0, 0];
      const prefillArgs = (i) => ['prefill', '--model', ph.model, '--listen', `127.0.0.1:${ports[i]}`, '--context-length', String(CTX), '--threads', '1',
        ...(ph.prefillFlags ?? [])];
      const decodeArgs = () => ['decode', '--model', ph.model, '--listen', `127.0.0.1:${ports[2]}`, '--context-length', String(CTX),
        '--kv-memory', poolBytes(ph.model, ph.pages), '--threads', '1', '--max-queue', String(ph.maxQueue),
        '--admit-timeout', String(ph.admitMs), ...timeouts];
      const topo = { procs: [], all: [], prefills: [], ports }; // procs: live; all: every one started
      topo.startPrefill = async (i, tag = '') => {
        const p = startProc(`${ph.name}-prefill${i}${tag}`, prefillArgs(i), envOf('prefill', i));
        const m = await waitOut(p, /listening \S+ (\d+)/, 120000);
        ports[i] = Number(m[1]);
        topo.prefills[i] = p;
        topo.procs.push(p);
        topo.all.push(p);
        return p;
      };
      topo.startDecode = async (tag = '') => {
        const p = startProc(`${ph.name}-decode${tag}`, decodeArgs(), envOf('decode', 0));
        const m = await waitOut(p, /listening \S+ (\d+)/, 120000);
        ports[2] = Number(m[1]);
        topo.decode = p;
        topo.procs.push(p);
        topo.all.push(p);
        return p;
      };
      await topo.startPrefill(0);
      await topo.startPrefill(1);
      await topo.startDecode();
      const r = startProc(`${ph.name}-router`, ['router', '--model', ph.model, '--host', '127.0.0.1', '--port', '0',
        '--prefill', `127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}`, '--decode', `127.0.0.1:${ports[2]}`, ...commonFlags,
        '--max-queue', String(ph.maxQueue), '--admit-timeout', '5000'], {});
      topo.procs.push(r);
      topo.all.push(r);
      const m = await waitOut(r, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 120000);
      topo.url = `http://127.0.0.1:${m[1]}`;
      // Ready once it has heard from the decode worker (a /health before that finds no worker
      // table yet).
      await waitOut(r, /decode worker \S+ is up/, 60000);
      return topo;
    },
  },
};

// ---- a phase: one topology, one model, one fault set, one workload ----
async function runPhase(ph) {
  ph.outcomes = {};
  ph.faults = {};
  ph.byTenant = {};
  if (UNVERIFIED && ph.forge) {
    // Forged writes and DONEs, and short handoffs, are refused by the checks this run switches
    // off: they would show those checks missing, not a lifetime rule broken. Refusals stay.
    const kept = ph.forge.split(',').filter((k) => /^(refuse|fenced|token)=/.test(k));
    ph.forge = kept.length ? ['every=0', ...kept].join(',') : undefined;
  }
  ph.env = {
    ...(ph.kvfFaults ? { KVF_FAULTS: ph.kvfFaults } : {}), ...(ph.forge ? { KVF_TEST_FORGE: ph.forge } : {}),
    ...(UNVERIFIED ? { KVF_TEST_UNVERIFIED: '1' } : {}), ...(ph.extraEnv ?? {}),
  };
  const t0 = Date.now();
  console.log(`# phase ${ph.name}: ${ph.topology}, ${path.basename(ph.model)}, pool ${ph.pages} pages, KVF_FAULTS=${ph.kvfFaults ?? ''} KVF_TEST_FORGE=${ph.forge ?? ''}`);
  for (const k of (ph.kvfFaults ?? '').split(',').filter(Boolean)) {
    const [n, v] = k.split('=');
    if (n !== 'seed' && Number(v)) { ph.faults[n] = Number(v); bump(report.faults, `KVF_FAULTS ${n}=${v}`); }
  }
  const topo = await TOPOLOGIES[ph.topology].start(ph);
  ph.srv = { url: topo.url };
  ph.topo = topo;
  try {
    const h0 = await health(ph.srv);
    if (h0.served_limit !== CTX) fail('setup', `${ph.name}: served limit ${h0.served_limit}, not ${CTX}`);
    await ph.workload(ph);
    const h = await quiesce(ph, ph.quiesceMs ?? 60000);
    checkAudit(ph, topo);
    if (CANARY_S) {
      const c = h.canary;
      report.canary ??= { runs: 0, failures: 0, errors: 0 };
      if (!c) fail('canary', `${ph.name}: --canary-interval ${CANARY_S} and no canary in /health`);
      else {
        for (const k of ['runs', 'failures', 'errors']) report.canary[k] += c[k];
        console.log(`# ${ph.name}: canary ${c.status}: ${c.runs} runs, ${c.failures} failures, ${c.errors} errors, ${c.references} references`);
        if (c.failures) fail('canary', `${ph.name}: ${c.failures} canary runs differed from the reference: ${h.reason ?? ''}`);
      }
    }
    if (h.decode) {
      ph.forged = countForged(topo);
      // The channel binds: every prefill started with the forgeries on said so in its events.
      if (ph.forge) {
        for (const p of topo.all.filter((x) => x.env?.KVF_TEST_FORGE && ['prefill', 'serve'].includes(x.argv[0]))) {
          if (!eventsOf(p, 'forge_on').length) fail('test events', `${ph.name}: ${p.name} ran with KVF_TEST_FORGE=${p.env.KVF_TEST_FORGE} and no forge_on event in ${p.events}`);
        }
      }
      checkCounters(ph, h);
      ok(`${ph.name}: pools back to all free (${h.decode.pages} decode pages, ${h.prefill?.pages ?? '-'} prefill), nothing held or quarantined`);
    }
    // The next request of every tenant is served, and right (where the phase's faults are over:
    // a late writer still serving may fail it; its floor then holds the phase).
    for (const t of TENANTS) await request(ph, ph.cases.find((c) => c.t === t), { stream: false, expect: 'ok', label: 'after', mustOk: !ph.allowErrors });
    checkFloors(ph);
  } catch (e) {
    fail('harness', `${ph.name}: ${e?.stack ?? e}`);
  } finally {
    for (const p of [...topo.procs].reverse()) await stopProc(p);
  }
  report.topologies[ph.topology] ??= { phases: [] };
  report.topologies[ph.topology].phases.push({ name: ph.name, model: path.basename(ph.model), seconds: Math.round((Date.now() - t0) / 1000), outcomes: ph.outcomes, faults: ph.faults, forged: ph.forged, by_tenant: ph.byTenant, floor: floorOf(ph) });
  console.log(`# phase ${ph.name}: ${Math.round((Date.now() - t0) / 1000)} s, outcomes ${JSON.stringify(ph.outcomes)}`);
}
// The floor of a phase: the share of each tenant's requests (those that asked for a whole answer
// and did not disconnect) that must complete equal to their solo run. Set from what the clean
// binary achieves on two cores with margin (docs/ISOLATION.md, "Floors"); a phase states its own
// where faults or a burst past the pool make errors part of the design. Any phase with a floor
// fails a server that answers every request with an error.
const floorOf = (ph) => ph.floor ?? 0.9;
function checkFloors(ph) {
  const floor = floorOf(ph);
  const parts = [];
  for (const t of TENANTS) {
    const k = ph.byTenant[t.name] ?? { asked: 0, ok: 0 };
    const need = Math.max(1, Math.ceil(floor * k.asked));
    parts.push(`${t.name} ${k.ok}/${k.asked} (floor ${need})`);
    if (k.ok < need) fail('below the floor', `${ph.name}: tenant ${t.name}: ${k.ok} of ${k.asked} requests served equal to their solo run, below the floor of ${need} (${floor} of them)`);
  }
  console.log(`# ${ph.name}: served right per tenant: ${parts.join(', ')}`);
}
// What decode's test audit (KVF_TEST_AUDIT_TAIL, every process) found in the slots a committed
// prompt did not write on its last page: those must be zero, bytes of no request. With the hist
// model a value there is a word (word j's value sits at coordinate 256 + j of a V row, and word j
// is token 259 + j: docs/TEST_MODELS.md), so the suite reads the words of another request's bytes
// that travelled with the prompt — a read on content. With the random-weight model the values
// name nothing: stale bytes, reported as such.
function checkAudit(ph, topo) {
  const coords = [];
  for (const p of topo.all) for (const e of eventsOf(p, 'audit_tail')) coords.push(...e.coords);
  if (!coords.length) return;
  if (ph.model !== HIST) {
    fail('stale bytes in a page', `${ph.name}: ${coords.length} unwritten slots of committed prompts' last pages hold values (decode's test audit)`);
    return;
  }
  const words = new Map();
  for (const c of coords) {
    const id = c - 256 + 259;
    const t = TENANTS.find((x) => x.canaryId === id);
    const w = c >= 256 ? (t ? `'${t.canary}' (tenant ${t.name}'s canary)` : `token ${id}`) : `coordinate ${c}`;
    words.set(w, (words.get(w) ?? 0) + 1);
  }
  report.foreign_words_in_pages += coords.length;
  fail('foreign words in a page', `${ph.name}: ${coords.length} unwritten slots of committed prompts' last pages hold another request's words: ${[...words].map(([w, n]) => `${w} ×${n}`).join(', ')} (decode's test audit)`);
}

// A process's test events of one kind (its KVF_TEST_EVENTS file; a line that is not a whole JSON
// object fails the run: the channel's schema is the suite's own).
function eventsOf(p, kind) {
  let text = '';
  try { text = fs.readFileSync(p.events, 'utf8'); } catch (e) { if (e.code !== 'ENOENT') throw e; }
  const out = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    let e;
    try { e = JSON.parse(line); } catch { fail('test events', `${p.name}: not a JSON object: ${line.slice(0, 200)}`); continue; }
    if (e.event === kind) out.push(e);
  }
  return out;
}
// The forgeries the prefill hook made, from the prefills' test events.
function countForged(topo) {
  const sum = (kind, ps = topo.all) => ps.reduce((a, p) => a + eventsOf(p, kind).length, 0);
  const writes = sum('forge_write'), dones = sum('forge_done'), fenced = sum('forge_fenced_done');
  const refused = sum('forge_refused');
  const shortsOf = (p) => eventsOf(p, 'forge_short').length;
  const shorts = topo.all.reduce((a, p) => a + shortsOf(p), 0);
  // The late writer's DONEs arrive after its grants ended (stale, never verified): only the
  // other prefills' short handoffs can reach decode's count check.
  const lateWriter = (p) => new RegExp(`put_delay_ms=${LATE_MS}\\b`).test(p.env?.KVF_FAULTS ?? '');
  const shortsTimely = topo.all.filter((p) => !lateWriter(p)).reduce((a, p) => a + shortsOf(p), 0);
  if (refused) bump(report.faults, 'granted prompt refused by the prefill engine (H6)', refused);
  if (shorts) bump(report.faults, 'prompt handed off short: page 0 put, DONE counting its tokens (H6)', shorts);
  if (writes) bump(report.faults, 'forged stale write (H18)', writes);
  if (dones) bump(report.faults, 'forged DONEs, stale epoch + unknown nonce (H18)', dones);
  if (fenced) bump(report.faults, 'forged DONEs of a fenced epoch, replayed on the next connection (H18)', fenced);
  return { writes, dones, refused, shorts, shorts_timely: shortsTimely, fenced };
}

// ---- workloads ----
// n requests through `conc` workers; each request drawn from the cases with a stream, a
// sampling and sometimes a disconnect plan. Returns when all ended.
async function traffic(ph, n, conc, { cancels = true, onTick } = {}) {
  let next = 0;
  const one = async () => {
    while (next < n) {
      const i = next++;
      if (onTick) await onTick(i);
      const c = pick(ph.cases);
      const plan = { stream: rand() < 0.5, expect: 'ok', label: 'traffic' };
      const r = cancels ? rand() : 1;
      if (r < 0.06) { plan.abort = { ms: randInt(0, 40) }; plan.label = 'cancel early (queued or during prefill)'; bump(report.faults, 'disconnect: early (queued / prefill)'); }
      else if (r < 0.12 && plan.stream) { plan.abort = { chunks: randInt(1, 3) }; plan.label = 'cancel mid-stream'; bump(report.faults, 'disconnect: mid-stream'); }
      else if (r < 0.16 && !plan.stream) { plan.abort = { ms: randInt(40, 400) }; plan.label = 'cancel in progress'; bump(report.faults, 'disconnect: non-streaming in progress'); }
      await request(ph, c, plan);
    }
  };
  await Promise.all(Array.from({ length: conc }, one));
}
// The limit (prompt + max_tokens = CTX) and one past it, per tenant on hist.
async function limits(ph) {
  const jobs = [];
  for (const t of TENANTS) {
    const mt = 6;
    const words = CTX - mt - 1; // + BOS = CTX - mt prompt tokens
    const at = { t, model: ph.model, prompt: histPrompt(t, words), s: GREEDY(mt) };
    const past = { t, model: ph.model, prompt: histPrompt(t, words + 1), s: GREEDY(mt) };
    if ((await reference(ph.model, at.prompt, { max_tokens: 1 })).prompt_ids.length + mt !== CTX) fail('setup', 'the limit prompt is not at the limit');
    ph.cases.push(at);
    jobs.push(request(ph, at, { stream: rand() < 0.5, expect: 'ok', label: 'at the limit' }));
    jobs.push(request(ph, past, { stream: false, expect: 'limit+1', label: 'limit + 1' }));
    bump(report.faults, 'prompt at the served limit');
    bump(report.faults, 'prompt at limit + 1');
  }
  await Promise.all(jobs);
}
// More than the pool holds at once: long requests from every tenant, some of which wait past the
// admission bound (503) or find the queue full (429); a few queued ones are disconnected.
async function exhaust(ph, n) {
  bump(report.faults, 'pool exhaustion burst');
  // Each reserves the whole limit: 16 of the pool's 40 pages.
  const big = TENANTS.map((t) => ({ t, model: ph.model, prompt: histPrompt(t, 100), s: GREEDY(CTX - 101) }));
  const jobs = [];
  for (let i = 0; i < n; i++) {
    const c = pick(big);
    const plan = { stream: i % 2 === 0, expect: 'ok', label: 'burst' };
    if (i % 5 === 4) { plan.abort = { ms: randInt(50, 250) }; plan.label = 'burst, cancelled while queued'; bump(report.faults, 'disconnect: queued (burst)'); }
    jobs.push(request(ph, c, plan));
  }
  await Promise.all(jobs);
}

function histPhase(name, topology, extra) {
  const cases = TENANTS.flatMap(histCases);
  return { name, topology, model: HIST, pages: 40, maxQueue: 24, admitMs: 1500, cases, ...extra };
}

// The phases of a mode.
const phases = [];
// The topologies are chosen by --topologies alone (default both), never by what the binary's
// help says: a binary that cannot run one fails that phase.
const wanted = args.topologies.split(',');
for (const w of wanted) if (!TOPOLOGIES[w]) { console.log(`Bail out! --topologies: unknown topology '${w}' (serve, split)`); process.exit(1); }
for (const topo of ['serve', 'split']) {
  if (!wanted.includes(topo)) continue;
  const seed = randInt(1, 1e6);
  // hist under transport chaos: delays, duplicated frames, the first flush never completing
  // (H17), forged DONEs and stale writes (H18), disconnects, the limit, exhaustion.
  phases.push(histPhase(`${topo}-hist-chaos`, topo, {
    // Puts 40 ms late: a write posted before a cancel lands after other requests took pages.
    // The flush that never completes costs the grant and hold timeouts (3 s and 4 s here).
    kvfFaults: `put_delay_ms=40,frame_delay_ms=1,frame_dup_pct=${SOAK ? 10 : 5},flush_never=1,seed=${seed}`,
    forge: `every=${SOAK ? 7 : 9},token=${TENANTS[0].canaryId},fenced=1`,
    // Floor: the faults, the burst past the pool and (split) the killed and stopped prefills fail
    // some requests by design; the clean binary serves 77–93% of each tenant's right.
    allowErrors: true, floor: 0.5, quiesceMs: 70000,
    async workload(ph) {
      // The first request meets the flush that never completes: an error within the grant
      // timeout, never a response.
      const victim = request(ph, ph.cases[0], { stream: false, expect: 'ok', label: ph.faults.flush_never ? 'H17 victim' : 'first' });
      if (ph.faults.flush_never) bump(report.faults, 'flush never completes (H17)');
      await sleep(300);
      await limits(ph);
      await traffic(ph, SOAK ? 240 : 60, 5);
      await exhaust(ph, SOAK ? 30 : 14);
      if (ph.topo.decode) await splitChaos(ph);
      await traffic(ph, SOAK ? 120 : 30, 4);
      await victim;
    },
  }));
  if (SOAK && topo === 'split') {
    phases.push(histPhase(`${topo}-hist-drops`, topo, {
      kvfFaults: `frame_drop_pct=3,frame_dup_pct=3,seed=${seed + 1}`, allowErrors: true, floor: 0.3, quiesceMs: 90000,
      async workload(ph) { await traffic(ph, 120, 5); },
    }));
  }
  // Split only: a prefill whose writes land 1.5 s after they are posted, past the grant and hold
  // timeouts (500 ms each), beside an honest one, with a decode whose steps take 15 ms more (so
  // that requests keep running while late writes land) and whose pool is small, reused at once
  // and not poisoned (stale pages keep their earlier tenant's K/V, as in production; the
  // prefills' pools too, so that bytes which travel from an earlier prompt are words). Every
  // request granted to the late prefill fails; its pages must wait for a proof or the fence, or
  // the late bytes land under a request of another tenant that is running on them (the H1/H2
  // leaks: freeing at a cancel or a timeout, acknowledging before the writes drained, a fence
  // that leaves the endpoint open). Both prefills' engines also refuse every 5th prompt of two
  // pages or more, and hand every 3rd that fills its last page off short (page 0 put, the DONE counting its tokens) (H6):
  // the request must fail, never run on the pages nobody wrote.
  // Then the same with the random-weight model, whose logprobs never saturate: a late page
  // under a running request changes its next logprob whatever the request's age (on hist a
  // foreign page shows only where it outweighs what the request has read of its own).
  if (topo === 'split') {
    const late = (model, cases, pages, n) => ({
      name: `${topo}-late-writes${model === TINY ? '-tiny' : ''}`, topology: topo, model, pages, maxQueue: 24, admitMs: 1500,
      cases, grantMs: 500, holdTimeoutMs: 500, forge: `every=0,refuse=5,short=2,fenced=1,token=${TENANTS[0].canaryId}`,
      envOf: (role, i) => (role === 'prefill' ? { KVF_POISON: '0', ...(i === 0 ? { KVF_FAULTS: `put_delay_ms=${LATE_MS},seed=${seed + 3}` } : {}) }
        : role === 'decode' ? { KVF_TEST_STEP_MS: '15', KVF_POISON: '0' } : {}),
      // Floor: the late writer's requests fail by design (about 2 of 3 on two cores).
      allowErrors: true, floor: 0.1, quiesceMs: 60000,
      async workload(ph) {
        ph.faults.late_writer = 1;
        bump(report.faults, `a prefill whose writes land ${LATE_MS} ms late (grant and hold timeouts 500 ms)`);
        await traffic(ph, n, 6);
      },
    });
    phases.push(late(HIST, TENANTS.flatMap(lateCases), 24, SOAK ? 160 : 48));
    phases.push(late(TINY, TENANTS.flatMap(lateTinyCases), 24, SOAK ? 120 : 40));
  }
  // Long prompts: prompts of 4 to 13 chunks (--prefill-chunk 16, 64 to 200 tokens), each chunk
  // taking 80 ms longer than its compute (KVF_TEST_CHUNK_MS: a slow but live prefill), six at a
  // time, so the prompts' chunks interleave and a prompt's grant lasts longer than the 3 s
  // no-progress bound (six prompts' chunks, about 0.6 s, pass between two of a prompt's own: 5×
  // margin, so two cores' load does not stall a live prefill; progress_ignored fails prompts of
  // 5 chunks and more). Every prompt must be served right — none fails for want of progress while
  // its prefill advances — with disconnects between chunks (queued, mid-prefill, mid-stream) and
  // the canary tenants' content checks.
  phases.push({
    name: `${topo}-long-prompts`, topology: topo, model: HIST, pages: 40, maxQueue: 24, admitMs: 20000,
    cases: TENANTS.flatMap(longCases), grantMs: 3000, prefillFlags: ['--prefill-chunk', '16'],
    extraEnv: { KVF_TEST_CHUNK_MS: '80' }, allowErrors: false, noStalls: true, quiesceMs: 30000,
    async workload(ph) {
      bump(report.faults, 'long prompts: 4..13 chunks, chunks 80 ms slow, bound 3 s');
      await traffic(ph, SOAK ? 120 : 36, 6);
    },
  });
  // A random-weight model: bit-exact tokens and logprobs, cancels and exhaustion, no worker fault.
  phases.push({
    name: `${topo}-tiny-exact`, topology: topo, model: TINY, pages: 48, maxQueue: 24, admitMs: 1500,
    cases: TENANTS.flatMap(tinyCases), kvfFaults: `put_delay_ms=1,seed=${seed + 2}`, allowErrors: false, quiesceMs: 30000,
    async workload(ph) { await traffic(ph, SOAK ? 200 : 50, 6); },
  });
}

// Split only: prefill SIGKILLed mid-transfer and restarted, SIGSTOPped past the hold timeout and
// SIGCONTed, decode restarted; traffic keeps flowing throughout, and for a while after the
// stopped prefill resumes (its queued writes must land nowhere).
async function splitChaos(ph) {
  const topo = ph.topo;
  const bg = background(ph, 3);
  await sleep(600);
  // SIGKILL prefill 0 while it writes, then a new one on the same address.
  const p0 = topo.prefills[0];
  p0.expectKill = true;
  p0.child.kill('SIGKILL');
  bump(report.faults, 'prefill SIGKILLed mid-transfer');
  ph.faults.prefill_kill = (ph.faults.prefill_kill ?? 0) + 1;
  await p0.exitP;
  checkEnded(p0);
  topo.procs.splice(topo.procs.indexOf(p0), 1);
  await sleep(500);
  await topo.startPrefill(0, '-restarted');
  bump(report.faults, 'prefill restarted');
  await sleep(1000);
  // A short stop of prefill 1 (within the grant timeout): clients give up on requests meanwhile,
  // some of them granted to the stopped prefill, whose writes land once it resumes; their pages
  // must stay held until it drains, while the other requests run on.
  const p1 = topo.prefills[1];
  p1.child.kill('SIGSTOP');
  bump(report.faults, 'prefill SIGSTOPped 2.5 s with requests disconnected meanwhile, then SIGCONTed');
  ph.faults.prefill_stop = (ph.faults.prefill_stop ?? 0) + 1;
  const gaveUp = [];
  for (let i = 0; i < 8; i++) {
    gaveUp.push(request(ph, pick(ph.cases), { stream: i % 2 === 0, expect: 'ok', label: 'disconnected while its prefill is stopped', abort: { ms: randInt(300, 2000) } }));
    bump(report.faults, 'disconnect: while its prefill is stopped');
    await sleep(60);
  }
  await sleep(2500);
  p1.child.kill('SIGCONT');
  await Promise.all(gaveUp);
  await sleep(1500);
  // SIGSTOP prefill 1 with writes in flight, past the hold timeout, then SIGCONT.
  p1.child.kill('SIGSTOP');
  bump(report.faults, 'prefill SIGSTOPped past the hold timeout, then SIGCONTed');
  ph.faults.prefill_stop = (ph.faults.prefill_stop ?? 0) + 1;
  await sleep(ph.holdMs + 2000);
  p1.child.kill('SIGCONT');
  await sleep(4000);
  // Restart decode: its requests fail with an error, the router reconnects.
  const d = topo.decode;
  // The counters die with the process: keep what it counted.
  const before = (await health(ph.srv)).counters ?? {};
  await stopProc(d);
  ph.countersBefore = before;
  topo.procs.splice(topo.procs.indexOf(d), 1);
  await topo.startDecode('-restarted');
  bump(report.faults, 'decode restarted');
  ph.faults.decode_restart = 1;
  await sleep(1500);
  await bg.stop();
}
// conc clients sending requests (as traffic does, a pause between) until stop() is awaited.
function background(ph, conc) {
  let stopped = false;
  const one = async () => {
    while (!stopped) {
      await traffic(ph, 1, 1);
      await sleep(randInt(20, 200));
    }
  };
  const all = Promise.all(Array.from({ length: conc }, one));
  return { stop: () => { stopped = true; return all; } };
}

// The late-writes phase first: it is the one built to show the H1/H2 bugs on content, so a run
// that stops at its first failure (--fail-fast, the mutants' runs) names the leak itself rather
// than a counter another phase checks.
phases.sort((a, b) => Number(b.name.includes('late-writes')) - Number(a.name.includes('late-writes')));
// --phases a,b: only the phases whose names contain one of these (a narrower run, e.g. for a
// mutant whose bug one phase is built to show).
if (args.phases) {
  const want = args.phases.split(',');
  for (let i = phases.length - 1; i >= 0; i--) if (!want.some((w) => phases[i].name.includes(w))) phases.splice(i, 1);
}
// Sanity of the design: no reference shows another tenant's canary (else the canary check could
// not tell a leak from the sampling).
{ // two solo runs at a time (the machine's cores), then the checks in order
  const all = phases.flatMap((ph) => ph.cases);
  let next = 0;
  const worker = async () => { while (next < all.length) { const c = all[next++]; await reference(c.model, c.prompt, c.s); } };
  await Promise.all([worker(), worker()]);
}
for (const ph of phases) {
  for (const c of ph.cases) {
    const ref = await reference(c.model, c.prompt, c.s);
    if (c.model === HIST && foreignIn(c.t, ref.text, ref.ids).length) { console.log(`Bail out! the solo run of a ${c.t.name} case shows a foreign canary: ${JSON.stringify(c.s)} "${ref.text}"`); process.exit(1); }
    if (c.model === HIST && !ref.ids.includes(c.t.canaryId)) { console.log(`Bail out! the solo run of a ${c.t.name} case does not answer its canary: "${ref.text}"`); process.exit(1); }
  }
}
console.log(`# ${phases.length} phases, ${refCache.size} solo references (kvfence run) in ${((Date.now() - T0) / 1000).toFixed(1)} s`);

function printReport() {
  const r = report;
  console.log('# ---- isolation report ----');
  console.log(`# mode ${r.mode}${r.unverified ? " (unverified: decode commits pages unread)" : ""}, seed ${r.seed}, ${r.seconds ?? '?'} s, binary ${r.binary}`);
  for (const [k, v] of Object.entries(r.topologies)) console.log(`# topology ${k}: ${v.phases.map((p) => `${p.name} (${p.seconds} s)`).join(', ')}`);
  console.log(`# requests by outcome: ${Object.entries(r.outcomes).map(([k, v]) => `${k} ${v}`).join(', ')} (total ${Object.values(r.outcomes).reduce((a, b) => a + b, 0)})`);
  console.log(`# errors by status and code: ${Object.entries(r.errors_by_code).map(([k, v]) => `${k}: ${v}`).join(', ') || 'none'}`);
  console.log(`# tenants: ${Object.entries(r.tenants).map(([k, v]) => `${k} (canary '${v.canary}') ${v.requests} requests, ${v.ok} equal to the solo run`).join('; ')}`);
  console.log(`# faults: ${Object.entries(r.faults).map(([k, v]) => `${k} ×${v}`).join('; ')}`);
  console.log(`# mismatches = ${r.mismatches}, foreign canaries = ${r.foreign_canaries}, other requests' words in pages = ${r.foreign_words_in_pages}, leaked pages = ${r.leaked_pages}, unclear errors = ${r.unclear_errors}, crashes = ${r.crashes}, counter violations = ${r.counter_violations}`);
  if (r.first_content_failure && (r.first_content_failure.kind !== r.first_failure?.kind || r.first_content_failure.detail !== r.first_failure?.detail)) console.log(`# first on content: ${r.first_content_failure.kind}: ${r.first_content_failure.detail.slice(0, 300)}`);
  console.log(r.first_failure ? `# FAILED; first: ${r.first_failure.kind}: ${r.first_failure.detail.slice(0, 300)}` : '# PASSED');
}

for (const ph of phases) await runPhase(ph);
finish();
