#!/usr/bin/env bash
# scripts/doclinks.sh [ROOT] — every link to a file in the tree's documents points to a file
# that exists.
#
# Checked: each relative Markdown link `[text](path)` in a *.md file (resolved from that file's
# directory; web addresses and in-page anchors are skipped, a `#fragment` is dropped), and each
# `docs/<name>.md` named anywhere in the sources, scripts and docs (comments cite the docs by
# path). Build directories and node_modules are not read. Runs in well under a second.
#
# Exit status: 0 when every target exists; 1 with one line per missing target otherwise.
set -u

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root" || exit 2

files() { # $1: a find -name pattern
    find . \( -name 'build*' -o -name node_modules -o -name .git -o -name Testing \) -prune \
        -o -type f -name "$1" -print
}

bad=0
while IFS= read -r md; do
    dir="$(dirname "$md")"
    # One link target a line: the part between "](" and the next ")".
    while IFS= read -r target; do
        target="${target%%#*}"
        target="${target%% *}"
        case "$target" in
            '' | http://* | https://* | mailto:*) continue ;;
        esac
        if [ ! -e "$dir/$target" ]; then
            echo "doclinks: $md: link to a missing file: $target"
            bad=1
        fi
    done < <(grep -o '\](\([^)]*\))' "$md" | sed 's/^](//; s/)$//')
done < <(files '*.md')

while IFS=: read -r file line name; do
    if [ ! -e "$name" ]; then
        echo "doclinks: ${file#./}:$line: names a missing file: $name"
        bad=1
    fi
done < <(files '*' | grep -E '\.(c|h|md|sh|txt|mjs|pml|json)$|/Makefile$|CMakeLists' |
    xargs grep -noE 'docs/[A-Za-z0-9_]+\.md' /dev/null | grep -v '^/dev/null')

exit $bad
