// attention.c: exact causal self-attention (optionally over a sliding window of keys) without a
// (T, T) matrix, flash-attention style. Queries
// and keys are taken in blocks of ATT_BLOCK rows; each block pair is a few small GEMMs (OpenBLAS)
// on a (ATT_BLOCK, ATT_BLOCK) score tile kept on the thread's stack, with an online softmax over
// the key blocks in the forward (running max and sum per query row; the log-sum-exp is saved) and
// the probabilities recomputed from the log-sum-exp in the backward. Memory beyond the inputs and
// outputs is the (B, NH, T) log-sum-exp and a few tiles per thread. Threads split (batch, head,
// query block) in the forward and (batch, key/value head) in the backward, so the key/value
// gradients shared by a GQA group are written by one thread only (the backward therefore has
// B * NKV units of parallel work). q, k, v and their gradients are read and written through the views
// opts.views gives (contiguous per-head tensors, or q, k, v where the fused QKV projection wrote
// them): the GEMMs take a head's row stride as their leading dimension, so the arithmetic is the same
// in either layout, bit for bit.
//
// With 16-bit operands (the GPU's tensor-core kernel, kernels/cuda/attention_mma.cu) this is its
// reference at the same storage precision: the inputs are rounded once into contiguous copies, and the
// probability and score-gradient tiles where that kernel rounds them (kernels.h says where). Under
// bf16 activation storage the tensors are widened into fp32 copies and the results rounded once as
// they are stored into their views (the end of this file).
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "scratch.h"
#include "storage.h"
#include "kernels/kernels.h"
#include "vector_math.h"

// Rows per block: tiles of 64 x 64 keep the scores of a tile and its GEMM operands in L1/L2. The
// per-tile functions have AVX-512 and AVX2 builds (NEOX_CLONES): exp of the scores is a fifth of the work.
enum { ATT_BLOCK = 64 };

// Dropout keep factor for probability (row, j), row = the head's first counter row + i: 0 or 1/(1-p).
static inline float keep_factor(float p, unsigned long long seed, unsigned long long row, int T, int j) {
    return neox_uniform(seed, row * T + j) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

// The first dropout counter row of head h of micro-batch row b (kernels.h).
static unsigned long long dropout_row(const neox_attention_opts *o, int NH, int b, int h, int T) {
    return neox_attention_dropout_row(neox_attention_dropout_first_row(o->dropout_row0, o->dropout_row0_at),
                                      o->dropout_head0, o->dropout_heads, NH, b, h, T);
}

// A copy of x (n values) rounded to the operand type, or x itself in fp32 (nothing to free then).
static const float *rounded(const float *x, size_t n, neox_elem e) {
    if (e == NEOX_ELEM_F32) return x;
    float *r = neox_cpu_scratch(n * sizeof *r, "attention's rounded operands");
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) r[i] = neox_round_to_elem(x[i], e);
    return r;
}

static void free_rounded(const float *r, const float *x) {
    if (r != x) free((void *)r);
}

// Rounds the first nc values of each of nr tile rows (row pitch ATT_BLOCK) in place.
static void round_tile(float *t, int nr, int nc, neox_elem e) {
    if (e == NEOX_ELEM_F32) return;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) t[(size_t)r * ATT_BLOCK + c] = neox_round_to_elem(t[(size_t)r * ATT_BLOCK + c], e);
}

// Turns a tile of products q . k (query rows i0.., key columns j0..) into scores: times the scale,
// plus ALiBi's slope * (j - i), and -inf where the query may not look: keys after it (causal) and,
// with a window of W keys (0: none), keys W or more positions before it. i is the query row's global
// position (neox_attention_query_pos: its row under context parallelism).
static void finish_scores(float *s, int nq, int nk, int i0, int j0, const neox_attention_opts *o, float slope) {
    for (int r = 0; r < nq; r++) {
        float *sr = s + (size_t)r * ATT_BLOCK, scale = o->scale;
        int last = neox_attention_query_pos(o, i0 + r) - j0, first = o->window > 0 ? last - o->window + 1 : 0;  // visible key columns
        if (slope != 0.0f) {
            #pragma omp simd
            for (int c = 0; c < nk; c++) sr[c] = sr[c] * scale + slope * (float)(c - last);  // j - i = c - last
        } else {
            #pragma omp simd
            for (int c = 0; c < nk; c++) sr[c] *= scale;
        }
        if (last >= nk - 1 && first <= 0) continue;  // the whole row is visible
        #pragma omp simd
        for (int c = 0; c < nk; c++) sr[c] = c <= last && c >= first ? sr[c] : -INFINITY;
    }
}

// Head h's ALiBi slope (0 without ALiBi).
static float slope_of(const neox_attention_opts *o, int h) { return o->alibi ? o->alibi[h] : 0.0f; }

// The first key block a query block whose first query sits at position i0 needs: keys before the
// window of its first query are seen by none of its rows.
static int first_key_block(int i0, int window) {
    if (window <= 0 || i0 - window + 1 <= 0) return 0;
    return (i0 - window + 1) / ATT_BLOCK * ATT_BLOCK;
}

// The keys a query block of rows [i0, i0 + nq) needs: [first, end), from its first row's window to its
// last row's position (positions rise with the rows, also across context parallelism's two chunks).
static void key_range(const neox_attention_opts *o, int i0, int nq, int *first, int *end) {
    *first = first_key_block(neox_attention_query_pos(o, i0), o->window);
    *end = neox_attention_query_pos(o, i0 + nq - 1) + 1;
}

// The query blocks of Tq rows: ATT_BLOCK rows at most, none across context parallelism's two chunks
// (rows [0, q_split) and [q_split, Tq)), whose positions jump: a block across them would take the
// keys of its later rows for all of them (at T = 768, cp 4 a block of 32 rows of each chunk: a
// fifth more score tiles than the rank's share). Block blk's first row and rows.
static int query_blocks(const neox_attention_opts *o, int Tq) {
    int split = o->q_split > 0 && o->q_split < Tq ? o->q_split : 0;
    return (split + ATT_BLOCK - 1) / ATT_BLOCK + (Tq - split + ATT_BLOCK - 1) / ATT_BLOCK;
}
static void query_block(const neox_attention_opts *o, int Tq, int blk, int *i0, int *nq) {
    int split = o->q_split > 0 && o->q_split < Tq ? o->q_split : 0, first = (split + ATT_BLOCK - 1) / ATT_BLOCK;
    int begin = blk < first ? 0 : split, end = blk < first ? split : Tq;
    *i0 = begin + (blk < first ? blk : blk - first) * ATT_BLOCK;
    *nq = *i0 + ATT_BLOCK < end ? ATT_BLOCK : end - *i0;
}

// A per-head tensor (B, H, T, HS) in fp32: its first element and where its rows sit.
typedef struct view {
    float *p;
    neox_head_strides s;
} view;

// The first row of head h of batch row b.
static float *head_at(view x, int b, int h) { return x.p + (size_t)b * x.s.batch + (size_t)h * x.s.head; }

// One query block [i0, i0 + nq) of one head: out rows (stride ldo) and lse; T keys. q, k, v: the
// head's rows, each with its row stride (ldq, ldk, ldv).
NEOX_CLONES static void forward_query_block(float *out, int ldo, float *lse, const float *q, size_t ldq,
                                            const float *k, size_t ldk, const float *v, size_t ldv, int i0, int nq,
                                            int T, int HS, const neox_attention_opts *o, float slope,
                                            unsigned long long row0) {
    float s[ATT_BLOCK * ATT_BLOCK], mx[ATT_BLOCK], sum[ATT_BLOCK];
    for (int r = 0; r < nq; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
        memset(out + (size_t)(i0 + r) * ldo, 0, (size_t)HS * sizeof(float));
    }
    int first, end;
    key_range(o, i0, nq, &first, &end);
    for (int j0 = first; j0 < end; j0 += ATT_BLOCK) {
        int nk = j0 + ATT_BLOCK < T ? ATT_BLOCK : T - j0;
        neox_cpu_sgemm(0, 1, nq, nk, HS, 1.0f, q + (size_t)i0 * ldq, (int)ldq, k + (size_t)j0 * ldk, (int)ldk, 0.0f, s,
                       ATT_BLOCK);
        finish_scores(s, nq, nk, i0, j0, o, slope);
        for (int r = 0; r < nq; r++) {
            float *sr = s + (size_t)r * ATT_BLOCK, raw = -INFINITY;
            #pragma omp simd reduction(max : raw)
            for (int c = 0; c < nk; c++) raw = sr[c] > raw ? sr[c] : raw;
            float m = raw > mx[r] ? raw : mx[r];
            if (m == -INFINITY) {  // nothing visible to this row yet (before its window): no weight
                memset(sr, 0, (size_t)nk * sizeof(float));
                continue;
            }
            float alpha = expf(mx[r] - m), rs = 0.0f;  // rescales what was accumulated under the old max
            #pragma omp simd reduction(+ : rs)
            for (int c = 0; c < nk; c++) {
                sr[c] = expf(sr[c] - m);
                rs += sr[c];
            }
            sum[r] = sum[r] * alpha + rs;
            mx[r] = m;
            if (alpha != 1.0f) {
                float *o = out + (size_t)(i0 + r) * ldo;
                for (int d = 0; d < HS; d++) o[d] *= alpha;
            }
            if (o->dropout > 0.0f)  // the sum is of the undropped probabilities; only the values see the mask
                for (int c = 0; c < nk; c++)
                    sr[c] *= keep_factor(o->dropout, o->seed, row0 + (unsigned long long)(i0 + r), T, j0 + c);
        }
        round_tile(s, nq, nk, o->operands);
        neox_cpu_sgemm(0, 0, nq, HS, nk, 1.0f, s, ATT_BLOCK, v + (size_t)j0 * ldv, (int)ldv, 1.0f,
                       out + (size_t)i0 * ldo, ldo);
    }
    for (int r = 0; r < nq; r++) {
        float *o = out + (size_t)(i0 + r) * ldo, inv = 1.0f / sum[r];
        for (int d = 0; d < HS; d++) o[d] *= inv;
        lse[i0 + r] = mx[r] + logf(sum[r]);
    }
}

// q, k, v: fp32 operands (already rounded to o.operands).
static void forward_f32(float *out, float *lse, view q, view k, view v, int B, int T, int NH, int NKV, int HS,
                        neox_attention_opts o) {
    int Tq = neox_attention_query_rows(&o, T), group = NH / NKV, nblocks = query_blocks(&o, Tq);
    // Later query blocks see more keys; dynamic scheduling over (b, h, block) balances them.
    #pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int blk = 0; blk < nblocks; blk++) {
                size_t head = (size_t)b * NH + h;
                int i0, nq;
                query_block(&o, Tq, nblocks - 1 - blk, &i0, &nq);
                forward_query_block(out + ((size_t)b * Tq * NH + h) * HS, NH * HS, lse + head * Tq, head_at(q, b, h),
                                    q.s.row, head_at(k, b, h / group), k.s.row, head_at(v, b, h / group), v.s.row, i0,
                                    nq, T, HS, &o, slope_of(&o, h), dropout_row(&o, NH, b, h, T));
            }
}

// Gradients of one (query block, key block) tile of one head. With P the probabilities (recomputed
// from lse), K the dropout keep factors and D_i = dout_i . out_i:
// dV += (P*K)^T dO, dS = P * (K * (dO V^T) - D) * scale, dQ += dS Kb, dK += dS^T Q.
// q, dq: the head's query rows (row stride ldq, ldgq); k, v, dk, dv: its key/value head's (ldk, ldv,
// ldgk, ldgv).
NEOX_CLONES static void backward_tile(float *dq, size_t ldgq, float *dk, size_t ldgk, float *dv, size_t ldgv,
                                      const float *dout, int ldd, const float *q, size_t ldq, const float *k,
                                      size_t ldk, const float *v, size_t ldv, const float *lse, const float *D, int i0,
                                      int nq, int j0, int nk, int T, int HS, const neox_attention_opts *o, float slope,
                                      unsigned long long row0) {
    float dropout = o->dropout;
    neox_elem operands = o->operands;
    float p[ATT_BLOCK * ATT_BLOCK], dp[ATT_BLOCK * ATT_BLOCK], pk[ATT_BLOCK * ATT_BLOCK];
    neox_cpu_sgemm(0, 1, nq, nk, HS, 1.0f, q + (size_t)i0 * ldq, (int)ldq, k + (size_t)j0 * ldk, (int)ldk, 0.0f, p,
                   ATT_BLOCK);
    finish_scores(p, nq, nk, i0, j0, o, slope);
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * ATT_BLOCK, l = lse[i0 + r];
        #pragma omp simd
        for (int c = 0; c < nk; c++) pr[c] = expf(pr[c] - l);
    }
    neox_cpu_sgemm(0, 1, nq, nk, HS, 1.0f, dout + (size_t)i0 * ldd, ldd, v + (size_t)j0 * ldv, (int)ldv, 0.0f, dp,
                   ATT_BLOCK);
    const float *pv = p;  // the probabilities dV sees
    if (dropout > 0.0f || operands != NEOX_ELEM_F32) {  // dP = K * (dO V^T); dV sees P * K, rounded
        for (int r = 0; r < nq; r++)
            for (int c = 0; c < nk; c++) {
                unsigned long long row = row0 + (unsigned long long)(i0 + r);
                float kf = dropout > 0.0f ? keep_factor(dropout, o->seed, row, T, j0 + c) : 1.0f;
                dp[(size_t)r * ATT_BLOCK + c] *= kf;
                pk[(size_t)r * ATT_BLOCK + c] = neox_round_to_elem(p[(size_t)r * ATT_BLOCK + c] * kf, operands);
            }
        pv = pk;
    }
    neox_cpu_sgemm(1, 0, nk, HS, nq, 1.0f, pv, ATT_BLOCK, dout + (size_t)i0 * ldd, ldd, 1.0f, dv + (size_t)j0 * ldgv,
                   (int)ldgv);
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * ATT_BLOCK, *dr = dp + (size_t)r * ATT_BLOCK, Di = D[r];
        #pragma omp simd
        for (int c = 0; c < nk; c++) pr[c] = pr[c] * (dr[c] - Di) * o->scale;  // p becomes dS
    }
    round_tile(p, nq, nk, operands);
    neox_cpu_sgemm(0, 0, nq, HS, nk, 1.0f, p, ATT_BLOCK, k + (size_t)j0 * ldk, (int)ldk, 1.0f,
                   dq + (size_t)i0 * ldgq, (int)ldgq);
    neox_cpu_sgemm(1, 0, nk, HS, nq, 1.0f, p, ATT_BLOCK, q + (size_t)i0 * ldq, (int)ldq, 1.0f,
                   dk + (size_t)j0 * ldgk, (int)ldgk);
}

// Zeroes n rows of HS values (row stride ld): the gradients are summed into them.
static void zero_rows(float *x, size_t ld, int n, int HS) {
    for (int r = 0; r < n; r++) memset(x + (size_t)r * ld, 0, (size_t)HS * sizeof(float));
}

// D_i = sum_j P_ij dP_ij = dout_i . out_i for the nq query rows from i0 (also with dropout: out includes the mask).
static void row_dots(float *D, const float *dout, const float *out, int ldd, int i0, int nq, int HS) {
    for (int r = 0; r < nq; r++) {
        const float *a = dout + (size_t)(i0 + r) * ldd, *o = out + (size_t)(i0 + r) * ldd;
        float s = 0.0f;
        for (int d = 0; d < HS; d++) s += a[d] * o[d];
        D[r] = s;
    }
}

// The gradients of head h (of key/value head g's group) of batch row b: dq's rows overwritten, dk's
// and dv's summed into. dout is rounded to the operands, dout_exact not.
static void backward_head(view dq, view dk, view dv, const float *dout, const float *dout_exact, const float *out,
                          view q, view k, view v, const float *lse, int b, int h, int g, int T, int NH, int HS,
                          const neox_attention_opts *o) {
    int Tq = neox_attention_query_rows(o, T), ldd = NH * HS;
    size_t head = (size_t)b * NH + h, merged = ((size_t)b * Tq * NH + h) * HS;  // head h's rows in (B, Tq, NH, HS)
    float *dq_h = head_at(dq, b, h), *dk_g = head_at(dk, b, g), *dv_g = head_at(dv, b, g);
    const float *q_h = head_at(q, b, h), *k_g = head_at(k, b, g), *v_g = head_at(v, b, g);
    zero_rows(dq_h, dq.s.row, Tq, HS);
    for (int blk = 0; blk < query_blocks(o, Tq); blk++) {
        int i0, nq;
        query_block(o, Tq, blk, &i0, &nq);
        float D[ATT_BLOCK];
        row_dots(D, dout_exact + merged, out + merged, ldd, i0, nq, HS);
        int first, end;
        key_range(o, i0, nq, &first, &end);
        for (int j0 = first; j0 < end; j0 += ATT_BLOCK) {
            int nk = j0 + ATT_BLOCK < T ? ATT_BLOCK : T - j0;
            backward_tile(dq_h, dq.s.row, dk_g, dk.s.row, dv_g, dv.s.row, dout + merged, ldd, q_h, q.s.row, k_g,
                          k.s.row, v_g, v.s.row, lse + head * Tq, D, i0, nq, j0, nk, T, HS, o, slope_of(o, h),
                          dropout_row(o, NH, b, h, T));
        }
    }
}

// q, k, v, dout: fp32 operands (rounded to o.operands); dout_exact the unrounded dout.
static void backward_f32(view dq, view dk, view dv, const float *dout_exact, view q, view k, view v, const float *out,
                         const float *lse, int B, int T, int NH, int NKV, int HS, neox_attention_opts o) {
    int Tq = neox_attention_query_rows(&o, T), group = NH / NKV;
    const float *dout = rounded(dout_exact, (size_t)B * NH * Tq * HS, o.operands);
    // One thread per (b, key/value head): it alone writes the key/value gradients its group shares.
    #pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            zero_rows(head_at(dk, b, g), dk.s.row, T, HS);
            zero_rows(head_at(dv, b, g), dv.s.row, T, HS);
            for (int h = g * group; h < (g + 1) * group; h++)
                backward_head(dq, dk, dv, dout, dout_exact, out, q, k, v, lse, b, h, g, T, NH, HS, &o);
        }
    free_rounded(dout, dout_exact);
}

// ---- storage and views (kernels.h, "Activation storage"; opts.views) --------------------------
// Under fp32 storage and fp32 operands the kernels read and write the tensors where they are, by
// their views. Otherwise q, k and v are widened and rounded into contiguous fp32 copies, and under
// bf16 storage the gradients are made in contiguous fp32 room and rounded once as they are stored
// into their views: the reference the GPU's kernels are held to.

// An fp32 copy of the n act elements of x (to free), or x itself under fp32 (nothing to free).
static float *widened(const void *x, size_t n, neox_elem act) {
    if (act == NEOX_ELEM_F32) return (float *)x;
    float *w = neox_cpu_scratch(n * sizeof *w, "attention's widened activations");
    neox_act_load(x, 0, n, act, w);
    return w;
}

static void free_widened(const float *w, const void *x) {
    if ((const void *)w != x) free((void *)w);
}

// The element offset of row t of head h of batch row b.
static size_t row_at(neox_head_strides s, int b, int h, int t) {
    return (size_t)b * s.batch + (size_t)h * s.head + (size_t)t * s.row;
}

// q, k or v (B, H, T, HS) stored as act at xs, as fp32 operands rounded to `operands`: the tensor
// itself when neither changes its values, else a contiguous copy (to free with free_view).
static view operand_view(const void *x, neox_head_strides xs, int B, int H, int T, int HS, neox_elem act,
                         neox_elem operands) {
    neox_head_strides s = neox_head_strides_of(xs, H, T, HS), c = neox_head_strides_contiguous(H, T, HS);
    if (act == NEOX_ELEM_F32 && operands == NEOX_ELEM_F32) return (view){(float *)x, s};
    float *w = neox_cpu_scratch((size_t)B * H * T * HS * sizeof *w, "attention's operands");
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                float *row = w + row_at(c, b, h, t);
                size_t at = row_at(s, b, h, t);
                for (int d = 0; d < HS; d++) row[d] = neox_round_to_elem(neox_act_get(x, at + d, act), operands);
            }
    return (view){w, c};
}

static void free_view(view w, const void *x) {
    if ((const void *)w.p != x) free(w.p);
}

// Where a gradient (B, H, T, HS) bound for x at xs is made: x itself under fp32, else contiguous fp32 room.
static view result_view(void *x, neox_head_strides xs, int B, int H, int T, int HS, neox_elem act) {
    if (act == NEOX_ELEM_F32) return (view){(float *)x, neox_head_strides_of(xs, H, T, HS)};
    float *room = neox_cpu_scratch((size_t)B * H * T * HS * sizeof *room, "attention's fp32 results");
    return (view){room, neox_head_strides_contiguous(H, T, HS)};
}

// Stores the results made in room into x's view (each rounded once) and frees room; nothing under fp32.
static void store_view(void *x, neox_head_strides xs, view room, int B, int H, int T, int HS, neox_elem act) {
    if (act == NEOX_ELEM_F32) return;
    neox_head_strides s = neox_head_strides_of(xs, H, T, HS);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                neox_act_store(x, row_at(s, b, h, t), room.p + row_at(room.s, b, h, t), HS, act);
    free(room.p);
}

void neox_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                            int NKV, int HS, neox_attention_opts o, neox_elem act) {
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS;
    view qw = operand_view(q, o.views.q, B, NH, Tq, HS, act, o.operands);
    view kw = operand_view(k, o.views.k, B, NKV, T, HS, act, o.operands);
    view vw = operand_view(v, o.views.v, B, NKV, T, HS, act, o.operands);
    float *ow = act == NEOX_ELEM_F32 ? (float *)out : neox_cpu_scratch(nq * sizeof(float), "attention's fp32 results");
    forward_f32(ow, lse, qw, kw, vw, B, T, NH, NKV, HS, o);
    if (act != NEOX_ELEM_F32) {
        neox_act_store(out, 0, ow, nq, act);
        free(ow);
    }
    free_view(qw, q), free_view(kw, k), free_view(vw, v);
}

void neox_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                             neox_attention_opts o, neox_elem act) {
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS;
    view qw = operand_view(q, o.views.q, B, NH, Tq, HS, act, o.operands);
    view kw = operand_view(k, o.views.k, B, NKV, T, HS, act, o.operands);
    view vw = operand_view(v, o.views.v, B, NKV, T, HS, act, o.operands);
    float *dw = widened(dout, nq, act), *ow = widened(out, nq, act);
    view dqw = result_view(dq, o.views.q, B, NH, Tq, HS, act);
    view dkw = result_view(dk, o.views.k, B, NKV, T, HS, act), dvw = result_view(dv, o.views.v, B, NKV, T, HS, act);
    backward_f32(dqw, dkw, dvw, dw, qw, kw, vw, ow, lse, B, T, NH, NKV, HS, o);
    store_view(dq, o.views.q, dqw, B, NH, Tq, HS, act);
    store_view(dk, o.views.k, dkw, B, NKV, T, HS, act), store_view(dv, o.views.v, dvw, B, NKV, T, HS, act);
    free_view(qw, q), free_view(kw, k), free_view(vw, v), free_widened(dw, dout), free_widened(ow, out);
}

// GPT-NeoX's get_slopes_power_of_2(m)[i] = start * ratio ** i with start = ratio = 2 ** -(2 ** -(log2 m - 3)),
// computed in double with the same operations.
static double power_of_2_slope(int m, int i) {
    double start = pow(2.0, -pow(2.0, -(log2((double)m) - 3.0)));
    return start * pow(start, (double)i);
}

void neox_alibi_slopes(float *slopes, int num_heads, int head0, int n) {
    int m = 1;
    while (m * 2 <= num_heads) m *= 2;  // the largest power of two <= num_heads
    for (int t = 0; t < n; t++) {
        int h = head0 + t;
        // Past the first m heads: every other slope of the sequence for 2m, from its first.
        slopes[t] = (float)(h < m ? power_of_2_slope(m, h) : power_of_2_slope(2 * m, 2 * (h - m)));
    }
}
