/*
 * fuzz_template.c — the chat-template interpreter (src/text/template.c) against arbitrary
 * templates and conversations.
 *
 * A template comes from the model file and the conversation from any client, so neither may
 * crash the server, read out of bounds or run without bound. The input is
 *   byte 0: flags (bit 0 add_generation_prompt, bit 1 no BOS, bit 2 no EOS), then
 *   the template, then up to 16 messages as role and content, each part ended by a 0x01 byte.
 * Every render must either succeed with a NUL-terminated output of the length it returns, no
 * longer than KVF_TEMPLATE_MAX_OUT, or fail with -EINVAL, -E2BIG or -ENOMEM, no output and a
 * one-line explanation in valid UTF-8 (the server sends it in a JSON string).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_utf8.h"
#include "kvfence/text.h"

#define MAX_MSGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t flags = data[0];
    /* One copy of the rest, each 0x01 turned into the NUL that ends a part. */
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *parts[1 + 2 * MAX_MSGS];
    size_t n_parts = 0;
    char *p = buf;
    parts[n_parts++] = p;
    for (size_t i = 0; i + 1 < size; i++) {
        if (buf[i] != '\x01') continue;
        buf[i] = '\0';
        if (n_parts == sizeof parts / sizeof parts[0]) break;
        parts[n_parts++] = buf + i + 1;
    }
    struct kvf_chat_msg msgs[MAX_MSGS];
    size_t n = (n_parts - 1) / 2;
    for (size_t i = 0; i < n; i++) {
        msgs[i].role = parts[1 + 2 * i];
        msgs[i].content = parts[2 + 2 * i];
    }
    char *out = NULL;
    char err[256];
    memset(err, 0x5a, sizeof err);
    int rc = kvf_template_render(parts[0], msgs, n, flags & 1, (flags & 2) ? NULL : "<s>",
                                 (flags & 4) ? NULL : "</s>", &out, err, sizeof err);
    if (rc >= 0) {
        if (!out || (size_t)rc > KVF_TEMPLATE_MAX_OUT || out[rc] != '\0') abort();
        free(out);
    } else {
        if (out || (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM)) abort();
        if (!memchr(err, '\0', sizeof err) || err[0] == '\0' ||
            !fuzz_utf8_valid((const uint8_t *)err, strlen(err), false))
            abort();
    }
    free(buf);
    return 0;
}
