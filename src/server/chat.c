/*
 * chat.c — the default chat rendering (see server.h): "<role>: <content>\n" per message, then
 * "assistant:". The one place a model's own chat template will plug in.
 */
#include <stdlib.h>
#include <string.h>

#include "kvfence/server.h"

int kvf_server_chat_render(const struct kvf_server_chat_msg *msgs, size_t n_msgs, char **out,
                           size_t *out_len)
{
    static const char tail[] = "assistant:";
    if (n_msgs == 0) return -EINVAL;
    size_t len = sizeof tail - 1;
    for (size_t i = 0; i < n_msgs; i++) len += strlen(msgs[i].role) + 2 + msgs[i].content_len + 1;
    char *p = malloc(len + 1);
    if (!p) return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        size_t rl = strlen(msgs[i].role);
        memcpy(p + k, msgs[i].role, rl);
        k += rl;
        memcpy(p + k, ": ", 2);
        k += 2;
        memcpy(p + k, msgs[i].content, msgs[i].content_len);
        k += msgs[i].content_len;
        p[k++] = '\n';
    }
    memcpy(p + k, tail, sizeof tail);
    *out = p;
    *out_len = len;
    return 0;
}
