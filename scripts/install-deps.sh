#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages kvfence builds, tests and runs with — only those
# that are missing. Idempotent: a second run installs nothing and says so. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential   # gcc, make
  cmake             # >= 3.25 (Debian 12 ships 3.25.1)
  pkg-config
  clang             # libFuzzer targets
  libclang-rt-14-dev # ASan/UBSan/libFuzzer runtimes for clang
  libucx-dev        # transport: UCX active messages and one-sided puts
  ucx-utils         # ucx_info, ucx_perftest
  libmicrohttpd-dev # HTTP server
  libjansson-dev    # JSON
  libxxhash-dev     # XXH3 page checksums
  spin              # the Promela model checker for model/handoff.pml
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

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
echo "install-deps: done"
