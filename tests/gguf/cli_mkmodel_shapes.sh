#!/bin/sh
# kvfence mkmodel refuses an unknown shape with the list of its shapes, the released models'
# among them, and --help describes every shape that list names.
set -eu
K="$1"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
if "$K" mkmodel "$D/x.gguf" --shape nope 2>"$D/err"; then echo "unknown --shape accepted"; exit 1; fi
for s in llama3.2-1b qwen2.5-0.5b qwen3-0.6b llama3-8b tiny hist; do
    grep -q "unknown shape 'nope' (.*\b$s\b" "$D/err" || { echo "the error omits $s"; cat "$D/err"; exit 1; }
done
"$K" mkmodel --help >"$D/help"
names=$(sed -n "s/.*unknown shape 'nope' (\(.*\))\$/\1/p" "$D/err" | tr -d ,)
[ -n "$names" ] || { echo "no list in the error"; cat "$D/err"; exit 1; }
for s in $names; do
    grep -q "^  $s " "$D/help" || { echo "mkmodel --help does not describe $s"; exit 1; }
done
[ ! -e "$D/x.gguf" ] || { echo "a file was left for an unknown shape"; exit 1; }
