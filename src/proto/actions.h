/* actions.h — appending to a machine's action list; shared by the decode and prefill machines. */
#ifndef KVF_PROTO_ACTIONS_H
#define KVF_PROTO_ACTIONS_H

#include <errno.h>
#include <string.h>

#include "kvfence/proto.h"

/* 0 if acts has room for `most` more actions (the most one call of a machine appends), else
 * -ENOBUFS. Each machine checks this on entry, so push() below never overruns. */
static inline int kvf__actions_room(const struct kvf_actions *acts, uint32_t most)
{
    if (!acts || acts->n > acts->cap || acts->cap - acts->n < most) return -ENOBUFS;
    return 0;
}

/* Appends a zeroed action of `kind` for `req`. Room was checked on entry. */
static inline struct kvf_action *kvf__actions_push(struct kvf_actions *acts,
                                                   enum kvf_action_kind kind, kvf_req_id_t req)
{
    struct kvf_action *a = &acts->v[acts->n++];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->req = req;
    return a;
}

#endif
