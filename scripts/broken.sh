#!/usr/bin/env bash
# The broken servers (docs/MUTANTS.md, "Broken servers"): two test builds that do not work —
# broken_503 answers every generation request 503 pool_exhausted, ignore_cancel never acts on a
# client's disconnect — run against every suite that claims to check what they break. Each such
# suite must fail; a suite that passes a broken server proves nothing about a working one.
#
#   broken_503:    isolation (smoke), serve_e2e, serve_tenants_e2e, split_e2e, fabric_e2e, long_e2e
#   ignore_cancel: serve_e2e (cancellation: tokens decoded after the disconnect), long_e2e (a
#                  client that disconnects while its long prompt is computed)
#
# Builds each in build-broken/tree (an optimised test build, -DKVF_MUTANT=<name>, the kvfence
# target alone), copied to build-broken/<name>/kvfence; each suite's output goes to
# build-broken/<name>.<suite>.log. Needs the ASan tree's tokref (make asan) and node with
# build-node/ (scripts/install-deps.sh). Prints a table; exits 1 if a broken server passes a
# suite, 2 on a build failure. KVF_BROKEN="name ..." and KVF_BROKEN_SUITES="suite ..." select.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A suites=(
  [broken_503]="isolation serve_e2e serve_tenants_e2e split_e2e fabric_e2e long_e2e"
  [ignore_cancel]="serve_e2e long_e2e"
)
names=(${KVF_BROKEN:-broken_503 ignore_cancel})
jobs=${JOBS:-2}
tree=build-broken/tree
node_bin=$(command -v node || echo node)
tokref=build-asan/tests/text/tokref
[ -x "$tokref" ] || tokref=$(find build-asan -name tokref -type f -perm -u+x 2>/dev/null | head -1)
[ -n "$tokref" ] || { echo "broken: no tokref in build-asan (make asan first)"; exit 2; }
modules=build-node/node_modules
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p build-broken

run_suite() { # name suite -> exit status of the suite
  local name=$1 suite=$2 kvf=build-broken/$1/kvfence w=build-broken/$1.$2
  local log=$w.log
  rm -rf "$w"
  case $suite in
    isolation) "$node_bin" tests/isolation/isolation.mjs --kvfence "$kvf" --node-modules "$modules" --work "$w" \
                 --report "$w.json" ;;
    serve_e2e) "$node_bin" tests/e2e/serve_e2e.mjs --kvfence "$kvf" --tokref "$tokref" --node-modules "$modules" \
                 --work "$w" --readme README.md ;;
    serve_tenants_e2e) "$node_bin" tests/e2e/serve_tenants_e2e.mjs --kvfence "$kvf" --node-modules "$modules" --work "$w" ;;
    split_e2e) "$node_bin" tests/e2e/split_e2e.mjs --kvfence "$kvf" --node-modules "$modules" --work "$w" --readme README.md ;;
    fabric_e2e) "$node_bin" tests/e2e/fabric_e2e.mjs --kvfence "$kvf" --work "$w" ;;
    long_e2e) "$node_bin" tests/e2e/long_e2e.mjs --kvfence "$kvf" --test-kvfence "$kvf" --work "$w" ;;
    *) echo "unknown suite $suite"; return 2 ;;
  esac > "$log" 2>&1
}

# The first failed check a suite printed (TAP "not ok" or a "# FAILED" line), shortened; for
# the isolation suite (run through, not stopped at its first failure), how many phases' floors
# failed first.
first_failure() {
  local floors
  floors=$(grep -E '^not ok - below the floor: ' "$1" | sed -E 's/^not ok - below the floor: ([^:]+):.*/\1/' | sort -u | wc -l)
  [ "$floors" -gt 0 ] && printf 'below the floor in %s phases; ' "$floors"
  grep -m1 -E '^(not ok|# FAILED|Bail out!)' "$1" | cut -c1-150
}

bad=0
rows=()
t0=$(date +%s)
for name in "${names[@]}"; do
  [ -n "${suites[$name]:-}" ] || { echo "broken: unknown broken server $name"; exit 2; }
  mkdir -p "build-broken/$name"
  if ! cmake "${generator[@]}" -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DKVF_TEST_BUILD=ON \
        -DKVF_SANITIZE=OFF -DKVF_BUILD_TESTS=OFF -DKVF_MUTANT="$name" > "build-broken/$name.build.log" 2>&1 ||
     ! cmake --build "$tree" --target kvfence -j "$jobs" >> "build-broken/$name.build.log" 2>&1 ||
     ! cp "$tree/kvfence" "build-broken/$name/kvfence"; then
    echo "broken: the build of $name failed; see build-broken/$name.build.log"
    exit 2
  fi
  for suite in ${KVF_BROKEN_SUITES:-${suites[$name]}}; do
    [[ " ${suites[$name]} " == *" $suite "* ]] || continue
    s0=$(date +%s)
    run_suite "$name" "$suite"
    rc=$?
    secs=$(( $(date +%s) - s0 ))
    if [ $rc -eq 0 ]; then
      verdict="PASSED (a broken server passed it)"
      bad=1
    else
      verdict="failed (rc $rc): $(first_failure "build-broken/$name.$suite.log")"
    fi
    rows+=("| $name | $suite | ${secs} s | $verdict |")
    echo "# $name × $suite: $verdict (${secs} s)"
  done
done
echo
echo "| broken server | suite | time | verdict |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
echo "# $(( $(date +%s) - t0 )) s"
[ $bad -eq 0 ] && echo "broken: every suite failed every broken server it claims to check" || echo "broken: a broken server passed a suite"
exit $bad
