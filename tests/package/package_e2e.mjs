// The installable kvfence: builds the Debian package from this tree (packaging/mkdeb.sh, with
// the tree's install rules), checks what it holds, installs it into a scratch root (dpkg -x) and
// runs the installed binary the way its systemd units would.
//
//   node package_e2e.mjs --build BUILD_DIR --src SOURCE_DIR --work DIR
//
// Checked:
//   - the package's files, modes and owners; its control fields (Depends naming the libraries
//     the binary loads) and its conffile;
//   - the manual page: generated from the binary's help (every command a section, every
//     KVFENCE_* variable listed), and clean under `groff -man -ww` where groff is present;
//   - each unit: the sandbox (DynamicUser, ProtectSystem=strict, NoNewPrivileges, a
//     StateDirectory, ...), the environment file, the ExecStart of its role; then
//     `systemd-analyze verify` (nothing printed) and `systemd-analyze security --offline` (the
//     exposure level at most 2.5) against the scratch root, where systemd-analyze can run — where
//     it cannot, the test says so and the content checks stand alone;
//   - `serve` and the split roles (router + prefill@PORT + decode@PORT) started with the units'
//     own command lines and environment: Environment= lines, the environment file with this
//     test's values written into it (model, ports, threads, pool), the specifiers (%i, %S, %d)
//     and ${VAR} expanded as systemd does, the cluster key handed over as the credential the
//     units load, and nothing else of this process's environment. One completion through each
//     equals the installed binary's `kvfence run`, token for token and logprob for logprob;
//   - with KVFENCE_ADMIN_LISTEN in the environment file, serve and router answer /metrics on
//     the operator address alone and a plain /health on the public port;
//   - every process started is stopped with SIGTERM and exits 0 (killed on any failure).
// Prints TAP; exits 1 on any failure.
import { spawn, execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import zlib from 'node:zlib';
import assert from 'node:assert/strict';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ['build', 'src', 'work']) {
  if (!args[k]) { console.log(`Bail out! --${k} is required`); process.exit(1); }
}
const W = path.resolve(args.work);
fs.rmSync(W, { recursive: true, force: true });
fs.mkdirSync(W, { recursive: true });

// ---- processes: each tracked and killed on any exit ----
const children = new Set();
const killAll = () => { for (const c of children) { try { c.kill('SIGKILL'); } catch { /* gone */ } } };
process.on('exit', killAll);
process.on('uncaughtException', (e) => { console.log(`Bail out! ${e.stack}`); killAll(); process.exit(1); });
process.on('unhandledRejection', (e) => { console.log(`Bail out! ${e?.stack ?? e}`); killAll(); process.exit(1); });
setTimeout(() => { console.log('Bail out! the whole test ran past 150 s'); killAll(); process.exit(1); }, 150000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const withTimeout = (p, ms, what) => Promise.race([p, sleep(ms).then(() => { throw new Error(`${what}: nothing in ${ms} ms`); })]);

let n = 0, failed = 0;
async function test(name, fn) {
  n++;
  const t = Date.now();
  try { await fn(); console.log(`ok ${n} - ${name} (${Date.now() - t} ms)`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${String(e.stack ?? e).split('\n').join('\n# ')}`); }
}
const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;

// ---- the package ----
const t0 = Date.now();
const deb = execFileSync('bash', [path.join(args.src, 'packaging', 'mkdeb.sh'), args.build, path.join(W, 'out')],
  { encoding: 'utf8', env: { ...process.env, KVF_DEB_COMPRESS: 'gzip' } }).trim().split('\n').pop();
console.log(`# built ${deb} in ${Date.now() - t0} ms`);
const ROOT = path.join(W, 'root');
const UNITS = ['kvfence.service', 'kvfence-router.service', 'kvfence-prefill@.service', 'kvfence-decode@.service'];
const UNIT_DIR = 'usr/lib/systemd/system';

await test('the package holds the binary, its manual, the four units and the environment file', async () => {
  const list = execFileSync('dpkg-deb', ['-c', deb], { encoding: 'utf8' }).trim().split('\n');
  const entry = new Map(list.map((l) => { const f = l.split(/\s+/); return [f[5], { mode: f[0], owner: f[1] }]; }));
  const want = {
    './usr/bin/kvfence': '-rwxr-xr-x',
    './usr/share/man/man1/kvfence.1.gz': '-rw-r--r--',
    './etc/default/kvfence': '-rw-r--r--',
    ...Object.fromEntries(UNITS.map((u) => [`./${UNIT_DIR}/${u}`, '-rw-r--r--'])),
  };
  for (const [p, mode] of Object.entries(want)) {
    assert.ok(entry.has(p), `${p} is not in the package:\n${list.join('\n')}`);
    assert.equal(entry.get(p).mode, mode, `${p}'s mode`);
  }
  for (const [p, e] of entry) {
    assert.equal(e.owner, 'root/root', `${p} is owned by ${e.owner}`);
    assert.match(p, /^\.\/($|etc\/|usr\/)/, `${p} outside /etc and /usr`);
    if (e.mode.startsWith('d')) assert.equal(e.mode, 'drwxr-xr-x', `directory ${p}'s mode`);
  }
});

await test('its control fields: version of the binary, Depends on every library it loads, the conffile', async () => {
  const field = (f) => execFileSync('dpkg-deb', ['-f', deb, f], { encoding: 'utf8' }).trim();
  assert.equal(field('Package'), 'kvfence');
  assert.equal(field('Architecture'), execFileSync('dpkg', ['--print-architecture'], { encoding: 'utf8' }).trim());
  const bin = path.join(args.build, 'kvfence');
  assert.equal(`kvfence ${field('Version')}`, execFileSync(bin, ['--version'], { encoding: 'utf8' }).trim());
  const deps = field('Depends').split(/,\s*/);
  for (const d of ['libc6', 'libmicrohttpd12', 'libjansson4', 'libsodium23', 'libxxhash0'])
    assert.ok(deps.includes(d), `Depends lacks ${d}: ${deps.join(', ')}`);
  const ctl = path.join(W, 'control');
  execFileSync('dpkg-deb', ['-e', deb, ctl]);
  assert.equal(fs.readFileSync(path.join(ctl, 'conffiles'), 'utf8'), '/etc/default/kvfence\n');
  const pi = fs.statSync(path.join(ctl, 'postinst'));
  assert.equal(pi.mode & 0o777, 0o755);
  assert.doesNotMatch(fs.readFileSync(path.join(ctl, 'postinst'), 'utf8'), /enable|start/, 'postinst starts nothing');
});

execFileSync('dpkg', ['-x', deb, ROOT]);
const KVF = path.join(ROOT, 'usr/bin/kvfence');

await test('the manual page is the binary\'s help: every command a section, every variable listed', async () => {
  const man = zlib.gunzipSync(fs.readFileSync(path.join(ROOT, 'usr/share/man/man1/kvfence.1.gz'))).toString('utf8');
  const version = execFileSync(KVF, ['--version'], { encoding: 'utf8' }).trim().split(' ')[1];
  assert.match(man, new RegExp(`^\\.TH KVFENCE 1 "" "kvfence ${version.replace(/\./g, '\\.')}"`, 'm'));
  const cmds = execFileSync(KVF, ['--help'], { encoding: 'utf8' }).split('commands:\n')[1].split('\n\n')[0]
    .split('\n').map((l) => l.trim().split(/\s+/)[0]);
  assert.ok(cmds.length >= 8 && cmds.includes('serve') && cmds.includes('decode'), cmds.join(' '));
  for (const c of cmds) assert.match(man, new RegExp(`^\\.SS ${c}$`, 'm'), `no section for ${c}`);
  // An option of each command's help is in its section, and the operator options are there.
  for (const o of ['--admin-keys', '--admin-listen', '--cluster-key', '--listen', '--kv-memory'])
    assert.ok(man.includes(`  ${o}`), `the manual lacks ${o}`);
  const env = man.split('.SH ENVIRONMENT')[1].split('.SH FILES')[0];
  for (const v of ['KVFENCE_MODEL', 'KVFENCE_PORT', 'KVFENCE_ADMIN_KEYS', 'KVFENCE_PREFILL', 'KVFENCE_LISTEN'])
    assert.match(env, new RegExp(`^\\.B ${v}$`, 'm'), `ENVIRONMENT lacks ${v}`);
  if (has('groff')) {
    const g = spawnSync('groff', ['-man', '-ww', '-z', '-Tutf8'], { input: man, encoding: 'utf8' });
    assert.equal(g.status, 0, g.stderr);
    assert.equal(g.stderr, '', `groff warns:\n${g.stderr}`);
  } else {
    console.log('# groff is not installed here: the manual page\'s roff is not checked by groff');
  }
});

// ---- the units ----
function readUnit(name) {
  const text = fs.readFileSync(path.join(ROOT, UNIT_DIR, name), 'utf8');
  const u = { text, env: [], envFiles: [], creds: [], service: new Map() };
  let section = '';
  for (const raw of text.split('\n')) {
    const l = raw.trim();
    if (!l || l.startsWith('#') || l.startsWith(';')) continue;
    const s = /^\[(\w+)\]$/.exec(l);
    if (s) { section = s[1]; continue; }
    const eq = l.indexOf('=');
    const k = l.slice(0, eq), v = l.slice(eq + 1);
    if (section !== 'Service') continue;
    if (k === 'Environment') u.env.push(v);
    else if (k === 'EnvironmentFile') u.envFiles.push(v);
    else if (k === 'LoadCredential') u.creds.push(v);
    else u.service.set(k, [...(u.service.get(k) ?? []), v]);
  }
  return u;
}
const units = Object.fromEntries(UNITS.map((u) => [u, readUnit(u)]));
const ROLE = { 'kvfence.service': 'serve', 'kvfence-router.service': 'router', 'kvfence-prefill@.service': 'prefill', 'kvfence-decode@.service': 'decode' };

await test('each unit: its role, the environment file, the sandbox', async () => {
  const sandbox = {
    DynamicUser: 'yes', ProtectSystem: 'strict', NoNewPrivileges: 'yes', StateDirectory: 'kvfence',
    ProtectHome: 'yes', PrivateTmp: 'yes', PrivateDevices: 'yes', ProtectKernelTunables: 'yes',
    ProtectKernelModules: 'yes', ProtectControlGroups: 'yes', RestrictSUIDSGID: 'yes',
    LockPersonality: 'yes', MemoryDenyWriteExecute: 'yes', CapabilityBoundingSet: '',
    RestrictAddressFamilies: 'AF_INET AF_INET6 AF_UNIX', UMask: '0077', KillSignal: 'SIGTERM',
  };
  for (const [name, u] of Object.entries(units)) {
    for (const [k, v] of Object.entries(sandbox))
      assert.deepEqual(u.service.get(k), [v], `${name}: ${k}=${v}`);
    assert.ok(u.service.get('SystemCallFilter')?.includes('@system-service'), `${name}: SystemCallFilter`);
    assert.deepEqual(u.envFiles.slice(0, 1), ['/etc/default/kvfence'], `${name}: EnvironmentFile`);
    const exec = u.service.get('ExecStart');
    assert.equal(exec?.length, 1, `${name}: one ExecStart`);
    assert.match(exec[0], new RegExp(`^/usr/bin/kvfence ${ROLE[name]}( |$)`), `${name}: ExecStart`);
    if (name.includes('@')) assert.match(exec[0], /--listen \$\{KVFENCE_WORKER_HOST\}:%i$/, `${name}: the instance is the port`);
    if (ROLE[name] !== 'serve') assert.deepEqual(u.creds, ['cluster.key:/etc/kvfence/cluster.key'], `${name}: the cluster key as a credential`);
  }
  // serve keeps its data (the default model) in the state directory.
  assert.ok(units['kvfence.service'].env.includes('KVFENCE_DATA_DIR=%S/kvfence'));
});

await test('systemd-analyze verify and security against the scratch root', async () => {
  if (!has('systemd-analyze')) {
    console.log('# systemd-analyze is not installed here: the units are checked by their content alone');
    return;
  }
  // The root needs systemd's own units (sysinit.target and the rest) beside the package's.
  const sys = ['/usr/lib/systemd/system', '/lib/systemd/system'].find((d) => fs.existsSync(path.join(d, 'sysinit.target')));
  if (!sys) {
    console.log('# systemd-analyze cannot run here: this system has no systemd units (sysinit.target) to verify against; the units are checked by their content alone');
    return;
  }
  const sysroot = path.join(W, 'sysroot');
  fs.cpSync(ROOT, sysroot, { recursive: true });
  fs.cpSync(sys, path.join(sysroot, 'lib/systemd/system'), { recursive: true, dereference: false });
  for (const name of UNITS) {
    const inst = name.replace('@.', '@9001.');
    const v = spawnSync('systemd-analyze', ['verify', '--man=no', `--root=${sysroot}`, inst], { encoding: 'utf8' });
    assert.equal(v.status, 0, `verify ${inst}: ${v.stdout}${v.stderr}`);
    assert.equal(`${v.stdout}${v.stderr}`, '', `verify ${inst} says:\n${v.stdout}${v.stderr}`);
    const s = spawnSync('systemd-analyze', ['security', '--offline=yes', `--root=${sysroot}`, '--threshold=25', '--no-pager', inst], { encoding: 'utf8' });
    const lvl = /Overall exposure level for \S+: ([\d.]+)/.exec(s.stdout);
    assert.ok(lvl, `security ${inst}: ${s.stdout.slice(-500)}${s.stderr}`);
    assert.equal(s.status, 0, `security ${inst}: exposure ${lvl[1]} above 2.5\n${s.stderr}`);
    console.log(`# ${inst}: systemd-analyze verify clean, exposure level ${lvl[1]}`);
  }
});

// ---- running the units' command lines ----
const MODEL = path.join(W, 'tiny.gguf');
execFileSync(KVF, ['mkmodel', MODEL, '--shape', 'tiny', '--type', 'q8_0', '--seed', '5'], { stdio: 'ignore' });
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// The environment file with the test's values written into it: a line setting (or commenting
// out) a variable takes the value; a variable the file does not name is appended.
function writeEnvFile(values) {
  const src = fs.readFileSync(path.join(ROOT, 'etc/default/kvfence'), 'utf8').split('\n');
  const left = new Map(Object.entries(values));
  const out = src.map((l) => {
    const m = /^#?(KVFENCE_[A-Z_]+)=/.exec(l);
    if (!m || !left.has(m[1])) return l;
    const v = left.get(m[1]);
    left.delete(m[1]);
    return `${m[1]}=${v}`;
  });
  for (const [k, v] of left) out.push(`${k}=${v}`);
  fs.writeFileSync(path.join(ROOT, 'etc/default/kvfence'), out.join('\n'));
}
function parseEnvFile(p) {
  const env = {};
  for (const raw of fs.readFileSync(p, 'utf8').split('\n')) {
    const l = raw.trim();
    if (!l || l.startsWith('#') || l.startsWith(';')) continue;
    const eq = l.indexOf('=');
    let v = l.slice(eq + 1);
    if (/^(['"]).*\1$/.test(v)) v = v.slice(1, -1);
    env[l.slice(0, eq).trim()] = v;
  }
  return env;
}

// A unit's process as systemd would start it: specifiers, credentials, environment, ${VAR}.
function fromUnit(name, instance) {
  const u = units[name];
  const unitName = name.replace('@.', `@${instance}.`);
  const state = path.join(W, 'state'), creds = path.join(W, 'creds', unitName);
  fs.mkdirSync(path.join(state, 'kvfence'), { recursive: true, mode: 0o700 });
  const spec = (s) => s.replace(/%([%iSd])/g, (_, c) => ({ '%': '%', i: instance ?? '', S: state, d: creds })[c]);
  fs.mkdirSync(creds, { recursive: true, mode: 0o700 });
  for (const c of u.creds) {
    const [id, src] = c.split(':');
    fs.copyFileSync(path.join(ROOT, src), path.join(creds, id));
    fs.chmodSync(path.join(creds, id), 0o400);
  }
  const env = { PATH: '/usr/local/bin:/usr/bin:/bin', ASAN_OPTIONS: 'detect_leaks=1' };
  for (const e of u.env) { const s = spec(e); const eq = s.indexOf('='); env[s.slice(0, eq)] = s.slice(eq + 1); }
  for (const f of u.envFiles) {
    const optional = f.startsWith('-');
    const p = path.join(ROOT, spec(optional ? f.slice(1) : f));
    if (!fs.existsSync(p)) { assert.ok(optional, `${name}: ${p} is missing`); continue; }
    Object.assign(env, parseEnvFile(p));
  }
  const words = spec(u.service.get('ExecStart')[0]).split(/\s+/)
    .map((w) => w.replace(/\$\{(\w+)\}/g, (_, v) => env[v] ?? ''));
  assert.equal(words[0], '/usr/bin/kvfence');
  return { name: unitName, argv: words.slice(1), env, cwd: path.join(state, 'kvfence') };
}
function launch(spec) {
  const child = spawn(KVF, spec.argv, { stdio: ['ignore', 'pipe', 'pipe'], env: spec.env, cwd: spec.cwd });
  children.add(child);
  const p = { name: spec.name, child, out: '', err: '', exited: null };
  child.stdout.on('data', (d) => { p.out += d; });
  child.stderr.on('data', (d) => { p.err += d; });
  p.exitP = new Promise((r) => child.on('exit', (code, sig) => { p.exited = { code, sig }; children.delete(child); r(p.exited); }));
  return p;
}
async function waitFor(p, re, ms, where = 'err') {
  return withTimeout(new Promise((resolve, reject) => {
    const poll = setInterval(() => {
      const m = p[where].match(re);
      if (m) { clearInterval(poll); resolve(m); }
      if (p.exited) { clearInterval(poll); reject(new Error(`${p.name} exited early (${JSON.stringify(p.exited)}): ${p.err.slice(-2000)}`)); }
    }, 20);
  }), ms, `${p.name}: ${re}`);
}
async function stopClean(p) {
  p.child.kill('SIGTERM');
  const ex = await withTimeout(p.exitP, 30000, `${p.name} SIGTERM`).catch((e) => { p.child.kill('SIGKILL'); throw e; });
  assert.equal(ex.code, 0, `${p.name} exit ${JSON.stringify(ex)}\n${p.err.slice(-3000)}`);
  assert.doesNotMatch(p.err, /AddressSanitizer|LeakSanitizer|runtime error/, p.err.slice(-3000));
}

// The reference: the installed binary's `kvfence run`.
const PROMPT = 'The quick brown fox';
const MAX_TOKENS = 8;
function reference() {
  const out = execFileSync(KVF, ['run', '--model', MODEL, '--prompt', PROMPT, '--max-tokens', String(MAX_TOKENS),
    '--temperature', '0', '--threads', '1', '--print-token-ids', '--print-logprobs'], { encoding: 'utf8', env: { PATH: process.env.PATH } });
  const lines = out.split('\n');
  const at = lines.findIndex((l) => l.startsWith('prompt_token_ids:'));
  const nums = (l) => l.split(':')[1].trim().split(/\s+/).filter(Boolean).map(Number);
  return { ids: nums(lines[at + 1]), lps: nums(lines[at + 2]).map(Math.fround) };
}
const REF = reference();
assert.equal(REF.ids.length, MAX_TOKENS);
// The operator endpoints on their own address (KVFENCE_ADMIN_LISTEN): the public port serves no
// /metrics and a /health that says only ok; the operator address serves both in full.
async function operatorApart(what) {
  const pub = await fetch(`http://127.0.0.1:${HTTP}/metrics`);
  assert.equal(pub.status, 404, `${what}: public /metrics ${await pub.text()}`);
  const h = await fetch(`http://127.0.0.1:${HTTP}/health`);
  assert.deepEqual(await h.json(), { status: 'ok' }, `${what}: public /health`);
  const m = await fetch(`http://127.0.0.1:${ADMIN}/metrics`);
  const mt = await m.text();
  assert.equal(m.status, 200, `${what}: operator /metrics ${mt}`);
  assert.match(mt, /^kvfence_requests_total\{tenant="default",outcome="ok"\} 1$/m, `${what}: the completion counted`);
  const full = await (await fetch(`http://127.0.0.1:${ADMIN}/health`)).json();
  assert.equal(full.status, 'ok');
  assert.ok(full.decode && full.counters, `${what}: operator /health ${JSON.stringify(full)}`);
}
async function completionEqualsRun(port, what) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, logprobs: 0, return_tokens_as_token_ids: true }),
  });
  const body = await r.text();
  assert.equal(r.status, 200, `${what}: ${body}`);
  const lp = JSON.parse(body).choices[0].logprobs;
  const ids = lp.tokens.map((t) => { const m = /^token_id:(\d+)$/.exec(t); assert.ok(m, t); return Number(m[1]); });
  assert.deepEqual(ids, REF.ids, `${what}: token ids`);
  assert.deepEqual(lp.token_logprobs.map(Math.fround), REF.lps, `${what}: logprobs (float32)`);
}

const [HTTP, ADMIN, P_PREFILL, P_DECODE] = [await freePort(), await freePort(), await freePort(), await freePort()];
writeEnvFile({
  KVFENCE_MODEL: MODEL, KVFENCE_PORT: String(HTTP), KVFENCE_THREADS: '1', KVFENCE_KV_MEMORY: '8M',
  KVFENCE_ADMIN_LISTEN: `127.0.0.1:${ADMIN}`,
  KVFENCE_PREFILL: `127.0.0.1:${P_PREFILL}`, KVFENCE_DECODE: `127.0.0.1:${P_DECODE}`,
});
fs.mkdirSync(path.join(ROOT, 'etc/kvfence'), { recursive: true });
execFileSync(KVF, ['keygen', path.join(ROOT, 'etc/kvfence/cluster.key')], { stdio: 'ignore' });

await test('kvfence.service\'s command line serves a completion equal to kvfence run, /metrics on the operator address alone', async () => {
  const spec = fromUnit('kvfence.service');
  assert.deepEqual(spec.argv, ['serve']);
  assert.equal(spec.env.KVFENCE_DATA_DIR, path.join(W, 'state', 'kvfence'));
  const p = launch(spec);
  try {
    const m = await waitFor(p, /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000);
    assert.equal(Number(m[1]), HTTP, 'the port of the environment file');
    await completionEqualsRun(HTTP, 'serve');
    assert.match(p.err, new RegExp(`operator endpoints \\(/metrics, /health in full\\) on 127\\.0\\.0\\.1:${ADMIN}`));
    await operatorApart('serve');
  } finally {
    await stopClean(p);
  }
});

await test('router + prefill@ + decode@ from their units serve a completion equal to kvfence run, /metrics on the operator address alone', async () => {
  const pre = fromUnit('kvfence-prefill@.service', String(P_PREFILL));
  const dec = fromUnit('kvfence-decode@.service', String(P_DECODE));
  const rtr = fromUnit('kvfence-router.service');
  assert.deepEqual(pre.argv, ['prefill', '--listen', `127.0.0.1:${P_PREFILL}`]);
  assert.deepEqual(dec.argv, ['decode', '--listen', `127.0.0.1:${P_DECODE}`]);
  assert.deepEqual(rtr.argv, ['router']);
  for (const s of [pre, dec, rtr]) assert.match(s.env.KVFENCE_CLUSTER_KEY, /\/creds\/.*\/cluster\.key$/);
  const ps = [];
  try {
    ps.push(launch(pre));
    await waitFor(ps[0], new RegExp(`listening 127\\.0\\.0\\.1 ${P_PREFILL}`), 60000, 'out');
    ps.push(launch(dec));
    await waitFor(ps[1], new RegExp(`listening 127\\.0\\.0\\.1 ${P_DECODE}`), 60000, 'out');
    ps.push(launch(rtr));
    await waitFor(ps[2], /listening on http:\/\/127\.0\.0\.1:(\d+)/, 60000);
    // Up once the router reaches a decode worker that reaches a prefill worker.
    const until = Date.now() + 30000;
    for (;;) {
      const h = await fetch(`http://127.0.0.1:${HTTP}/health`).catch(() => null);
      if (h?.status === 200) break;
      assert.ok(Date.now() < until, `the router's /health: ${h?.status} ${await h?.text()}`);
      await sleep(100);
    }
    await completionEqualsRun(HTTP, 'router');
    await operatorApart('router');
    // The router's /metrics: promtool-valid, the decode worker's verify failures by reason.
    const mt = await (await fetch(`http://127.0.0.1:${ADMIN}/metrics`)).text();
    for (const r of ['count', 'trailer', 'checksum', 'tail']) {
      assert.match(mt, new RegExp(`^kvfence_verify_failures_total\\{reason="${r}"\\} 0$`, 'm'), r);
      assert.match(mt, new RegExp(`^kvfence_worker_verify_failures_total\\{worker="127\\.0\\.0\\.1:${P_DECODE}",reason="${r}"\\} 0$`, 'm'), r);
    }
    if (has('promtool')) {
      const pc = spawnSync('promtool', ['check', 'metrics'], { input: mt, encoding: 'utf8' });
      assert.equal(pc.status, 0, `promtool check metrics: ${pc.stdout}${pc.stderr}`);
    }
    // The fabric is authenticated by the credential: the workers say so.
    for (const p of ps) assert.doesNotMatch(p.err, /insecure|without a cluster key/i, `${p.name}: ${p.err.slice(-1000)}`);
  } finally {
    const errs = [];
    for (const p of ps.reverse()) await stopClean(p).catch((e) => errs.push(e));
    if (errs.length) throw errs[0];
  }
});

console.log(`1..${n}`);
if (failed) console.log(`# ${failed} of ${n} failed`);
process.exit(failed ? 1 : 0);
