// No silent skips: run after the tests (make test), this fails when any test skipped, unless the
// skip is listed with its reason in tests/ALLOWED_SKIPS (the one place) or named in
// KVF_ALLOW_SKIP=name,... for one run; either way it prints every skip it found.
//
// A skip is: a CTest property that lets a test skip or never run (SKIP_RETURN_CODE,
// SKIP_REGULAR_EXPRESSION, DISABLED); CTest reporting a test as skipped or not run; or a test's
// output carrying a TAP skip directive (`ok ... # SKIP`, `1..0 # SKIP`) or a line that begins
// `SKIP` / `# SKIP`; or a test of the tree that did not run. Reads `ctest --show-only=json-v1` and Testing/Temporary/LastTest.log.
//   node scripts/no_skips.mjs BUILD_DIR [--preset NAME]
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const build = process.argv[2];
if (!build) { console.log('usage: node scripts/no_skips.mjs BUILD_DIR'); process.exit(2); }
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
const allowed = new Map();
const listFile = path.join(root, 'tests', 'ALLOWED_SKIPS');
if (fs.existsSync(listFile)) {
  for (const line of fs.readFileSync(listFile, 'utf8').split('\n')) {
    const t = line.trim();
    if (!t || t.startsWith('#')) continue;
    const [name, ...why] = t.split(/\s+/);
    if (!why.length) { console.log(`no_skips: ${listFile}: '${name}' has no reason`); process.exit(1); }
    allowed.set(name, why.join(' '));
  }
}
for (const name of (process.env.KVF_ALLOW_SKIP ?? '').split(',').filter(Boolean)) allowed.set(name, 'KVF_ALLOW_SKIP');

// The last run's log first: `ctest --show-only` below starts a new one.
const logPath = path.join(build, 'Testing', 'Temporary', 'LastTest.log');
if (!fs.existsSync(logPath)) { console.log(`no_skips: ${logPath} is missing: run the tests first`); process.exit(1); }
const log = fs.readFileSync(logPath, 'utf8');
const skips = [];
// 1. Properties that let a test skip or never run.
const json = JSON.parse(execFileSync('ctest', ['--test-dir', build, '--show-only=json-v1'], { encoding: 'utf8', maxBuffer: 64 << 20 }));
for (const t of json.tests) {
  for (const p of t.properties ?? []) {
    if (['SKIP_RETURN_CODE', 'SKIP_REGULAR_EXPRESSION', 'DISABLED'].includes(p.name) && p.value !== false) {
      skips.push({ name: t.name, why: `CTest property ${p.name}=${JSON.stringify(p.value)}` });
    }
  }
}
// 2. What the last run said.
const ran = new Set();
const sections = log.split(/^(?=\d+\/\d+ Testing: )/m).slice(1);
const tapSkip = /^(?:(?:not )?ok\b[^\n]*#\s*SKIP\b|1\.\.0\s*#\s*SKIP\b)|^#?\s*SKIP(?:PED)?\b[:\s]/m;
for (const sec of sections) {
  const name = sec.match(/^\d+\/\d+ Testing: (\S+)/)[1];
  ran.add(name);
  if (/^Test (?:Skipped|Not Run)\b|\*\*\*(?:Skipped|Not Run)/m.test(sec)) skips.push({ name, why: 'CTest reported it skipped or not run' });
  const m = sec.match(tapSkip);
  if (m) skips.push({ name, why: `its output: "${m[0].trim().slice(0, 120)}"` });
}
// 3. A test of the tree that did not run at all.
for (const t of json.tests) if (!ran.has(t.name)) skips.push({ name: t.name, why: 'it did not run' });
let bad = 0;
for (const s of skips) {
  const ok = allowed.has(s.name);
  if (!ok) bad++;
  console.log(`# skip: ${s.name}: ${s.why}${ok ? ` (allowed: ${allowed.get(s.name)})` : ' — NOT ALLOWED'}`);
}
console.log(`no_skips: ${sections.length} tests ran, ${skips.length} skips, ${bad} not allowed${allowed.size ? `; allowed: ${[...allowed.keys()].join(', ')}` : ''}`);
process.exit(bad ? 1 : 0);
