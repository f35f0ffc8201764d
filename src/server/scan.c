/*
 * scan.c — the checks a body passes before jansson sees it: strict UTF-8 and a nesting bound.
 *
 * jansson parses nested values by recursion, so a body of a million '[' would recurse a million
 * deep; and it accepts some inputs the API must refuse. One pass here, with a depth counter and
 * no recursion, refuses both first. Work: O(len), no allocation.
 */
#include <string.h>

#include "kvfence/utf8.h"
#include "server_internal.h"

json_t *kvf__srv_json_text(const char *s, size_t n)
{
    if (kvf_utf8_valid(s, n)) return json_stringn(s, n);
    struct kvf__sbuf b = {0};
    size_t i = 0;
    while (i < n) {
        size_t k = kvf_utf8_seq_len((const uint8_t *)s + i, n - i);
        if (k == 0) {
            kvf__sbuf_put(&b, "\xef\xbf\xbd", 3);
            i++;
        } else {
            kvf__sbuf_put(&b, s + i, k);
            i += k;
        }
    }
    json_t *j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kvf__sbuf_free(&b);
    return j;
}

int kvf__srv_scan_body(const char *body, size_t len, uint32_t max_depth, struct kvf__srv_err *e)
{
    const unsigned char *p = (const unsigned char *)body;
    uint32_t depth = 0;
    bool in_str = false;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t k = kvf_utf8_seq_len(p + i, len - i);
            if (k == 0)
                return kvf__srv_fail(e, 400, NULL, "invalid_utf8",
                                     "request body is not valid UTF-8 (byte offset %zu)", i);
            i += k;
            continue;
        }
        if (c == 0)
            return kvf__srv_fail(e, 400, NULL, "invalid_json",
                                 "request body contains a NUL byte (byte offset %zu)", i);
        if (in_str) {
            if (c == '\\')
                i++; /* the escaped character is never a quote that ends the string */
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return kvf__srv_fail(e, 400, NULL, "json_too_deep",
                                     "JSON nested deeper than %u levels", max_depth);
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
        i++;
    }
    return 0;
}
