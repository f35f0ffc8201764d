#!/bin/sh
# kvfence run and kvfence bench model end to end on a tiny model: the run prints both id lines,
# a seeded sampled run repeats exactly, greedy runs repeat exactly (Q8_0, Q4_K_M and Q5_K_M), and the benches (model,
# attention) end with their result lines and refuse a bad option value.
set -eu
K="$1"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
"$K" mkmodel "$D/m.gguf" --shape tiny --type q8_0 --seed 4 >/dev/null
"$K" run --model "$D/m.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids >"$D/a"
grep -q '^prompt_token_ids: 1 ' "$D/a" || { echo "no prompt ids line"; cat "$D/a"; exit 1; }
n=$(grep '^output_token_ids:' "$D/a" | wc -w)
[ "$n" -ge 2 ] && [ "$n" -le 13 ] || { echo "bad output ids line"; cat "$D/a"; exit 1; }
"$K" run --model "$D/m.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids --threads 1 >"$D/b"
cmp "$D/a" "$D/b" || { echo "greedy output depends on the thread count"; exit 1; }
"$K" run --model "$D/m.gguf" --prompt "Hi" --max-tokens 20 --temperature 1.0 --seed 9 --print-token-ids >"$D/c"
"$K" run --model "$D/m.gguf" --prompt "Hi" --max-tokens 20 --temperature 1.0 --seed 9 --print-token-ids >"$D/d"
cmp "$D/c" "$D/d" || { echo "a seeded run does not repeat"; exit 1; }
# Q4_K_M on tiny: Q5_0, Q8_0 and F16 weights (its rows are not whole super-blocks).
"$K" mkmodel "$D/k.gguf" --shape tiny --type q4_k_m --seed 4 >/dev/null
"$K" run --model "$D/k.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids >"$D/g"
"$K" run --model "$D/k.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids --threads 1 >"$D/h"
grep -q '^output_token_ids: ' "$D/g" || { echo "no Q4_K_M output ids line"; cat "$D/g"; exit 1; }
cmp "$D/g" "$D/h" || { echo "Q4_K_M greedy output depends on the thread count"; exit 1; }
# Q5_K_M on tiny: Q5_1, Q8_0 and F16 weights.
"$K" mkmodel "$D/q5.gguf" --shape tiny --type q5_k_m --seed 4 >/dev/null
"$K" run --model "$D/q5.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids >"$D/i"
"$K" run --model "$D/q5.gguf" --prompt "Hello there" --max-tokens 12 --print-token-ids --threads 1 >"$D/j"
grep -q '^output_token_ids: ' "$D/i" || { echo "no Q5_K_M output ids line"; cat "$D/i"; exit 1; }
cmp "$D/i" "$D/j" || { echo "Q5_K_M greedy output depends on the thread count"; exit 1; }
if "$K" mkmodel "$D/x.gguf" --shape tiny --type q5_k_s 2>/dev/null; then echo "unknown --type accepted"; exit 1; fi
if "$K" run --model "$D/missing.gguf" --prompt x 2>/dev/null; then echo "missing model accepted"; exit 1; fi
"$K" bench model --model "$D/m.gguf" --batch 2 --prompt 8 --gen 4 --threads 2 >"$D/e"
tail -n 1 "$D/e" | grep -Eq '^result bench=model prefill_tps=[0-9.]+ decode_tps=[0-9.]+ batch=2 threads=2$' ||
    { echo "bad bench result line"; cat "$D/e"; exit 1; }
"$K" bench attention --seqs 4 --positions 40 --layers 2 --threads 2 --runs 1 >"$D/f"
tail -n 1 "$D/f" | grep -Eq '^result bench=attention ms_per_pass=[0-9.]+ kv_gbps=[0-9.]+ gmacps=[0-9.]+ seqs=4 positions=40 threads=2$' ||
    { echo "bad attention bench result line"; cat "$D/f"; exit 1; }
if "$K" bench attention --kv-type f8 2>/dev/null; then echo "bad --kv-type accepted"; exit 1; fi
if "$K" bench attention --positions 0 2>/dev/null; then echo "--positions 0 accepted"; exit 1; fi
echo "ok"
