#!/usr/bin/env bash
# bench/overhead.sh CHECKS_BIN NOCHECKS_BIN — the price of safety, measured (`make bench-overhead`).
#
# Serves one model from both binaries at once (each `kvfence serve --threads 2` on its own port;
# an idle server sleeps, so the one not under load costs nothing) and runs the same
# `kvfence bench serve` against them in alternation — ABBA order, ROUNDS rounds — so drift on a
# shared machine falls on both alike. Prints each run, the medians, and last
#   result bench=overhead tok_s_checks=.. tok_s_nochecks=.. ratio=.. cost_pct=..
# where ratio is the median over rounds of each round's checks / nochecks (the two runs of a
# round are back to back, so the pair shares the machine's load of the moment), and
# cost_pct = (1 − ratio) × 100.
#
# Settings (environment): MODEL (default: build-nochecks/smol135m-q8_0.gguf, written with mkmodel
# if missing), ROUNDS (6), CONCURRENCY (16), REQUESTS (64), PROMPT (64), GEN (64), THREADS (2).
set -euo pipefail

on_bin=${1:?usage: bench/overhead.sh CHECKS_BIN NOCHECKS_BIN}
off_bin=${2:?usage: bench/overhead.sh CHECKS_BIN NOCHECKS_BIN}
ROUNDS=${ROUNDS:-6}
CONCURRENCY=${CONCURRENCY:-16}
REQUESTS=${REQUESTS:-64}
PROMPT=${PROMPT:-64}
GEN=${GEN:-64}
THREADS=${THREADS:-2}
MODEL=${MODEL:-build-nochecks/smol135m-q8_0.gguf}

if [[ ! -f $MODEL ]]; then
    "$on_bin" mkmodel "$MODEL" --shape smol135m --type q8_0
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

on_port=$(free_port)
"$on_bin" serve --model "$MODEL" --threads "$THREADS" --port "$on_port" >/tmp/kvf-overhead-on.$$.log 2>&1 &
pids+=($!)
off_port=$(free_port)
"$off_bin" serve --model "$MODEL" --threads "$THREADS" --port "$off_port" >/tmp/kvf-overhead-off.$$.log 2>&1 &
pids+=($!)

run() { # $1 = port: prints tok_s
    "$on_bin" bench serve --url "http://127.0.0.1:$1" --concurrency "$CONCURRENCY" \
        --requests "$REQUESTS" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --stream |
        awk '/^result bench=serve/ { for (i = 1; i <= NF; i++) if ($i ~ /^tok_s=/) { sub("tok_s=", "", $i); print $i } }
             /^result bench=serve/ && !/errors=0/ { print "errors" > "/dev/stderr"; exit 1 }'
}

on=()
off=()
ratios=()
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then order="on off"; else order="off on"; fi
    for which in $order; do
        if [[ $which == on ]]; then t=$(run "$on_port"); on+=("$t"); else t=$(run "$off_port"); off+=("$t"); fi
    done
    ratios+=("$(awk -v a="${on[-1]}" -v b="${off[-1]}" 'BEGIN { printf "%.4f", a / b }')")
    echo "round $r ($order)  checks on tok_s=${on[-1]}  compiled out tok_s=${off[-1]}  ratio=${ratios[-1]}"
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_on=$(median "${on[@]}")
m_off=$(median "${off[@]}")
echo "checks on ($on_bin): median $m_on tok/s over ${#on[@]} runs; checks compiled out ($off_bin): median $m_off tok/s"
m_ratio=$(median "${ratios[@]}")
awk -v a="$m_on" -v b="$m_off" -v r="$m_ratio" 'BEGIN { printf "result bench=overhead tok_s_checks=%.1f tok_s_nochecks=%.1f ratio=%.4f cost_pct=%.2f\n", a, b, r, (1 - r) * 100 }'
