#!/usr/bin/env bash
# bench/canary_cost.sh [KVFENCE] — the canary's cost on throughput (docs/SERVER.md, "Canary").
#
# Runs `kvfence serve` (the readable test model hist, --threads 2) without a canary (A) and with
# `--canary-interval 1` (B, the highest rate the option allows), one at a time, ABBA order, and
# the same `kvfence bench serve` against each. Prints each run's result line (B's with the
# canary runs /health counted by then) and last
#   result bench=canary_cost tok_s_none=.. tok_s_canary=.. ratio=.. cost_pct=..
# with the medians of each side's runs, ratio the median over rounds of each round's mean B /
# mean A (a round's four runs are back to back, so they share the machine's load of the moment)
# and cost_pct = (1 − ratio) × 100.
#
# Settings (environment): ROUNDS (2: ABBA twice), CONCURRENCY (8), REQUESTS (1024), PROMPT (64),
# GEN (32).
set -euo pipefail
K=${1:-build/kvfence}
ROUNDS=${ROUNDS:-2}
CONCURRENCY=${CONCURRENCY:-8}
REQUESTS=${REQUESTS:-1024}
PROMPT=${PROMPT:-64}
GEN=${GEN:-32}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT

# run EXTRA...: one serve, one bench; prints tok/s.
run() {
    local log="$D/serve.log" port=""
    "$K" serve --port 0 --data-dir "$D/data" --threads 2 "$@" >"$log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
        [ -n "$port" ] && break
        sleep 0.05
    done
    sleep 3 # the canary's references, made at start
    local line
    line=$("$K" bench serve --url "http://127.0.0.1:$port" --concurrency "$CONCURRENCY" \
        --requests "$REQUESTS" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --warmup 8 2>&1 |
        grep '^result')
    local runs
    runs=$(curl -s "http://127.0.0.1:$port/health" | grep -o '"runs":[0-9]*' || echo '-')
    kill -TERM "$pid"
    wait "$pid" || true
    echo "$line canary_$runs" >&2
    echo "$line" | grep -o 'tok_s=[0-9.]*' | cut -d= -f2
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: >"$D/a"
: >"$D/b"
: >"$D/r"
for _ in $(seq 1 "$ROUNDS"); do
    a1=$(run)
    b1=$(run --canary-interval 1)
    b2=$(run --canary-interval 1)
    a2=$(run)
    printf '%s\n%s\n' "$a1" "$a2" >>"$D/a"
    printf '%s\n%s\n' "$b1" "$b2" >>"$D/b"
    awk -v a1="$a1" -v a2="$a2" -v b1="$b1" -v b2="$b2" 'BEGIN {print (b1 + b2) / (a1 + a2)}' >>"$D/r"
done
a=$(median <"$D/a")
b=$(median <"$D/b")
r=$(median <"$D/r")
echo "result bench=canary_cost tok_s_none=$a tok_s_canary=$b ratio=$r cost_pct=$(awk -v r="$r" 'BEGIN {printf "%.1f", (1 - r) * 100}')"
