#!/usr/bin/env bash
# spin/check.sh [--content] [--unverified] [--forge-fenced] [MUTANT] — exhaustive spin
# verification of spin/handoff.pml.
#
# With no argument the clean model is checked; with a mutant name (e.g. free_at_cancel, in any
# case) the model is built with -DMUTANT_<NAME>. --content asserts P2 alone (-DCONTENT_ONLY: a
# committed request reads only bytes written for it); --unverified has decode commit the pages
# unread and no put lost after it reported complete (-DUNVERIFIED; handoff.pml says what each
# means); --forge-fenced lets forged DONEs of the fenced epoch arrive (-DFORGE_FENCED). The
# search is exhaustive: safety only, exact
# state compression (COLLAPSE), no bitstate and no hash-compact, so "0 errors" is a proof for the
# configuration in the model.
#
# Exit status (scripts/mutants.sh relies on it):
#   0  zero errors and the search was complete;
#   1  a counterexample was found (the trail is kept, its path and an excerpt are printed);
#   2  anything else: unknown mutant, tool error, or an incomplete search.
#
# Environment: KVF_SPIN_KEEP_TRAIL=DIR copies the trail and model there (default: the trail is
# copied to $TMPDIR or /tmp as handoff-<mutant>.trail); KVF_SPIN_DEPTH overrides the depth bound.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="$here/handoff.pml"
mutants="placeholder_after_reject free_at_cancel free_at_hold_timeout ack_before_drain
ack_lost_when_cleared no_count_check no_checksum_check stale_epoch_accepted src_freed_at_post
fence_keeps_other_grants"

usage() {
    echo "usage: spin/check.sh [--content] [--unverified] [--forge-fenced] [MUTANT]" >&2
    echo "mutants: $(echo $mutants)" >&2
}

mutant=""
define=""
modes=""
suffix=""
while [ $# -gt 0 ]; do
    case "$1" in
        --content) modes="$modes -DCONTENT_ONLY"; suffix="$suffix-content"; shift ;;
        --unverified) modes="$modes -DUNVERIFIED"; suffix="$suffix-unverified"; shift ;;
        --forge-fenced) modes="$modes -DFORGE_FENCED"; suffix="$suffix-forged"; shift ;;
        *) break ;;
    esac
done
if [ $# -gt 1 ]; then usage; exit 2; fi
if [ $# -eq 1 ]; then
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --list) echo $mutants | tr ' ' '\n'; exit 0 ;;
    esac
    mutant="$(echo "$1" | tr 'A-Z' 'a-z')"
    mutant="${mutant#mutant_}"
    if ! echo $mutants | tr ' ' '\n' | grep -qx -- "$mutant"; then
        echo "check.sh: unknown mutant '$1'" >&2
        usage
        exit 2
    fi
    define="-DMUTANT_$(echo "$mutant" | tr 'a-z' 'A-Z')"
fi
label="${mutant:-clean}$suffix"
define="$define$modes"

for tool in spin gcc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "check.sh: $tool not found" >&2
        exit 2
    fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/kvf-model.XXXXXX")" || exit 2
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/handoff.pml" || exit 2
cd "$work" || exit 2

depth="${KVF_SPIN_DEPTH:-100000}"
start=$(date +%s.%N)
# shellcheck disable=SC2086
if ! spin -a $define handoff.pml >spin.log 2>&1; then
    echo "check.sh: spin -a failed" >&2
    cat spin.log >&2
    exit 2
fi
if ! gcc -O2 -w -DSAFETY -DCOLLAPSE -DVECTORSZ=1024 -DMEMLIM=4096 -o pan pan.c >gcc.log 2>&1; then
    echo "check.sh: compiling pan failed" >&2
    cat gcc.log >&2
    exit 2
fi
./pan -m"$depth" -w22 >pan.out 2>&1
pan_rc=$?
end=$(date +%s.%N)

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | tail -1)
stored=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.out | tail -1)
matched=$(sed -n 's/^ *\([0-9.e+]*\) states, matched.*/\1/p' pan.out | tail -1)
trans=$(sed -n 's/^ *\([0-9.e+]*\) transitions.*/\1/p' pan.out | tail -1)
reached=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' pan.out | tail -1)
mem=$(sed -n 's/^ *\([0-9.]*\).total actual memory usage.*/\1/p' pan.out | tail -1)
panel=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' pan.out | tail -1)
wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')

echo "model: $label (handoff.pml, 2 requests x 3 pages x 1 prefill x 1 decode, 1 fence${modes:+;$modes})"
echo "  states stored: ${stored:-?}  matched: ${matched:-?}  transitions: ${trans:-?}"
echo "  depth reached: ${reached:-?} (bound $depth)  memory: ${mem:-?} MB"
echo "  time: pan ${panel:-?} s, total ${wall} s (spin + gcc + pan)"
echo "  errors: ${errors:-?}"

if [ -z "$errors" ]; then
    echo "check.sh: could not read pan's result (pan exit $pan_rc)" >&2
    tail -20 pan.out >&2
    exit 2
fi

if [ "$errors" -gt 0 ]; then
    trail="handoff.pml.trail"
    if [ ! -f "$trail" ]; then
        echo "check.sh: pan reported errors but wrote no trail" >&2
        exit 2
    fi
    keep="${KVF_SPIN_KEEP_TRAIL:-${TMPDIR:-/tmp}}"
    mkdir -p "$keep" 2>/dev/null
    dest="$keep/handoff-$label.trail"
    cp "$trail" "$dest" && cp handoff.pml "$keep/handoff-$label.pml"
    violation=$(grep -m1 -E "assertion violated|invalid end state|violated" pan.out)
    echo "  counterexample: ${violation:-see trail}"
    echo "  trail: $dest (replay: cd $keep && cp handoff-$label.trail handoff-$label.pml.trail &&"
    echo "         spin -t -p $define handoff-$label.pml)"
    echo "  --- spin -t -p (last steps) ---"
    # shellcheck disable=SC2086
    spin -t -p $define handoff.pml 2>&1 | grep -E '^ *[0-9]+:\s+proc|assert|violated' \
        | grep -v -E 'proc  0 \(:init:|\[\(1\)\]|\[\.\(goto\)\]|\[IF\]|\[else\]|end state' \
        | tail -14 | sed 's/^/  /'
    echo "  --- state at the violation (spin -t -g) ---"
    # shellcheck disable=SC2086
    spin -t -g $define handoff.pml 2>&1 \
        | grep -E '^\s+(depoch|(dst|dep|pst|pep|pgst|pgown|pgep|cq|ce)\[[0-9]+\]) = ' \
        | sed -e 's/^\s*//' -e 's/ = /=/' | paste -sd' ' | fold -s -w 96 | sed 's/^/  /'
    exit 1
fi

if grep -q "max search depth too small" pan.out; then
    echo "check.sh: search truncated (max search depth too small); raise KVF_SPIN_DEPTH" >&2
    exit 2
fi
if grep -qE "Search not completed|out of memory|pan: reached -DMEMLIM" pan.out; then
    echo "check.sh: search incomplete" >&2
    tail -5 pan.out >&2
    exit 2
fi
if [ "$pan_rc" -ne 0 ]; then
    echo "check.sh: pan exited with $pan_rc" >&2
    exit 2
fi
echo "  result: verified, complete exhaustive search"
exit 0
