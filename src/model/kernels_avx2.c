/*
 * kernels_avx2.c — the two x86 variant tables. The kernels are compiled with target attributes
 * (kernels_x86.h), so the rest of the library stays baseline x86-64 and the choice is made at
 * run time (kernels.c): F32 tiles in kernels_f32_x86.c (row-major, for dequantized rows) and
 * kernels_f32g_x86.c (packed), Q8_0 and Q5_1 in kernels_q8_x86.c, Q4_0/Q4_1/Q4_K, Q5_K and Q6_K in
 * kernels_kq_x86.c.
 */
#include "attention.h"
#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS
static const struct kvf_kern kern_avx2 = {
    .name = "avx2",
    .f32_rows = kvf__f32_rows_avx2,
    .f32g_rows = kvf__f32g_rows_avx2,
    .q8_rows = kvf__q8_rows_avx2,
    .q4_rows = kvf__q4_rows_avx2,
    .q5_rows = kvf__q5_rows_avx2,
    .q6_rows = kvf__q6_rows_avx2,
    .q8m_rows = kvf__q8m_rows_avx2,
    .f16_row = kvf__f16_row_avx2,
    .quant_a16 = kvf__quant_a16_avx2,
    .attn_seg = kvf__attn_seg_avx2,
    .attn_tok = kvf__attn_tok_avx2,
    .attn_segs = kvf__attn_segs_avx2,
    .rmsnorm = kvf__rmsnorm_avx2,
    .swiglu = kvf__swiglu_avx2,
};
const struct kvf_kern *const kvf__kern_avx2 = &kern_avx2;
static const struct kvf_kern kern_vnni = {
    .name = "avx2+vnni",
    .f32_rows = kvf__f32_rows_vnni,
    .f32g_rows = kvf__f32g_rows_vnni,
    .q8_rows = kvf__q8_rows_vnni,
    .q4_rows = kvf__q4_rows_vnni,
    .q5_rows = kvf__q5_rows_vnni,
    .q6_rows = kvf__q6_rows_vnni,
    .q8m_rows = kvf__q8m_rows_vnni,
    .f16_row = kvf__f16_row_avx2,
    .quant_a16 = kvf__quant_a16_avx2,
    .attn_seg = kvf__attn_seg_vnni,
    .attn_tok = kvf__attn_tok_vnni,
    .attn_segs = kvf__attn_segs_vnni,
    .rmsnorm = kvf__rmsnorm_avx2,
    .swiglu = kvf__swiglu_vnni,
};
const struct kvf_kern *const kvf__kern_vnni = &kern_vnni;
#else
const struct kvf_kern *const kvf__kern_avx2 = NULL;
const struct kvf_kern *const kvf__kern_vnni = NULL;
#endif
