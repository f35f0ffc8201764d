/*
 * kvfence/common.h — error codes, version, and the few helpers every module shares.
 *
 * Every kvfence function that can fail returns an int: 0 (or a non-negative count) on success,
 * a negative code on failure. Codes are either a negated errno (-ENOMEM, -EINVAL, -EPROTO, ...)
 * or one of the project codes below, all at or under KVF_E_BASE so they never collide with an
 * errno. kvf_strerror() names every one of them.
 *
 * Each module owns one block of codes; append to your block, never renumber (the numbers
 * appear in metrics and logs).
 */
#ifndef KVFENCE_COMMON_H
#define KVFENCE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <errno.h>

#define KVF_E_BASE (-1000)

enum kvf_err {
    /* pool: illegal calls. Each leaves the pool exactly as it was. */
    KVF_E_POOL_FULL = -1001,        /* alloc beyond free pages (or beyond unreserved ones) */
    KVF_E_POOL_BAD_PAGE = -1002,    /* page index out of range */
    KVF_E_POOL_STALE_TAG = -1003,   /* tag does not match the page's current tag */
    KVF_E_POOL_NOT_HOLDER = -1004,  /* release by a holder kind that does not hold the page */
    KVF_E_POOL_DOUBLE_FREE = -1005, /* release of a page that is already FREE */
    KVF_E_POOL_NOT_OWNED = -1006,   /* grant on a page that is not OWNED by a live sequence */
    KVF_E_POOL_NO_GRANT = -1007,    /* ending a grant that does not exist */
    KVF_E_POOL_BAD_EPOCH = -1008,   /* unknown or fenced peer epoch */
    KVF_E_POOL_BAD_SLOT = -1009,    /* reader asked for a slot at or past the verified fill */
    KVF_E_POOL_RESERVE = -1010,   /* reservation beyond what is unpromised, or unreserve too many */
    KVF_E_POOL_BAD_STATE = -1011, /* the call is not legal in the page's current state */
    KVF_E_POOL_BAD_ARG = -1012,   /* malformed argument (zero count, bad fill, bad peer, ...) */
    KVF_E_POOL_FOREIGN = -1013,   /* a shared page asked for by another tenant than its owner */

    /* proto: codec and state machines. */
    KVF_E_PROTO_SHORT = -1101,       /* buffer shorter than a header or the length it declares */
    KVF_E_PROTO_VERSION = -1102,     /* unknown protocol version */
    KVF_E_PROTO_TYPE = -1103,        /* unknown message type */
    KVF_E_PROTO_BOUNDS = -1104,      /* a length or count outside its bound */
    KVF_E_PROTO_STALE = -1105,       /* stale epoch or nonce: ignored and counted */
    KVF_E_PROTO_UNKNOWN_REQ = -1106, /* unknown request id */
    KVF_E_PROTO_MISMATCH = -1107,    /* HELLO: fingerprint, geometry or limits disagree */
    KVF_E_PROTO_COUNT = -1108,       /* tokens written != tokens reserved */
    KVF_E_PROTO_CHECKSUM = -1109,    /* page checksum does not match the bytes */
    KVF_E_PROTO_TRAILER = -1110,     /* trailer tag or request id does not match the grant */
    KVF_E_PROTO_REJECTED = -1111,    /* request rejected before anything moved */
    KVF_E_PROTO_PEER_DOWN = -1112,   /* the writer peer failed or was fenced */
    KVF_E_PROTO_TIMEOUT = -1113,     /* a deadline passed */
    KVF_E_PROTO_CANCELLED = -1114,   /* cancelled by the client or router */
    KVF_E_PROTO_FAILED = -1115,      /* prefill reported failure */

    /* model: loading, tokenizing, running. */
    KVF_E_MODEL_FORMAT = -1201,      /* not a GGUF file, or malformed */
    KVF_E_MODEL_TRUNCATED = -1202,   /* an offset or size points past the end of the file */
    KVF_E_MODEL_UNSUPPORTED = -1203, /* architecture, tensor type or vocab model not supported */
    KVF_E_MODEL_MISSING = -1204,     /* a required key or tensor is absent */
    KVF_E_MODEL_SHAPE = -1205,       /* a tensor's shape disagrees with the hyper-parameters */
    KVF_E_MODEL_PAGE = -1206,        /* attention found a page whose tag or fill does not check */

    /* transport, engine, server: appended by those modules. */
    KVF_E_TRANSPORT = -1301,
    KVF_E_ENGINE = -1401,
    KVF_E_ENGINE_NO_PREFILL = -1402, /* no prefill worker connected for the admission wait */
    KVF_E_ENGINE_NO_DECODE = -1403,  /* router: no decode worker connected for the admission wait */
    KVF_E_SERVER = -1501,
};

/* A request id: 128 bits, chosen by the router, unique per request attempt. */
typedef struct kvf_req_id {
    uint64_t lo, hi;
} kvf_req_id_t;

static inline int kvf_req_id_eq(kvf_req_id_t a, kvf_req_id_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* The allocation seam. Every module that allocates takes one of these (NULL means the default,
 * malloc-backed one), so tests can inject failure by countdown and a GPU backend can supply
 * page memory. alloc returns memory aligned to `align` (a power of two) or NULL; free takes
 * what alloc returned, with the same size. */
struct kvf_alloc_ops {
    void *(*alloc)(void *ctx, size_t bytes, size_t align);
    void (*free)(void *ctx, void *p, size_t bytes);
    void *ctx;
};

/* The default allocator: aligned host memory (kvf_alloc_large). */
extern const struct kvf_alloc_ops kvf_default_alloc;

/* posix_memalign for `bytes` at `align` (a power of two), except that 4 MiB or more starts on
 * a 2 MiB boundary with transparent huge pages asked for. NULL when out of memory; free() it. */
void *kvf_alloc_large(size_t bytes, size_t align);

/* A static string naming `err` (a negative kvfence code or negated errno). Never NULL. */
const char *kvf_strerror(int err);

/* The version string, "MAJOR.MINOR.PATCH". */
const char *kvf_version(void);

/* The log sink. Library code never prints: every line it logs (a peer refused, a frame dropped,
 * a test build's switch announced) goes through kvf_log() to the one process-wide sink, which
 * the program sets; the CLI sets one that writes where the HTTP server's log goes. The default,
 * until kvf_log_set() is called or after it is called with NULL, writes the line and a newline
 * to stderr. A sink is called from any thread, concurrently, with one NUL-terminated line (no
 * newline) of at most 1023 bytes; it must not block for long. */
enum kvf_log_level {
    KVF_LOG_ERROR, /* something failed that the operator must see */
    KVF_LOG_WARN,  /* a peer or frame refused or dropped; the process goes on */
    KVF_LOG_INFO,  /* a peer came or went; a test build's switch is on */
};
typedef void kvf_log_fn(void *arg, enum kvf_log_level level, const char *line);

/* Sets the process's sink (NULL: the default, stderr). Lines logged concurrently go to the old
 * sink or the new one, each whole. This function can't fail. */
void kvf_log_set(kvf_log_fn *fn, void *arg);

/* Formats one line (printf-style; a trailing newline is dropped, a longer line is cut at 1023
 * bytes) and hands it to the sink. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void kvf_log(enum kvf_log_level level, const char *fmt, ...);

/* kvf_log(KVF_LOG_INFO, "%s", line): the signature of struct kvf_server_config's log, so the
 * HTTP server's lines go through the same sink. */
void kvf_log_line(void *arg, const char *line);

#if defined(KVF_TEST_BUILD)
/* Test builds: appends {"event":"KIND"<fmt's members>} as one line to the file KVF_TEST_EVENTS
 * names (nothing without it). FMT formats the members that follow the kind, each written as
 * `,"name":value`; a line over 1023 bytes is dropped whole. The harness's channel: what a test
 * switch did, in a schema the suites own (src/common/test_events.c). Thread-safe. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void kvf__test_event(const char *kind, const char *fmt, ...);
/* Test builds: fn is called with each event (its kind, and the whole line as JSON, without the
 * newline) in the thread that emits it, KVF_TEST_EVENTS set or not; NULL stops it. For the
 * simulator on the real loops, which runs every worker in one thread (tests/sim/sim_loops.c). */
typedef void kvf__test_event_fn(void *ctx, const char *kind, const char *json);
void kvf__test_event_listen(kvf__test_event_fn *fn, void *ctx);
#endif

/* ALWAYS(x)/NEVER(x): a defensive check that is expected to hold. Debug and test builds stop
 * on a violation (kvf__check_failed: a message naming the check, then abort), so it is found in
 * testing — whatever NDEBUG says: the test builds are optimized and define it, which once made
 * these checks vanish there, neither stopping nor taking the safe branch. Release builds
 * evaluate the check and take the safe branch. */
#if defined(KVF_TEST_BUILD) || !defined(NDEBUG)
_Noreturn void kvf__check_failed(const char *check, const char *file, int line);
#define ALWAYS(x) ((x) ? 1 : (kvf__check_failed("ALWAYS(" #x ")", __FILE__, __LINE__), 0))
#define NEVER(x)  ((x) ? (kvf__check_failed("NEVER(" #x ")", __FILE__, __LINE__), 1) : 0)
#else
#define ALWAYS(x) (!!(x))
#define NEVER(x)  (!!(x))
#endif

/* KVF_ENABLED(FLAG): the integer constant 1 where the build defines the macro FLAG as 1 or as
 * nothing (-DFLAG, -DFLAG=1, CMake's FLAG=1), 0 where FLAG is not defined — and 0 for any other
 * value, so a build flag is defined to 1 or left out. An expression, not a preprocessor test, so
 * a build-dependent line reads as ordinary C (`if (KVF_ENABLED(KVF_TEST_BUILD) && ...)`), is
 * compiled and type-checked in every build, and costs nothing where it is 0: the compiler drops
 * the dead branch. Usable in `#if` as well. The Linux kernel's IS_ENABLED() trick: FLAG expands
 * to `1` or nothing, which pasted to KVF__ON_ names one of the two macros below; their `0,`
 * shifts the 1 into the second argument, which is taken; any other token sequence leaves the 0
 * there. */
#define KVF_ENABLED(flag)               KVF__ENABLED1(flag)
#define KVF__ENABLED1(value)            KVF__ENABLED2(KVF__ON_##value)
#define KVF__ENABLED2(on_or_junk)       KVF__SECOND(on_or_junk 1, 0, ~)
#define KVF__SECOND(first, second, ...) second
#define KVF__ON_1                       0,
#define KVF__ON_                        0,

/* KVF_MUTANT(<NAME>): 1 in the build of the mutant <name> (docs/MUTANTS.md), 0 in every other
 * build — the constant 0 outside test builds, so no release binary holds a mutant's code or a
 * branch on it. <NAME> is the mutant's name in capitals, as the CMake switch writes it:
 * `-DKVF_MUTANT=<name>` defines KVF_MUTANT_<NAME>=1 for the .c files that say
 * KVF_MUTANT(<NAME>) (the top-level CMakeLists.txt finds them by that text, so the call is
 * written out on one line, never built by another macro), and CMake refuses a mutant without
 * KVF_TEST_BUILD.
 *
 * A mutant site reads as the code it breaks, the way SQLite's testcase() and NEVER() leave the
 * text straight: the check stays on its line and the mutant switches it off —
 *     if (!KVF_MUTANT(<NAME>) && got != want) return KVF_E_PROTO_COUNT;
 * — or a block that puts the bug back runs in its place and returns. verify() in
 * src/proto/decode.c and on_cancel() in src/proto/prefill.c are the examples. Only .c files may
 * use it (a header's switch would differ between the files that include it; CMake refuses one).
 * A declaration that exists only for a mutant (a struct field, a static function) keeps
 * `#if defined(KVF_MUTANT_<NAME>)`, which CMake also recognises. A name that no .c file uses
 * is refused at configure; a misspelt <NAME> at a site is not caught there and reads as 0 — the
 * mutant table (scripts/mutants.sh) is what shows each switch still puts its bug back. */
#if defined(KVF_TEST_BUILD)
#define KVF_MUTANT(name) KVF_ENABLED(KVF_MUTANT_##name)
#else
#define KVF_MUTANT(name) 0
#endif

#define KVF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif /* KVFENCE_COMMON_H */
