#!/bin/sh
# Every command's option table through the kvfence binary, without a model or a network: each
# case stops at a usage error (exit 2) or at opening a model that does not exist (exit 1), and
# the message says which value was taken. Covers the KVFENCE_* variables (the ones each --help
# names, the command line winning over them), aliases, required options and the errors' wording.
set -u
K="$1" # [docs/CLI.md]
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fails=0
M=/nonexistent/m.gguf

# expect RC PATTERN [ENV=V ...] -- ARGS: runs kvfence ARGS with the variables, wants exit RC and
# PATTERN (grep -E) in its stdout+stderr.
expect() {
    rc_want=$1 pat=$2
    shift 2
    envs=""
    while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
    shift
    # shellcheck disable=SC2086
    env -u KVFENCE_CLUSTER_KEY_FILE $envs "$K" "$@" >"$D/out" 2>&1 </dev/null
    rc=$?
    if [ "$rc" != "$rc_want" ] || ! grep -Eq -- "$pat" "$D/out"; then
        echo "not ok: [$envs ] kvfence $* -> exit $rc (want $rc_want), want /$pat/:"
        sed 's/^/    /' "$D/out" | head -20
        fails=$((fails + 1))
    else
        echo "ok: [$envs ] kvfence $*"
    fi
}

# --help names each option's variable; the older name of --progress-timeout stays.
for c in serve decode; do
    expect 0 "KVFENCE_PROGRESS_TIMEOUT" -- $c --help
    expect 0 "KVFENCE_HOLD_TIMEOUT" -- $c --help
    expect 0 "also --grant-timeout" -- $c --help
done
expect 0 "KVFENCE_PREFILL_CHUNK" -- serve --help
expect 0 "KVFENCE_PREFILL_CHUNK" -- prefill --help
expect 0 "KVFENCE_CLUSTER_KEY or KVFENCE_CLUSTER_KEY_FILE" -- router --help
expect 0 "usage: kvfence decode --model F.gguf --listen HOST:PORT" -- decode --help
expect 0 "usage: kvfence mkmodel OUT.gguf --shape SHAPE" -- mkmodel --help
# The help is printed even when a variable is bad (the environment is not read under --help).
expect 0 "usage: kvfence serve" KVFENCE_THREADS=x -- serve --help

# Bounds and aliases, from the command line and from the environment.
expect 2 "bad value '5' for --grant-timeout" -- serve --model $M --grant-timeout 5
expect 2 "bad value '5' for --progress-timeout" KVFENCE_PROGRESS_TIMEOUT=5 -- serve --model $M
expect 2 "bad value '8' for --prefill-chunk" KVFENCE_PREFILL_CHUNK=8 -- serve --model $M
expect 2 "bad value '8' for --prefill-chunk" KVFENCE_PREFILL_CHUNK=8 -- prefill --model $M --listen 127.0.0.1:0
expect 2 "bad value '50' for --hold-timeout" KVFENCE_HOLD_TIMEOUT=50 -- decode --model $M --listen 127.0.0.1:0
expect 2 "bad value '50' for --hold-timeout" -- decode --model $M --listen 127.0.0.1:0 --hold-timeout 50
expect 2 "bad value '0' for --threads" -- serve --model $M --threads 0
expect 2 "bad value 'lots' for --kv-memory" KVFENCE_KV_MEMORY=lots -- decode --model $M --listen 127.0.0.1:0
expect 2 "KVFENCE_NO_AUTH=maybe: want 1/true/yes or 0/false/no" KVFENCE_NO_AUTH=maybe -- serve --model $M
expect 2 "--listen wants HOST:PORT, not 'nope'" KVFENCE_LISTEN=nope -- prefill --model $M
expect 2 "--decode: 'x' is not HOST:PORT" -- router --model $M --prefill 127.0.0.1:9 --decode x
expect 2 "bad value '2e2' for --temperature" -- run --model $M --prompt hi --temperature 2e2
expect 2 "--seed takes a non-negative integer" -- mkmodel $D/x.gguf --shape tiny --seed -1

# Usage errors.
expect 2 "unknown option '--bogus'" -- serve --bogus 1
expect 2 "--threads needs a value" -- serve --threads
expect 2 "--model and --listen are required" -- decode --model $M
expect 2 "--model, --prefill and --decode are required" -- router --model $M --decode 127.0.0.1:9
expect 2 "--model and --prompt are required" -- run --prompt hi
expect 2 "--print-logprobs goes with --print-token-ids" -- run --model $M --prompt hi --print-logprobs
expect 2 "unexpected argument 'b.gguf'" -- mkmodel a.gguf b.gguf --shape tiny
expect 2 "FILE is required" -- keygen
expect 2 "unexpected argument 'b'" -- keygen a b
expect 0 "usage: kvfence keygen FILE" -- keygen --help
expect 0 "wrote a cluster key to $D/k.key" -- keygen "$D/k.key"
expect 1 "$D/k.key: File exists" -- keygen "$D/k.key"

# Where a value comes from: the command line over the environment over the older variable.
L="--listen 127.0.0.1:0"
expect 1 "/nonexistent/env.gguf" KVFENCE_MODEL=/nonexistent/env.gguf -- decode $L
expect 1 "/nonexistent/cli.gguf" KVFENCE_MODEL=/nonexistent/env.gguf -- decode $L --model /nonexistent/cli.gguf
expect 1 "/nonexistent/m.gguf" KVFENCE_LISTEN=127.0.0.1:0 -- prefill --model $M
expect 2 "--prefill: 'y' is not HOST:PORT" KVFENCE_PREFILL=y -- decode --model $M $L
expect 2 "--cluster-key /nonexistent/new" KVFENCE_CLUSTER_KEY_FILE=/nonexistent/old KVFENCE_CLUSTER_KEY=/nonexistent/new -- decode --model $M $L
expect 2 "--cluster-key /nonexistent/old" KVFENCE_CLUSTER_KEY_FILE=/nonexistent/old -- decode --model $M $L
expect 2 "--cluster-key /nonexistent/cli" KVFENCE_CLUSTER_KEY=/nonexistent/new -- decode --model $M $L --cluster-key /nonexistent/cli
expect 2 "refusing to listen on 0.0.0.0 without API keys" KVFENCE_HOST=0.0.0.0 -- serve --model $M
expect 1 "/nonexistent/m.gguf" KVFENCE_HOST=0.0.0.0 KVFENCE_NO_AUTH=yes -- serve --model $M
expect 2 "refusing to listen on 0.0.0.0 without API keys" KVFENCE_HOST=10.0.0.1 -- serve --model $M --host 0.0.0.0
expect 2 "refusing to listen on 10.0.0.1 without a cluster key" KVFENCE_LISTEN=10.0.0.1:0 -- decode --model $M
expect 1 "/nonexistent/m.gguf" KVFENCE_INSECURE_FABRIC=1 -- decode --model $M --listen 10.0.0.1:0

# The operator endpoints' rules: no key in both files, no open operator address beyond loopback.
printf 'sk-shared-key-0123 alpha\n' >"$D/tenants" && printf 'sk-shared-key-0123 ops\n' >"$D/admins"
printf 'sk-admin-only-4567 ops\n' >"$D/admins2" && chmod 600 "$D/tenants" "$D/admins" "$D/admins2"
expect 2 "a key of --admin-keys is also a tenant's key in --api-keys" -- serve --model $M --api-keys "$D/tenants" --admin-keys "$D/admins"
expect 2 "a key of --admin-keys is also a tenant's key" KVFENCE_ADMIN_KEYS="$D/admins" -- router --model $M --prefill 127.0.0.1:9 --decode 127.0.0.1:9 --api-keys "$D/tenants"
expect 1 "/nonexistent/m.gguf" -- serve --model $M --api-keys "$D/tenants" --admin-keys "$D/admins2"
expect 2 "refusing to serve the operator endpoints on 0.0.0.0 without admin keys" -- serve --model $M --admin-listen 0.0.0.0:0
expect 1 "/nonexistent/m.gguf" -- serve --model $M --admin-listen 0.0.0.0:0 --admin-keys "$D/admins2"
expect 2 "--admin-listen wants HOST:PORT, not 'nope'" KVFENCE_ADMIN_LISTEN=nope -- serve --model $M

# docs/CLI.md lists every variable a serving command's --help names.
if [ -n "${2:-}" ]; then
    for c in serve router prefill decode; do
        "$K" $c --help | tr -s ' \n' '  ' | grep -o 'env KVFENCE_[A-Z_]*\( or KVFENCE_[A-Z_]*\)\?' |
            grep -o 'KVFENCE_[A-Z_]*' >"$D/vars"
        while read -r v; do
            if grep -q "\`$v\`" "$2"; then echo "ok: $c: $v in $2"; else
                echo "not ok: $c --help names $v; $2 does not"; fails=$((fails + 1)); fi
        done <"$D/vars"
    done
fi

[ "$fails" = 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
