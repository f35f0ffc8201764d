#!/usr/bin/env bash
# Builds kvfence's Debian package from a configured and built tree, with dpkg-deb alone:
#
#   mkdeb.sh BUILD_DIR OUT_DIR      → OUT_DIR/kvfence_VERSION_ARCH.deb (its path on stdout)
#
# The tree's install rules (packaging/CMakeLists.txt) stage the files under the prefix /usr
# (/usr/bin/kvfence, its manual, the systemd units, /etc/default/kvfence, a conffile); the
# version is the binary's own; Depends names the Debian package of every shared library the
# binary loads (ldd, dpkg -S), so a sanitizer build's package depends on the sanitizer runtimes.
# `make deb` gives it a release tree; the `package` test, the test tree.
set -euo pipefail
BUILD="$1"
OUT="$2"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

DESTDIR="$stage" cmake --install "$BUILD" --prefix /usr >/dev/null
bin="$stage/usr/bin/kvfence"
gzip -9n "$stage/usr/share/man/man1/kvfence.1"
install -d -m 0755 "$stage/usr/share/doc/kvfence"
gzip -9nc "$SRC/README.md" >"$stage/usr/share/doc/kvfence/README.md.gz"
chmod 0644 "$stage/usr/share/doc/kvfence/README.md.gz"

version="$("$bin" --version | sed -n 's/^kvfence //p')"
arch="$(dpkg --print-architecture)"
[ -n "$version" ] || { echo "mkdeb: $bin --version printed no version" >&2; exit 1; }

# The package of each library the binary names (NEEDED; ldd finds where it is loaded from). dpkg
# knows a file by the path its package installed it under, /lib or /usr/lib (merged /usr makes
# them one directory).
needed="$(objdump -p "$bin" | awk '$1 == "NEEDED" {print $2}')"
deps=()
while read -r lib; do
    pkg=""
    for p in "$lib" "$(readlink -f "$lib")" "${lib#/usr}" "/usr$lib"; do
        pkg="$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1)" && [ -n "$pkg" ] && break
    done
    [ -n "$pkg" ] || { echo "mkdeb: no Debian package holds $lib" >&2; exit 1; }
    deps+=("$pkg")
done < <(ldd "$bin" | awk -v needed="$needed" 'BEGIN { split(needed, n, "\n"); for (i in n) want[n[i]] = 1 }
                         $2 == "=>" && ($1 in want) && $3 ~ /^\// {print $3}')
[ ${#deps[@]} -gt 0 ] || { echo "mkdeb: found no library that $bin loads" >&2; exit 1; }
depends="$(printf '%s\n' "${deps[@]}" | sort -u | paste -sd, - | sed 's/,/, /g')"

install -d -m 0755 "$stage/DEBIAN"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: kvfence
Version: $version
Architecture: $arch
Maintainer: kvfence <kvfence@localhost>
Section: net
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: $depends
Description: multi-tenant LLM server whose KV pages are free only when nothing can write them
 kvfence serves LLMs (GGUF Llama models, on the CPU) to many tenants through an
 OpenAI-compatible HTTP API, with prefill and decode on separate workers. Every
 prefill-to-decode handoff is checked by token count, trailer tags and checksums
 before decode reads a byte, so no request can read another's KV-cache data.
 .
 The package holds the kvfence binary, its manual, systemd units for the
 one-process server (kvfence.service) and the split roles (kvfence-router,
 kvfence-prefill@PORT, kvfence-decode@PORT), sandboxed, and their settings in
 /etc/default/kvfence.
CONTROL
echo /etc/default/kvfence >"$stage/DEBIAN/conffiles"
# systemd reads new or changed units after a daemon-reload; nothing is enabled or started.
for s in postinst postrm; do
    printf '#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null || true; fi\n' \
        >"$stage/DEBIAN/$s"
    chmod 0755 "$stage/DEBIAN/$s"
done
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles"

mkdir -p "$OUT"
deb="$OUT/kvfence_${version}_${arch}.deb"
# KVF_DEB_COMPRESS: dpkg-deb's compressor (xz, as Debian's own; the test takes gzip, faster).
dpkg-deb --root-owner-group -Z"${KVF_DEB_COMPRESS:-xz}" --build "$stage" "$deb" >/dev/null
echo "$deb"
