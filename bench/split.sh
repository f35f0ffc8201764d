#!/usr/bin/env bash
# bench/split.sh KVFENCE — the split roles against `kvfence serve`, measured (`make bench-split`).
#
# Serves one model twice at once: `kvfence serve --threads T`, and the split roles — `kvfence
# router`, one `kvfence prefill` and one `kvfence decode` process, each worker with --threads T
# and the same --compute-lock file (so the two processes take turns on the cores as serve's two
# workers do) — and runs the same `kvfence bench serve` against them in alternation, ABBA order,
# ROUNDS rounds (an idle server sleeps, so the one not under load costs nothing). Prints each
# run, the medians, and last
#   result bench=split tok_s_serve=.. tok_s_split=.. ratio=.. ttft_p50_serve_ms=.. ttft_p50_split_ms=..
# where ratio is the median over rounds of each round's split / serve.
#
# Settings (environment): MODEL (default: build/smol135m-q8_0.gguf, written with mkmodel if
# missing), ROUNDS (6), CONCURRENCY (16), REQUESTS (64), PROMPT (64), GEN (64), THREADS (2),
# LOCK (1: the workers share a --compute-lock file; 0: they do not).
set -euo pipefail

bin=${1:?usage: bench/split.sh KVFENCE}
ROUNDS=${ROUNDS:-6}
CONCURRENCY=${CONCURRENCY:-16}
REQUESTS=${REQUESTS:-64}
PROMPT=${PROMPT:-64}
GEN=${GEN:-64}
THREADS=${THREADS:-2}
LOCK=${LOCK:-1}
MODEL=${MODEL:-build/smol135m-q8_0.gguf}
[[ -f $MODEL ]] || "$bin" mkmodel "$MODEL" --shape smol135m --type q8_0

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
lock=()
[[ $LOCK == 1 ]] && lock=(--compute-lock "$tmp/cores.lock")

serve_port=$(free_port)
"$bin" serve --model "$MODEL" --threads "$THREADS" --port "$serve_port" >"$tmp/serve.log" 2>&1 &
pids+=($!)
pp=$(free_port) dp=$(free_port) split_port=$(free_port)
"$bin" prefill --model "$MODEL" --threads "$THREADS" --listen "127.0.0.1:$pp" "${lock[@]}" >"$tmp/prefill.log" 2>&1 &
pids+=($!)
"$bin" decode --model "$MODEL" --threads "$THREADS" --listen "127.0.0.1:$dp" "${lock[@]}" >"$tmp/decode.log" 2>&1 &
pids+=($!)
"$bin" router --model "$MODEL" --port "$split_port" --prefill "127.0.0.1:$pp" --decode "127.0.0.1:$dp" >"$tmp/router.log" 2>&1 &
pids+=($!)
for port in "$serve_port" "$split_port"; do
    for ((i = 0; i < 600; i++)); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
        sleep 0.1
    done
    curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "server on $port did not come up" >&2; cat "$tmp"/*.log >&2; exit 1; }
done

run() { # $1 = port: prints "tok_s ttft_p50_ms"
    "$bin" bench serve --url "http://127.0.0.1:$1" --concurrency "$CONCURRENCY" --requests "$REQUESTS" \
        --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --stream --logprobs |
        awk '/^result bench=serve/ { t = ""; f = ""; for (i = 1; i <= NF; i++) { if ($i ~ /^tok_s=/) { sub("tok_s=", "", $i); t = $i } if ($i ~ /^ttft_p50_ms=/) { sub("ttft_p50_ms=", "", $i); f = $i } } print t, f }
             /^result bench=serve/ && !/errors=0/ { print "errors" > "/dev/stderr"; exit 1 }'
}

serve=() split=() sttft=() pttft=() ratios=()
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then order="serve split"; else order="split serve"; fi
    for which in $order; do
        if [[ $which == serve ]]; then read -r t f < <(run "$serve_port"); serve+=("$t"); sttft+=("$f")
        else read -r t f < <(run "$split_port"); split+=("$t"); pttft+=("$f"); fi
    done
    ratios+=("$(awk -v a="${split[-1]}" -v b="${serve[-1]}" 'BEGIN { printf "%.4f", a / b }')")
    echo "round $r ($order)  serve tok_s=${serve[-1]} ttft_p50=${sttft[-1]}ms  split tok_s=${split[-1]} ttft_p50=${pttft[-1]}ms  ratio=${ratios[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
awk -v a="$(median "${serve[@]}")" -v b="$(median "${split[@]}")" -v r="$(median "${ratios[@]}")" \
    -v c="$(median "${sttft[@]}")" -v d="$(median "${pttft[@]}")" -v l="$LOCK" \
    'BEGIN { printf "result bench=split tok_s_serve=%.1f tok_s_split=%.1f ratio=%.4f ttft_p50_serve_ms=%s ttft_p50_split_ms=%s compute_lock=%s\n", a, b, r, c, d, l }'
