// The official OpenAI Node client against the server (over the fake engine, tests/server/
// fake_serve): completions, chat, streaming with usage, and errors surfacing as the client's
// typed exceptions. Usage: node openai_client.mjs FAKE_SERVE NODE_MODULES_DIR
// Fails (never skips) when the openai package is not installed (scripts/install-deps.sh).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import assert from 'node:assert/strict';

const [fakeServe, nodeModules] = process.argv.slice(2);
const entry = join(nodeModules, 'openai', 'index.mjs');
if (!existsSync(entry)) {
  console.log(`Bail out! ${entry} is missing: run scripts/install-deps.sh`);
  process.exit(1);
}
const { default: OpenAI } = await import(pathToFileURL(entry).href);

const killer = setTimeout(() => { console.log('# timeout'); child.kill('SIGKILL'); process.exit(1); }, 60000);
const child = spawn(fakeServe, [], { stdio: ['pipe', 'pipe', 'inherit'] });
const port = await new Promise((resolve, reject) => {
  let out = '';
  child.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/port (\d+)/);
    if (m) resolve(Number(m[1]));
  });
  child.on('exit', (code) => reject(new Error(`fake_serve exited early (${code})`)));
});

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 10000 });
let failed = 0, n = 0;
async function test(name, fn) {
  n++;
  try { await fn(); console.log(`ok ${n} - ${name}`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}\n# ${e.stack}`); }
}

await test('models', async () => {
  const list = await client.models.list();
  assert.equal(list.data[0].id, 'test-model');
});

let plain;
await test('completion', async () => {
  const r = await client.completions.create({ model: 'test-model', prompt: 'hello world', max_tokens: 5 });
  plain = r.choices[0].text;
  assert.equal(plain, ' hello'); // the echo's first 5 tokens: ▁ h e l lo
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
});

await test('completion stream', async () => {
  const s = await client.completions.create({ model: 'test-model', prompt: 'hello world', max_tokens: 5, stream: true });
  let text = '', finish = null;
  for await (const c of s) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
  assert.equal(text, plain);
  assert.equal(finish, 'length');
});

let chatText;
await test('chat', async () => {
  const r = await client.chat.completions.create({ model: 'test-model', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, stop: ['zz'] });
  assert.equal(r.choices[0].message.role, 'assistant');
  chatText = r.choices[0].message.content;
  assert.equal(typeof chatText, 'string');
  assert.ok(chatText.length > 0);
  assert.equal(r.usage.completion_tokens, 6);
});

await test('chat stream with usage', async () => {
  const s = await client.chat.completions.create({ model: 'test-model', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) { text += ch.delta.content ?? ''; finish = ch.finish_reason ?? finish; }
  }
  assert.equal(text, chatText);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 6);
});

await test('chat logprobs', async () => {
  const r = await client.chat.completions.create({ model: 'test-model', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, logprobs: true, top_logprobs: 2 });
  assert.equal(r.choices[0].logprobs.content.length, 2);
  assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 2);
});

await test('BadRequestError', async () => {
  await assert.rejects(
    client.completions.create({ model: 'test-model', prompt: 'hello', max_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens');
});

await test('BadRequestError for the context limit', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'test-model', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' && /maximum context length is 512 tokens/.test(e.message));
});

await test('NotFoundError', async () => {
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e instanceof OpenAI.NotFoundError);
});

child.stdin.end();
const code = await new Promise((resolve) => child.on('exit', resolve));
clearTimeout(killer);
console.log(`# fake_serve exit ${code}`);
console.log(`1..${n}`);
process.exit(failed === 0 && code === 0 ? 0 : 1);
