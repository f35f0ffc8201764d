# kvfence — a thin wrapper over CMake presets (CMakePresets.json).
#   make          dependencies + release build (binary at build/kvfence)
#   make serve    the release build, then `build/kvfence serve` (the README's curl examples)
#   make test     dependencies + the formatting check (format-check) + ASan/UBSan test build + every CTest test (among them `mutants`:
#                 the whole mutant table, the isolation column included; `release_kvfence`
#                 builds the release binary long_e2e's long prompts run on)
#   make mutants  every mutant (a known bug put back) against every suite; fails if one survives
#                 (the isolation column builds each mutant's kvfence binary: KVF_ISO_MUTANTS
#                 narrows it, KVF_MUTANT_ISOLATION=0 leaves it out)
#   make isolation  the isolation suite's long run (tests/isolation, docs/ISOLATION.md), alone
#   make fuzz     the libFuzzer targets for a bounded time (FUZZ_SECONDS each, default 60)
#   make soak     long randomized runs, outside `make test`
#   make long     long_e2e with the llama3.2-1b shape's 4,000-token prompt (outside make test)
#   make bench-split  the serve bench against the split roles (router, prefill and decode
#                 processes sharing the cores through --compute-lock) and `kvfence serve`, in
#                 alternation; prints the ratio
#   make install  the release binary, its manual page (from its --help), the systemd units of
#                 serve, router, prefill@ and decode@ and /etc/default/kvfence, under PREFIX
#                 (default /usr/local; the units and environment file name that prefix's paths)
#                 and DESTDIR (a staging root, empty by default)
#   make deb      build-deb/kvfence_VERSION_ARCH.deb with dpkg-deb (packaging/mkdeb.sh): the
#                 same files under /usr, /etc/default/kvfence a conffile
#   make bench-overhead  the serve bench against build/kvfence and a comparison binary with the
#                 page checksums, trailer and reader checks compiled out (build-nochecks/, never
#                 installed), in alternation; prints the ratio
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
DESTDIR ?=
FUZZ_SECONDS ?= 60

.PHONY: all deps build release release-kvfence debug asan test long mutants broken isolation canary-mutant fuzz soak bench-overhead bench-split format format-check clean install deb

all: deps release

deps:
	@bash scripts/install-deps.sh

release:
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

build: release

# The release binary alone (long_e2e's long prompts run on it).
release-kvfence:
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target kvfence

# The binary and what installs with it (packaging/CMakeLists.txt): cmake --install writes the
# prefix's own paths into the units and the environment file at install time.
install: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target kvfence kvfence_man
	DESTDIR="$(DESTDIR)" cmake --install build --prefix "$(PREFIX)"

# A release tree of its own without the tests (only the binary and its manual are built).
deb: deps
	cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=Release -DKVF_BUILD_TESTS=OFF >/dev/null
	cmake --build build-deb -j $(JOBS) --target kvfence kvfence_man
	bash packaging/mkdeb.sh build-deb build-deb

# Serves the readable test model on http://127.0.0.1:8080 (README.md, "Serving"); SERVE_ARGS adds
# options, e.g. make serve SERVE_ARGS="--port 9000".
serve: deps release
	build/kvfence serve $(SERVE_ARGS)

debug:
	cmake --preset debug >/dev/null
	cmake --build --preset debug -j $(JOBS)

asan:
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)

# The test suite: every CTest test of the ASan/UBSan build (unit, sim, model, mutants, fuzz corpus
# replays, ...); then no skips (scripts/no_skips.mjs: every test ran and none skipped, unless
# tests/ALLOWED_SKIPS or KVF_ALLOW_SKIP lists it); then each libFuzzer target for TEST_FUZZ_SECONDS.
TEST_FUZZ_SECONDS ?= 20
test: deps format-check asan
	ctest --preset asan -j $(JOBS)
	node scripts/no_skips.mjs build-asan
	FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) bash scripts/fuzz.sh

mutants: deps
	KVF_MUTANT_ISOLATION=$${KVF_MUTANT_ISOLATION:-1} KVF_SPIN_VERIFY_CLEAN=1 bash scripts/mutants.sh

# The broken servers (docs/MUTANTS.md, "Broken servers"): one that answers every request 503 and
# one that ignores disconnects, each run against every suite that claims to check what it breaks;
# every such suite must fail. About 15 minutes on two cores.
broken: deps asan
	bash scripts/broken.sh

# The canary catching a broken server (docs/SERVER.md, "Canary"), serve and the split roles, with
# a prefill forging stale writes (KVF_TEST_FORGE): against the ASan test build with decode's
# checks off (KVF_TEST_UNVERIFIED), and against the mutant binary no_checksum_check
# (docs/MUTANTS.md, built here in build-mut-no_checksum_check); each run must see a canary
# failure, /health degraded and the failing response's provenance logged. About 5 minutes on two
# cores with the mutant's build; not in make test.
canary-mutant: deps asan
	cmake -S . -B build-mut-no_checksum_check -DCMAKE_BUILD_TYPE=Release -DKVF_TEST_BUILD=ON -DKVF_MUTANT=no_checksum_check >/dev/null
	cmake --build build-mut-no_checksum_check -j $(JOBS) --target kvfence
	for topo in serve split; do \
	  node tests/e2e/provenance_e2e.mjs --kvfence build-asan/kvfence --mutant unverified --topology $$topo --node-modules build-node/node_modules --work build-asan/tests/e2e/work_canary_unverified_$$topo && \
	  node tests/e2e/provenance_e2e.mjs --kvfence build-mut-no_checksum_check/kvfence --mutant binary --topology $$topo --node-modules build-node/node_modules --work build-mut-no_checksum_check/work_canary_$$topo || exit 1; \
	done

# Long prompts end to end, with the llama3.2-1b shape's 4,000-token prompt that make test leaves
# out for its time (tests/e2e/long_e2e.mjs --big 1).
long: deps release asan
	node tests/e2e/long_e2e.mjs --kvfence build/kvfence --test-kvfence build-asan/kvfence --work build-asan/tests/e2e/work_long_big --big 1

# The real processes under chaos, tenants with canaries, every response against its solo run:
# the long run (at most 10 minutes); make test runs the smoke.
isolation: deps asan
	KVF_SOAK=1 ctest --preset asan -R '^isolation$$' --output-on-failure

fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

soak: deps asan
	KVF_SOAK=1 ctest --preset asan -L soak -j $(JOBS)

# The comparison binary is configured without tests (CMakeLists.txt refuses KVF_NO_SAFETY_CHECKS
# beside tests, mutants or fuzzing) and with the release build type of build/.
bench-overhead: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target kvfence
	cmake -S . -B build-nochecks -DCMAKE_BUILD_TYPE=Release -DKVF_BUILD_TESTS=OFF -DKVF_NO_SAFETY_CHECKS=ON >/dev/null
	cmake --build build-nochecks -j $(JOBS) --target kvfence
	bash bench/overhead.sh build/kvfence build-nochecks/kvfence

bench-split: deps release
	bash bench/split.sh build/kvfence

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# Fails, naming the files, when a tracked C file differs from what `make format` would make of it
# (.clang-format); part of `make test`.
format-check:
	@bad=$$(for f in $$(git ls-files '*.c' '*.h'); do clang-format --dry-run --Werror "$$f" >/dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "format-check: not formatted (make format fixes them):"; echo "$$bad"; exit 1; fi; \
	echo "format-check: every tracked .c and .h file is formatted"

clean:
	rm -rf build build-debug build-asan build-fuzz build-mutants build-nochecks build-deb
