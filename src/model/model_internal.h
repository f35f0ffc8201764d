/*
 * model_internal.h — the model struct, shared by model.c (loading) and forward*.c (running).
 */
#ifndef KVF_MODEL_INTERNAL_H
#define KVF_MODEL_INTERNAL_H

#include "kernels.h"
#include "kvfence/model.h"

/* One transformer block's weights. Shapes are (rows, cols); q_dim = n_heads × head_dim,
 * kv_dim = n_kv_heads × head_dim. Every pointer is a view into the GGUF mapping. */
struct kvf_layer {
    const float *attn_norm;    /* (dim) */
    struct kvf_weight wq;      /* (q_dim, dim) */
    struct kvf_weight wk;      /* (kv_dim, dim) */
    struct kvf_weight wv;      /* (kv_dim, dim) */
    const float *bq, *bk, *bv; /* (q_dim), (kv_dim), (kv_dim) biases (qkv_bias), else NULL */
    const float *q_norm;       /* (head_dim) RMSNorm weight of every Q head (qk_norm), else NULL */
    const float *k_norm;       /* (head_dim) the same for K heads */
    struct kvf_weight wo;      /* (dim, q_dim) */
    const float *ffn_norm;     /* (dim) */
    struct kvf_weight w_gate;  /* (ffn_dim, dim) */
    struct kvf_weight w_up;    /* (ffn_dim, dim) */
    struct kvf_weight w_down;  /* (dim, ffn_dim) */
};

struct kvf_model {
    struct kvf_model_hparams hp;
    struct kvf_weight tok_embd; /* (n_vocab, dim) */
    struct kvf_layer *layers;   /* [n_layers], owned */
    const float *out_norm;      /* (dim) */
    struct kvf_weight output;   /* (n_vocab, dim); == tok_embd when the file ties them */
    void *packed_mem;           /* owned: every packed Q8_0 weight (kernels.h), one allocation */
    const float *rope_factors;  /* (head_dim / 2) from rope_freqs.weight, or NULL */
};

#endif
