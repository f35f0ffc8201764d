/*
 * fuzz_grammar.c — the GBNF compiler and matcher (src/text/grammar.c) against arbitrary
 * grammars and inputs.
 *
 * A grammar comes from any client (the `grammar` field), so none may crash the server, read out
 * of bounds or run without bound. The input is the grammar's text, a 0x01 byte, then bytes fed
 * to the compiled grammar one at a time. A compile either succeeds, or fails with -EINVAL,
 * -E2BIG or -ENOMEM, leaving the output untouched and saying why; a feed either keeps the state
 * or refuses the byte and leaves the state as it was.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sep = size ? memchr(data, 0x01, size) : NULL;
    size_t glen = sep ? (size_t)(sep - data) : size;
    const uint8_t *in = sep ? sep + 1 : data + size;
    size_t n_in = sep ? size - glen - 1 : 0;
    kvf_grammar_t *g = (kvf_grammar_t *)(uintptr_t)1; /* must stay untouched on failure */
    char err[256] = "";
    int rc = kvf_grammar_compile((const char *)data, glen, &g, err, sizeof err);
    if (rc < 0) {
        if ((rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM) ||
            g != (kvf_grammar_t *)(uintptr_t)1 || err[0] == 0)
            abort();
        return 0;
    }
    struct kvf_grammar_state *s = malloc(2 * sizeof *s);
    if (!s) {
        kvf_grammar_free(g);
        return 0;
    }
    kvf_grammar_state_init(g, &s[0]);
    for (size_t i = 0; i < n_in && i < 4096; i++) {
        memcpy(&s[1], &s[0], sizeof s[0]);
        if (kvf_grammar_state_feed(g, &s[0], in + i, 1) < 0) {
            if (memcmp(&s[1], &s[0], sizeof s[0]) != 0)
                abort(); /* a refused byte changes nothing */
            break;
        }
        if (s[0].n == 0 || s[0].n > KVF_GRAMMAR_STATE_WORDS) abort();
    }
    (void)kvf_grammar_state_done(&s[0]);
    free(s);
    kvf_grammar_free(g);
    return 0;
}
