/* Tests of src/engine/gen.c: the generation handle both engines' seams share — submit's
 * checks, the engine's admit, the references, cancel and release — on a fake engine whose
 * admit is a list, as the decode worker's and the router's are. ASan sees every handle freed. */
#include <errno.h>
#include <poll.h>

#include "engine/engine_internal.h"
#include "kvf_test.h"

/* A handle as an engine completes it: the opening, then the loop's fields. */
struct kvf_gen {
    KVF__GEN_FIELDS
    int loop_mark;
};

struct fake {
    int wake_fd;
    int admit_rc; /* what admit answers */
    int admitted;
    struct kvf_gen *head, *tail; /* the inbox */
};

static int fake_admit(void *e, struct kvf_gen *g)
{
    struct fake *f = e;
    if (f->admit_rc < 0) return f->admit_rc;
    g->loop_mark = 77;
    kvf__gen_enqueue(&f->head, &f->tail, g, kvf__now_ms());
    f->admitted++;
    return 0;
}

static const int32_t prompt[4] = {1, 2, 3, 9};

static struct kvf_gen_params params(void)
{
    struct kvf_gen_params p = {0};
    p.prompt = prompt;
    p.n_prompt = 4;
    p.max_tokens = 6;
    p.sample.temperature = 0.5f;
    p.sample.top_p = 1.0f;
    return p;
}

static int submit(struct fake *f, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    return kvf__gen_submit(p, 10, 10, sizeof(struct kvf_gen), fake_admit, f, f->wake_fd, out);
}

static bool woken(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    bool w = poll(&pfd, 1, 0) > 0;
    if (w) kvf__wake_drain(fd);
    return w;
}

/* Each check both engines made before taking a handle: nothing is admitted or kept. */
static void test_gen_submit_refuses_bad_params(void)
{
    struct fake f = {.wake_fd = kvf__wake_open()};
    ASSERT_TRUE(f.wake_fd >= 0);
    kvf_gen_t *g = (kvf_gen_t *)&f; /* a sentinel: must stay untouched */
    struct kvf_gen_params p;
    ASSERT_ERR(submit(&f, NULL, &g), -EINVAL);
    p = params(), p.prompt = NULL;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.n_prompt = 0;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.max_tokens = 0;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.n_logprobs = KVF_GEN_MAX_LOGPROBS + 1;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.n_stop_ids = KVF_GEN_MAX_STOP_IDS + 1;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.sample.temperature = -0.1f;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.sample.temperature = NAN;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.sample.top_p = 0.0f;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.sample.top_p = 1.5f;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    p = params(), p.sample.top_p = NAN;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    int32_t bad[2] = {1, 10}; /* 10 is past the vocabulary of 10 */
    p = params(), p.prompt = bad, p.n_prompt = 2;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    bad[1] = -1;
    ASSERT_ERR(submit(&f, &p, &g), -EINVAL);
    /* prompt + max_tokens past the context: rejected, not malformed. */
    p = params(), p.max_tokens = 7;
    ASSERT_ERR(submit(&f, &p, &g), KVF_E_PROTO_REJECTED);
    ASSERT_EQ_PTR(g, (kvf_gen_t *)&f);
    ASSERT_EQ_INT(f.admitted, 0);
    ASSERT_FALSE(woken(f.wake_fd));
    close(f.wake_fd);
}

/* The engine refusing it (closing, queue full): its code comes back, the handle is freed. */
static void test_gen_submit_admit_refuses(void)
{
    struct fake f = {.wake_fd = kvf__wake_open(), .admit_rc = -EAGAIN};
    kvf_gen_t *g = NULL;
    struct kvf_gen_params p = params();
    ASSERT_ERR(submit(&f, &p, &g), -EAGAIN);
    f.admit_rc = -ESHUTDOWN;
    ASSERT_ERR(submit(&f, &p, &g), -ESHUTDOWN);
    ASSERT_NULL(g);
    ASSERT_FALSE(woken(f.wake_fd));
    close(f.wake_fd);
}

/* A handle's life: the prompt copied (the caller's array is borrowed), the loop woken, events
 * read in order, cancel seen by the loop, and freed by whichever side lets go last. */
static void test_gen_life(void)
{
    struct fake f = {.wake_fd = kvf__wake_open()};
    int32_t mine[4] = {1, 2, 3, 9};
    struct kvf_gen_params p = params();
    p.prompt = mine;
    p.max_tokens = 6; /* 4 + 6 == the context: taken */
    kvf_gen_t *g = NULL;
    ASSERT_OK(submit(&f, &p, &g));
    ASSERT_TRUE(f.head == g && f.tail == g && g->next == NULL && g->since_ms > 0);
    ASSERT_TRUE(woken(f.wake_fd));
    ASSERT_EQ_INT(g->loop_mark, 77);
    ASSERT_EQ_INT(g->refs, 2);
    ASSERT_EQ_INT(g->wake_fd, f.wake_fd);
    mine[0] = 5;
    ASSERT_TRUE(g->p.prompt == g->prompt && g->prompt != mine && g->prompt[0] == 1);
    ASSERT_EQ_INT(g->p.max_tokens, 6);

    struct kvf_gen_event ev = {.kind = KVF_GEN_TOKEN, .token = 4};
    ASSERT_EQ_INT(kvf__gen_next(NULL, g, &ev, 0), 0); /* nothing yet */
    kvf__evq_push(&g->q, &ev);
    ASSERT_EQ_INT(kvf__gen_next(NULL, g, &ev, 0), 1);
    ASSERT_EQ_INT(ev.token, 4);

    ASSERT_FALSE(kvf__gen_cancelled(g));
    kvf__gen_cancel(&f, g);
    kvf__gen_cancel(&f, g); /* idempotent */
    ASSERT_TRUE(kvf__gen_cancelled(g));
    ASSERT_TRUE(woken(f.wake_fd));

    /* The loop takes it from the inbox, ends it and lets go first; the submitter reads END
     * and releases. */
    f.head = f.tail = NULL;
    struct kvf_gen_event end = {.kind = KVF_GEN_END, .err = KVF_E_PROTO_CANCELLED};
    kvf__evq_push(&g->q, &end);
    kvf__gen_unref(g);
    ASSERT_EQ_INT(g->refs, 1);
    ASSERT_EQ_INT(kvf__gen_next(NULL, g, &ev, 0), 1);
    ASSERT_EQ_INT(ev.kind, KVF_GEN_END);
    ASSERT_EQ_INT(ev.err, KVF_E_PROTO_CANCELLED);
    kvf__gen_release(&f, g);

    /* Released before END: a cancel, and the loop's reference frees it afterwards. */
    ASSERT_OK(submit(&f, &p, &g));
    woken(f.wake_fd);
    kvf__gen_release(&f, g);
    ASSERT_TRUE(woken(f.wake_fd));
    ASSERT_TRUE(kvf__gen_cancelled(g));
    ASSERT_EQ_INT(g->refs, 1);
    kvf__gen_unref(g);
    close(f.wake_fd);
}

/* Admitted handles join the engine's inbox in submit order. */
static void test_gen_inbox_order(void)
{
    struct fake f = {.wake_fd = kvf__wake_open()};
    struct kvf_gen_params p = params();
    kvf_gen_t *a = NULL, *b = NULL;
    ASSERT_OK(submit(&f, &p, &a));
    ASSERT_OK(submit(&f, &p, &b));
    ASSERT_TRUE(f.head == a && a->next == b && f.tail == b && b->next == NULL);
    ASSERT_TRUE(a->since_ms <= b->since_ms);
    ASSERT_EQ_INT(f.admitted, 2);
    kvf__gen_release(&f, a);
    kvf__gen_release(&f, b);
    kvf__gen_unref(a); /* the loop's references */
    kvf__gen_unref(b);
    close(f.wake_fd);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_gen_submit_refuses_bad_params),
    KVF_CASE(test_gen_submit_admit_refuses),
    KVF_CASE(test_gen_life),
    KVF_CASE(test_gen_inbox_order),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
