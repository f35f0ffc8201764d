/* kvf_strerror(): the name of every kvfence error code; and what a failed ALWAYS/NEVER check
 * does in a debug or test build. */
#include "kvfence/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KVF_TEST_BUILD) || !defined(NDEBUG)
_Noreturn void kvf__check_failed(const char *check, const char *file, int line)
{
    fprintf(stderr, "%s:%d: %s failed\n", file, line, check);
    abort();
}
#endif

const char *kvf_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case KVF_E_POOL_FULL:
        return "pool: not enough free, unpromised pages";
    case KVF_E_POOL_BAD_PAGE:
        return "pool: page index out of range";
    case KVF_E_POOL_STALE_TAG:
        return "pool: stale tag";
    case KVF_E_POOL_NOT_HOLDER:
        return "pool: caller does not hold the page";
    case KVF_E_POOL_DOUBLE_FREE:
        return "pool: page is already free";
    case KVF_E_POOL_NOT_OWNED:
        return "pool: page is not owned";
    case KVF_E_POOL_NO_GRANT:
        return "pool: no such write grant";
    case KVF_E_POOL_BAD_EPOCH:
        return "pool: unknown or fenced peer epoch";
    case KVF_E_POOL_BAD_SLOT:
        return "pool: slot beyond the verified fill";
    case KVF_E_POOL_RESERVE:
        return "pool: reservation out of range";
    case KVF_E_POOL_BAD_STATE:
        return "pool: call not legal in the page's state";
    case KVF_E_POOL_BAD_ARG:
        return "pool: invalid argument";
    case KVF_E_POOL_FOREIGN:
        return "pool: a shared page of another tenant";
    case KVF_E_PROTO_SHORT:
        return "proto: message truncated";
    case KVF_E_PROTO_VERSION:
        return "proto: unknown protocol version";
    case KVF_E_PROTO_TYPE:
        return "proto: unknown message type";
    case KVF_E_PROTO_BOUNDS:
        return "proto: length or count out of bounds";
    case KVF_E_PROTO_STALE:
        return "proto: stale epoch or nonce";
    case KVF_E_PROTO_UNKNOWN_REQ:
        return "proto: unknown request";
    case KVF_E_PROTO_MISMATCH:
        return "proto: peer configuration mismatch";
    case KVF_E_PROTO_COUNT:
        return "proto: tokens written differ from tokens reserved";
    case KVF_E_PROTO_CHECKSUM:
        return "proto: page checksum mismatch";
    case KVF_E_PROTO_TRAILER:
        return "proto: page trailer does not match the grant";
    case KVF_E_PROTO_REJECTED:
        return "proto: request rejected";
    case KVF_E_PROTO_PEER_DOWN:
        return "proto: peer down or fenced";
    case KVF_E_PROTO_TIMEOUT:
        return "proto: timed out";
    case KVF_E_PROTO_CANCELLED:
        return "proto: cancelled";
    case KVF_E_PROTO_FAILED:
        return "proto: prefill failed";
    case KVF_E_MODEL_FORMAT:
        return "model: malformed GGUF file";
    case KVF_E_MODEL_TRUNCATED:
        return "model: offset or size past the end of the file";
    case KVF_E_MODEL_UNSUPPORTED:
        return "model: unsupported";
    case KVF_E_MODEL_MISSING:
        return "model: required key or tensor missing";
    case KVF_E_MODEL_SHAPE:
        return "model: tensor shape mismatch";
    case KVF_E_MODEL_PAGE:
        return "model: KV page tag or fill check failed";
    case KVF_E_TRANSPORT:
        return "transport error";
    case KVF_E_ENGINE:
        return "engine error";
    case KVF_E_ENGINE_NO_PREFILL:
        return "engine: no prefill worker connected";
    case KVF_E_ENGINE_NO_DECODE:
        return "engine: no decode worker connected";
    case KVF_E_SERVER:
        return "server error";
    default:
        break;
    }
    if (err < 0 && err > KVF_E_BASE) {
        /* strerror() is not thread-safe in general, but glibc returns static strings for the
         * known errno values, which are the only ones kvfence produces. */
        return strerror(-err);
    }
    return "unknown error";
}

const char *kvf_version(void)
{
    return KVF_VERSION;
}
