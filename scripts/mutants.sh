#!/usr/bin/env bash
# Puts every known bug back, one at a time, and checks that each suite catches it.
#
# For each mutant (see docs/MUTANTS.md): configure an optimised test build with -DKVF_MUTANT=<name>
# in the one tree build-mutants/tree and build its simulator (and, for the isolation column, the
# kvfence binary), copied to build-mutants/<name>/, then
#   - sim: the simulator on the production worker loops (tests/sim/sim_loops.c: the real decode
#     and prefill loops, machines and pools, the tiny model's forward pass, simnet behind the
#     transport seam) with every check (L1..L11), in the world that reaches the mutant's bug
#     ($sim_mode: pressured pools, late writes, the prefills' forgeries); it must FAIL, except
#     for the mutants in $loops_unreached, reported with the reason; the first failing seed and
#     the check are reported;
#   - sim content-only: the same with L1 alone (--content-only: a token or logprob that differs
#     from the request run alone is the only failure it can report), in $content_mode. Every
#     mutant whose bug can put foreign or stale bytes under a committed request
#     ($content_required) must be caught here, and the three in $unverified with decode
#     committing pages unread (--unverified), except where $content_exempt gives the reason the
#     real loops cannot show it by content alone; for the others the column shows what content
#     alone sees. The clean loops must pass in every mode used;
#   - spin: `bash spin/check.sh <name>` when spin/check.sh exists (exit 1 = counterexample
#     found, 0 = verified clean, anything else = tool error), with the property that failed;
#   - spin content-only: `spin/check.sh --content <name>` (P2's check of the bytes alone; the
#     two in $unverified also `--unverified --forge-fenced`), required as the sim's column is,
#     except where $spin_content_exempt gives the reason the model cannot show it;
#   - isolation (KVF_MUTANT_ISOLATION=1; `make mutants` and `make test` set it): the isolation
#     suite's smoke run (tests/isolation/isolation.mjs, docs/ISOLATION.md) against the whole
#     kvfence binary of the mutant build, with `--fail-fast content`: the column names what
#     caught the mutant (a foreign canary, a mismatched response, another request's words in a
#     page; otherwise a crash, the counters, pages that never came back) or says that it
#     survived. Every mutant must be caught on content; the two in $unverified, whose bytes
#     decode's checks of what arrives refuse first, are caught otherwise in the ordinary run
#     (stopped at its first failure) and must be caught on content in the unverified run
#     (`--unverified 1`). KVF_ISO_MUTANTS selects a subset.
# The unmutated simulator (every mode used, every check and content-only), model (every property; P2 alone, unverified, forged fenced DONEs) and binary
# (ordinary and unverified) must pass. Prints a table and exits non-zero if any mutant survives a
# suite that must catch it or a clean run fails.
#
# Environment: KVF_SPIN_VERIFY_CLEAN=1 (make mutants) reruns the exhaustive every-property search
# of the mutants in $spin_verified_clean, which finds nothing by design (about 3 minutes each);
# without it their row takes the recorded result. KVF_LOOPS_SEEDS (seeds per mutant run, default
# 600; a run stops at its first failure), KVF_LOOPS_CLEAN_SEEDS (seeds of each clean mode,
# default 200), KVF_LOOPS_CONTENT_SEEDS (seeds of a content-only run that must catch, default
# 4000), KVF_LOOPS_INFO_SEEDS (seeds of a run shown, not required: a mutant the loops do not
# reach, or a content-only run content need not catch; default 100), JOBS (build parallelism,
# default 1), KVF_MUTANTS (a space-separated subset to run), KVF_MUTANT_ISOLATION=1 (the
# isolation column; each mutant then also builds the kvfence binary, seconds once the tree is
# built, and runs the smoke, seconds to a minute; =only runs that column alone; 0 leaves it
# out), KVF_ISO_MUTANTS
# (the mutants that column runs).
set -uo pipefail
cd "$(dirname "$0")/.."

all=(placeholder_after_reject free_at_cancel free_at_hold_timeout ack_before_drain
     ack_lost_when_cleared no_count_check no_checksum_check stale_epoch_accepted
     src_freed_at_post fence_keeps_other_grants progress_ignored stale_tail_sent fence_without_close)
iso_all="placeholder_after_reject free_at_cancel free_at_hold_timeout ack_before_drain
  no_count_check no_checksum_check stale_epoch_accepted src_freed_at_post fence_keeps_other_grants
  progress_ignored stale_tail_sent fence_without_close"
iso=${KVF_MUTANT_ISOLATION:-0}
only_iso=0
[ "$iso" = only ] && { iso=1; only_iso=1; }
# Mutants the isolation suite does not catch against the real processes, and why (docs/MUTANTS.md,
# "The isolation column"): a survivor listed here is reported with its reason instead of failing
# the run. Remove an entry when the suite learns to catch it.
# None at present: src_freed_at_post and no_count_check, listed here before, are reached now.
declare -A iso_unreachable=()
# Mutants whose bug puts no stale or foreign byte under a completed response while the binary's
# other checks stand, so that the isolation suite can only catch them otherwise (docs/MUTANTS.md,
# "The isolation column"); every other mutant must be caught there on content.
# None at present: stale_tail_sent's foreign tail, never attended, is read by decode's test audit
# (the words of another request in a prompt's unwritten slots); src_freed_at_post and
# fence_keeps_other_grants are caught on content by the unverified run below.
declare -A iso_not_content=(
  [progress_ignored]="a liveness bug: live prompts fail (503 prefill_stalled) and no byte is wrong"
)
# The isolation phase built to show a mutant of that kind (the long-prompt phase: prompts that
# outlive the no-progress bound while their prefill is live).
declare -A iso_phase=([progress_ignored]=long-prompts)
# The sim column (tests/sim/sim_loops.c, every check): the world that reaches each mutant's bug
# (none: the default world of faults).
declare -A sim_mode=(
  [placeholder_after_reject]="--forge every=0,refuse=4"
  [no_count_check]="--forge every=0,short=3,refuse=4"
  [no_checksum_check]="--forge every=4,token=7"
  [stale_epoch_accepted]="--forge every=4,token=7,fenced=1"
  [fence_keeps_other_grants]="--forge every=0,token=7,fenced=1 --pressured"
  [free_at_cancel]="--pressured"
  [src_freed_at_post]="--pressured"
  [free_at_hold_timeout]="--pressured --late-writes"
  [ack_before_drain]="--pressured"
)
# The sim content-only column (L1 alone, --content-only added): the world where content shows it.
declare -A content_mode=(
  [placeholder_after_reject]="--forge every=0,refuse=4 --unverified"
  [no_count_check]="--forge every=0,short=3,refuse=4"
  [no_checksum_check]="--forge every=4,token=7"
  [stale_epoch_accepted]="--forge every=4,token=7,fenced=1"
  [fence_keeps_other_grants]="--forge every=0,token=7,fenced=1 --pressured --unverified"
  [free_at_cancel]="--pressured"
  [src_freed_at_post]="--pressured --unverified"
  [free_at_hold_timeout]="--pressured --late-writes"
  [ack_before_drain]="--pressured"
)
# Mutants the sim column does not reach, and why: reported, not required.
declare -A loops_unreached=(
  [fence_without_close]="the bug is in the fabric's close (src/transport/tcp.c), below the transport seam, where the simulator runs its own transport (simnet); the isolation column catches it"
  [ack_lost_when_cleared]="the production prefill worker clears a request only after its DONE went out (prefill_worker.c, run_actions), never mid-write, so the mutant's clear-mid-write branch is not reached from the real loops, and its other half (a cancel for a cleared request ignored) is harmless there: the DONE sent before that cancel arrived is decode's drain proof. The spin model, whose prefill may clear at any step, catches it"
)
# Content-required mutants the real loops cannot show by content alone, and why (docs/MUTANTS.md):
# their content-only run is reported, not required; the isolation column must catch them on
# content.
declare -A content_exempt=(
  [ack_before_drain]="over the ordered fabric a put posted before the early CANCEL_ACK is applied before decode reads that ack; the isolation column's catch is a put posted after the ack by a chunk that was still on the compute thread, which the loops' manual mode (compute within the loop's own turn) does not make; not shown by content alone in 15,000 seeds (pressured, with and without late writes); the sim column catches the early release otherwise (L3: the prefill's source pages never come back)"
)
loops_seeds=${KVF_LOOPS_SEEDS:-600}
loops_clean_seeds=${KVF_LOOPS_CLEAN_SEEDS:-200}
loops_info_seeds=${KVF_LOOPS_INFO_SEEDS:-100} # shown, not required: fewer seeds
# The content-only runs that must catch: L1 alone is fast (over 100 seeds/s optimised) and some
# bugs need many seeds to put a late write under a running request (free_at_hold_timeout).
loops_content_seeds=${KVF_LOOPS_CONTENT_SEEDS:-4000}
# Mutants the spin model cannot express, and why: it is reported, not run.
declare -A no_model=(
  [stale_tail_sent]="the bug is in the prefill engine's page copy (prefill_worker.c), below the machines the model holds; the sim column's L5 and the isolation column catch it"
  [fence_without_close]="the bug is in the fabric's close (tcp.c); the model's fence is a close by definition; the isolation column and test_transport_fence catch it"
  [progress_ignored]="the model keeps no clock: its timeouts fire at any time, so a deadline that PROGRESS does not renew adds no behaviour"
)
# Mutants whose stale or foreign bytes decode's checks of what arrives (trailer, checksum, tail)
# refuse before anything reads them: src_freed_at_post (the puts read freed source pages, and
# the checksum taken before the post refuses them) and fence_keeps_other_grants (a fenced epoch's
# DONE commits a kept grant whose writes the fence cut off; its pages fail the check). Each
# content suite catches them with those checks off and the clean code passing so ("unverified":
# test_sim_loops --unverified, spin/check.sh --unverified, isolation.mjs --unverified 1): the page
# lifetime rules alone must keep the bytes right, and these bugs break them. In the isolation
# column the ordinary run must catch them too (otherwise than on content).
# placeholder_after_reject restores the prefill half of the placeholder incident alone (one bug
# per mutant): decode's count check, standing, refuses the placeholder's DONE (its decode half is
# no_count_check), so only the unverified runs, which check no count, can show it on content.
unverified=" src_freed_at_post fence_keeps_other_grants placeholder_after_reject "
# Of those, the ones whose ordinary isolation run may pass, and why: the check that stops the bug
# fails the request with an error the suite's faulted phases allow.
declare -A iso_ordinary_may_pass=(
  [placeholder_after_reject]="decode's count check refuses the placeholder's DONE: the request fails with 502 kv_verification_failed, an error the phases with refusals allow"
)
# Mutants the spin model verifies clean with every property, and why; their spin content-only
# run (unverified) must catch them.
declare -A spin_verified_clean=(
  [placeholder_after_reject]="decode's count check refuses the placeholder's DONE, so no property breaks; unverified (no count check), P2 does"
)
read -r -a iso_mutants <<< "$(echo ${KVF_ISO_MUTANTS:-$iso_all})"
iso_wanted=" ${iso_mutants[*]} "
node_bin=$(command -v node || echo node)
# Bugs that put stale or foreign bytes under a committed request: content alone must see them.
content_required=" free_at_cancel free_at_hold_timeout ack_before_drain
  no_count_check no_checksum_check stale_epoch_accepted "
content_required=" $(echo $content_required) " # one space between names: matched as *" name "*
# The model cannot show this one on content, and why (docs/MUTANTS.md): its spin content-only run
# is reported, not required.
declare -A spin_content_exempt=(
  [ack_before_drain]="the model's one source buffer serves one request at a time and is kept until its writes landed, so a late write carries its own request's bytes and lands before the page's next owner's own write; P1 catches it"
)
if [ -n "${KVF_MUTANTS:-}" ]; then
  read -r -a mutants <<< "$KVF_MUTANTS"
elif [ "$iso" = 1 ]; then
  mutants=("${all[@]}")
else
  mutants=("${all[@]}") # without the isolation column: the binary-only two for the loops column
fi
jobs=${JOBS:-1}
have_model=0
[ -f spin/check.sh ] && have_model=1
status=0

# One build tree serves every mutant in turn: a mutant's switch is defined only for the files that
# test it (CMakeLists.txt), so with Ninja, which rebuilds exactly the objects whose command line
# changed, moving from one mutant to the next recompiles two or three files. Each mutant's
# binaries are copied out to build-mutants/<name>/.
tree=build-mutants/tree
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ -f "$tree/CMakeCache.txt" ] &&
   ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}\$" "$tree/CMakeCache.txt"; then
  rm -rf "$tree"
fi

build() { # name (empty = clean) [with_kvfence] -> path of test_sim_loops, or nothing on a build failure
  local name=$1 out=build-mutants/${1:-clean} targets=(test_sim_loops)
  [ "${2:-0}" = 1 ] && targets+=(kvfence)
  mkdir -p "$out"
  rm -f "$out/test_sim" "$out/test_sim_loops" "$out/kvfence"
  if ! cmake "${generator[@]}" -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DKVF_TEST_BUILD=ON \
        -DKVF_SANITIZE=OFF -DKVF_BUILD_TESTS=ON -DKVF_MUTANT="$name" > "$out.log" 2>&1 ||
     ! cmake --build "$tree" --target "${targets[@]}" -j "$jobs" >> "$out.log" 2>&1; then
    return 1
  fi
  cp "$tree/tests/sim/test_sim_loops" "$out/test_sim_loops" || return 1
  if [ "${2:-0}" = 1 ]; then cp "$tree/kvfence" "$out/kvfence" || return 1; fi
  echo "$out/test_sim_loops"
}

loops() { # binary count log [options] -> "caught seed N (Lk: what)" / "survived" / "error"; log kept
  local bin=$1 count=$2 log=$3
  shift 3
  "$bin" --seeds "$count" "$@" > "$log" 2>/dev/null
  local rc=$?
  local line
  line=$(grep -m1 -E '^VIOLATION( at seed [0-9]+:)?( at [0-9]+ ms:)? L[0-9]+' "$log")
  if [[ $line =~ ^VIOLATION\ at\ seed\ ([0-9]+):\ (at\ [0-9]+\ ms:\ )?(L[0-9]+) ]]; then
    echo "caught seed ${BASH_REMATCH[1]} (${BASH_REMATCH[3]})"
  elif [[ $line =~ ^VIOLATION\ (L[0-9]+) ]]; then
    echo "caught (${BASH_REMATCH[1]}, over the run)"
  elif [ $rc -eq 0 ]; then echo "survived"; else echo "error rc=$rc ($log)"; fi
}

isolation() { # name (empty = clean) [unverified] -> "caught on content: <what>" / "caught not on content: <what>" / "survived" / "error"
  local dir=build-mutants/${1:-clean} tag=iso extra=(--fail-fast content)
  [ "${2:-0}" = 1 ] && { tag=iso-unverified; extra+=(--unverified 1); }
  # The ordinary run of a mutant the unverified run is for stops at its first failure: its bug
  # cannot reach a reply there, and going on in search of one costs minutes (two 30 s hangs).
  [ "${2:-0}" = 0 ] && [ -n "$1" ] && [[ $unverified == *" $1 "* ]] && extra=(--fail-fast 1)
  # A mutant that cannot show on content runs the phase built to show it, to its first failure
  # (the clean binary runs every phase, that one included).
  [ -n "$1" ] && [ -n "${iso_phase[$1]:-}" ] && extra=(--fail-fast 1 --phases "${iso_phase[$1]}")
  local out=build-mutants/${1:-clean}.$tag
  rm -f "$out.json"
  "$node_bin" tests/isolation/isolation.mjs --kvfence "$dir/kvfence" --node-modules build-node/node_modules \
    --work "$out" --report "$out.json" "${extra[@]}" > "$out.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "survived"; return; fi
  if [ ! -f "$out.json" ]; then echo "error rc=$rc ($out.log)"; return; fi
  # What caught it: the first failed check, shortened.
  local what
  # On content (a mismatched response or a foreign canary) wherever a phase showed one; else the
  # first failure, marked as not on content.
  what=$("$node_bin" -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); const c=r.first_content_failure, f=r.first_failure; const s=(x)=>`${x.kind}: ${x.detail.replace(/\s+/g," ").slice(0,150)}`; console.log(c ? `on content: ${s(c)}` : f ? (f.kind === "harness" || f.kind === "setup" ? s(f) : `not on content: ${s(f)}`) : "?")' "$out.json")
  # Only an explicit verdict counts: an unreadable report, or one naming no failure while the
  # suite exited non-zero, is an error (never "caught").
  case $what in
    "on content: "*|"not on content: "*) echo "caught $what" ;;
    harness*|setup*) echo "error: $what ($out.log)" ;;
    *) echo "error: the report names no failure (rc=$rc, $out.json)" ;;
  esac
}

spin() { # name [check.sh options] -> "caught <trail> (<property>)" / "survived" / "error" / "-"
  if [ $have_model -eq 0 ]; then echo "-"; return; fi
  local name=$1
  shift
  local log=build-mutants/${name:-clean}.spin$(printf '%s' "$*" | tr -d ' ').log
  bash spin/check.sh "$@" ${name:+"$name"} > "$log" 2>&1
  local rc=$?
  case $rc in
    1) local trail prop
       trail=$(grep -m1 -oE '[^ ]+\.trail' "$log" | head -1 || true)
       # The property whose assertion failed, from the expression pan printed.
       prop=$(grep -m1 'counterexample:' "$log")
       case $prop in
         *"assertion violated ((cq["*) prop="P2: bytes not written for the reader" ;;
         *"assertion violated (sdata=="*) prop="P4: another request's bytes in a put" ;;
         *"assertion violated ((dep["*"==depoch)"*|*"assertion violated (dep["*) prop="P3: a commit from a fenced epoch" ;;
         *"assertion violated"*) prop="P1: a page reassigned under a write" ;;
         *) prop="not an assertion: ${prop#*counterexample: }" ;;
       esac
       echo "caught ${trail:-counterexample} ($prop)" ;;
    0) echo "survived" ;;
    *) echo "error rc=$rc" ;;
  esac
}

mkdir -p build-mutants
rows=()
t0=$(date +%s)

bin=$(build "" "$iso") || { echo "mutants: the clean build failed; see build-mutants/clean.log"; exit 2; }
clean_sim="not run" clean_content="not run" clean_spin="not run" clean_spin_content="not run"
if [ $only_iso -eq 0 ]; then
  clean_spin=$(spin "")
  clean_spin_content=$(spin "" --content --unverified --forge-fenced)
  case $clean_spin in survived|-) ;; *) status=1 ;; esac
  case $clean_spin_content in survived|-) ;; *) status=1 ;; esac
  clean_spin_content="${clean_spin_content/survived/passed} (P2 alone, unverified, forged fenced DONEs)"
  # The clean loops, in every mode the table uses (each distinct mode once): every check in the
  # sim column's modes, L1 alone in the content column's.
  clean_sim="passed" clean_content="passed"
  declare -A seen_mode=()
  n_sim=0 n_content=0
  for mode in "" "${sim_mode[@]}"; do
    [[ -n ${seen_mode["s$mode"]:-} ]] && continue
    seen_mode["s$mode"]=1
    n_sim=$((n_sim + 1))
    # shellcheck disable=SC2086
    r=$(loops "$bin" "$loops_clean_seeds" "build-mutants/clean.sim$n_sim.log" $mode)
    if [ "$r" != survived ]; then status=1; clean_sim="FAILED in '${mode:-the default world}': $r"; fi
  done
  for mode in "${content_mode[@]}"; do
    [[ -n ${seen_mode["c$mode"]:-} ]] && continue
    seen_mode["c$mode"]=1
    n_content=$((n_content + 1))
    # shellcheck disable=SC2086
    r=$(loops "$bin" "$loops_clean_seeds" "build-mutants/clean.content$n_content.log" $mode --content-only)
    if [ "$r" != survived ]; then status=1; clean_content="FAILED in '$mode': $r"; fi
  done
  [ "$clean_sim" = passed ] && clean_sim="passed ($n_sim modes, $loops_clean_seeds seeds each)"
  [ "$clean_content" = passed ] && clean_content="passed ($n_content modes, $loops_clean_seeds seeds each)"
fi
clean_iso="-"
if [ "$iso" = 1 ]; then
  clean_iso=$(isolation "")
  [ "$clean_iso" = survived ] || status=1
  need_unverified=0
  for m in "${iso_mutants[@]}"; do [[ $unverified == *" $m "* ]] && need_unverified=1; done
  if [ $need_unverified = 1 ]; then
    clean_unv=$(isolation "" 1)
    [ "$clean_unv" = survived ] || status=1
    clean_iso="$clean_iso; unverified: $clean_unv"
  fi
fi
rows+=("(none: clean) | $clean_sim | $clean_content | ${clean_spin/survived/passed} | $clean_spin_content | ${clean_iso//survived/passed}")

for m in "${mutants[@]}"; do
  want_iso=0
  [ "$iso" = 1 ] && [[ $iso_wanted == *" $m "* ]] && want_iso=1
  if ! bin=$(build "$m" $want_iso); then
    rows+=("$m | build failed (build-mutants/$m.log) | - | - | - | -")
    status=1
    continue
  fi
  i="-"
  if [ $want_iso = 1 ]; then
    i=$(isolation "$m")
    if [[ $i == survived ]] && [[ -n ${iso_ordinary_may_pass[$m]:-} ]]; then
      u=$(isolation "$m" 1)
      i="passed (${iso_ordinary_may_pass[$m]}); unverified: $u"
      [[ $u == "caught on content"* ]] || status=1
    elif [[ $i == survived ]] && [[ -n ${iso_unreachable[$m]:-} ]]; then
      i="not caught: ${iso_unreachable[$m]}"
    elif [[ $i != caught* ]]; then
      status=1
    elif [[ $i == "caught not on content"* ]]; then
      if [[ $unverified == *" $m "* ]]; then
        u=$(isolation "$m" 1)
        i="$i; unverified: $u"
        [[ $u == "caught on content"* ]] || status=1
      elif [[ -n ${iso_not_content[$m]:-} ]]; then
        i="$i (cannot show on content: ${iso_not_content[$m]})"
      else
        status=1
      fi
    fi
  fi
  if [ $only_iso -eq 1 ]; then
    rows+=("$m | not run | not run | not run | not run | $i")
    continue
  fi
  # sim: every check, in the world that reaches the bug.
  mode=${sim_mode[$m]:-}
  n_loops=$loops_seeds
  [[ -n ${loops_unreached[$m]:-} ]] && n_loops=$loops_info_seeds
  # shellcheck disable=SC2086
  sres=$(loops "$bin" "$n_loops" "build-mutants/$m.sim.log" $mode)
  if [[ $sres == survived ]] && [[ -n ${loops_unreached[$m]:-} ]]; then
    sres="not caught: ${loops_unreached[$m]}"
  elif [[ $sres != caught* ]]; then
    status=1
  fi
  [ -n "$mode" ] && sres="$sres [$mode]"
  # sim content-only: L1 alone.
  cmode=${content_mode[$m]:-$mode}
  if [[ $content_required == *" $m "* || $unverified == *" $m "* ]]; then
    # An exempt one is shown on the fewer seeds (its reason says why content cannot show it).
    n_content=$loops_content_seeds
    [[ -n ${content_exempt[$m]:-} ]] && n_content=$loops_info_seeds
    # shellcheck disable=SC2086
    c=$(loops "$bin" "$n_content" "build-mutants/$m.content.log" $cmode --content-only)
    if [[ $c == survived ]] && [[ -n ${content_exempt[$m]:-} ]]; then
      c="not caught: ${content_exempt[$m]}"
    elif [[ $c != "caught seed "*"(L1)" ]]; then
      status=1
    fi
  else
    # Shown for information only: fewer seeds.
    # shellcheck disable=SC2086
    c=$(loops "$bin" "$loops_info_seeds" "build-mutants/$m.content.log" $cmode --content-only)
    [[ $c == error* ]] && status=1
    [[ $c == survived ]] && c="not caught (not a content bug, or not one the loops reach: see docs/MUTANTS.md)"
    [[ -n ${loops_unreached[$m]:-} ]] && c="- (not reached: see the sim column)"
  fi
  [ -n "$cmode" ] && c="$c [$cmode]"
  if [[ -n ${no_model[$m]:-} ]]; then
    p="- (${no_model[$m]})"
  elif [[ -n ${spin_verified_clean[$m]:-} ]] && [ "${KVF_SPIN_VERIFY_CLEAN:-0}" != 1 ]; then
    # An exhaustive search that finds nothing (about 3 minutes and 3.6 GB): make mutants runs it
    # (KVF_SPIN_VERIFY_CLEAN=1); make test's run takes the recorded result (docs/SPIN.md).
    p="verified clean (recorded, not rerun here; make mutants reruns it): ${spin_verified_clean[$m]}"
  else
    p=$(spin "$m")
  fi
  if [[ $content_required == *" $m "* ]]; then
    pc=$(spin "$m" --content)
    if [[ $pc == survived ]] && [[ -n ${spin_content_exempt[$m]:-} ]]; then
      pc="not caught: ${spin_content_exempt[$m]}"
    else
      [[ $pc == caught*"(P2: "* ]] || [ "$pc" = - ] || status=1
    fi
  elif [[ $unverified == *" $m "* ]]; then
    pc=$(spin "$m" --content --unverified --forge-fenced)
    [[ $pc == caught*"(P2: "* ]] || [ "$pc" = - ] || status=1
    pc="$pc, unverified"
  else
    if [[ -n ${no_model[$m]:-} ]]; then pc="-"; else pc=$(spin "$m" --content); fi
    [[ $pc == error* ]] && status=1
    [[ $pc == survived ]] && pc="not caught (not a content bug: see docs/MUTANTS.md)"
  fi
  if [[ $p == survived ]] && [[ -n ${spin_verified_clean[$m]:-} ]]; then
    p="verified clean: ${spin_verified_clean[$m]}"
  fi
  case $p in caught*|-|"- ("*|"verified clean"*) ;; *) status=1 ;; esac
  rows+=("$m | $sres | $c | $p | $pc | $i")
done

echo
echo "mutant | sim (the production loops) | sim content-only | spin | spin content-only | isolation"
echo "--- | --- | --- | --- | --- | ---"
printf '%s\n' "${rows[@]}"
echo
[ $have_model -eq 1 ] || echo "mutants: spin/check.sh is not in this tree: the spin column is not run"
[ "$iso" = 1 ] || echo "mutants: the isolation column is not run (KVF_MUTANT_ISOLATION=1, or make mutants, runs it)"
echo "mutants: $(( $(date +%s) - t0 )) s; $([ $status -eq 0 ] && echo 'every mutant caught by every suite, clean runs pass' || echo 'FAILED: a mutant survived or a clean run failed')"
exit $status
