// attention.c: exact causal self-attention (optionally over a sliding window of keys) without a
// (T, T) matrix, flash-attention style. Queries
// and keys are taken in blocks of ATT_BLOCK rows; each block pair is a few small products on a
// (ATT_BLOCK, ATT_BLOCK) score tile kept on the thread's stack, with an online softmax over
// the key blocks in the forward (running max and sum per query row; the log-sum-exp is saved) and
// the probabilities recomputed from the log-sum-exp in the backward. Memory beyond the inputs and
// outputs is the (B, NH, T) log-sum-exp and a few tiles per thread. Threads split (batch, head,
// query block) in the forward and (batch, key/value head) in the backward, so the key/value
// gradients shared by a GQA group are written by one thread only (the backward therefore has
// B * NKV units of parallel work). q, k, v and their gradients are read and written through the views
// opts.views gives (contiguous per-head tensors, or q, k, v where the fused QKV projection wrote
// them): the products take a head's row stride as their leading dimension, so the arithmetic is the
// same in either layout, bit for bit.
//
// With 16-bit operands (the GPU's tensor-core kernel, kernels/cuda/attention_mma.cu) this is its
// reference at the same storage precision: q, k, v and dO are rounded once, and the probability and
// score-gradient tiles where that kernel rounds them (kernels.h says where). The products themselves
// take two paths. bf16 operands (precision bfloat16) take attention_tile.c's products on bf16 pairs,
// products exact and sums in fp32 as the tensor cores and cuDNN sum them: q, k, v and dO are read
// where they lie under bf16 storage (rounded into bf16 copies under fp32 storage), the keys and values
// packed once per call, and each probability and score-gradient tile rounded as it is packed, so
// nothing is widened. fp32 and fp16 operands take fp32 copies rounded to the operands (the tensors
// themselves under fp32) and attention_tile.c's fp32 products on the tiles. The results are made in fp32 and, under
// bf16 storage, rounded once as they are stored into their views (the end of this file).
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tile.h"
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

// A per-head tensor (B, H, T, HS) in fp32, or in bf16 (view16): its first element and where its rows sit.
typedef struct view {
    float *p;
    neox_head_strides s;
} view;
typedef struct view16 {
    const uint16_t *p;
    neox_head_strides s;
} view16;

// The first row of head h of batch row b.
static float *head_at(view x, int b, int h) { return x.p + (size_t)b * x.s.batch + (size_t)h * x.s.head; }
static const uint16_t *head16_at(view16 x, int b, int h) {
    return x.p + (size_t)b * x.s.batch + (size_t)h * x.s.head;
}

// One head's operands for its tile products: fp32 rows (neox_att_f32_product), or with `tile` set bf16
// pairs (attention_tile.h): the query and dO rows as they lie (their elements pair along the head
// size), the key/value head's keys and values packed once per call as words (k, v: the B of q k^T
// and dO v^T; T columns) and as row pairs (kr, vr: the B of dS k and p v; HS columns).
typedef struct head_ops {
    const float *q, *k, *v, *dout;
    size_t ldq, ldk, ldv, ldd;
    neox_att_tile_fn *tile;
    const uint16_t *q16, *dout16;
    size_t ldq16, ldd16;
    const uint32_t *kw, *vw, *kr, *vr;
    int T;
} head_ops;

// s (nq, nk; pitch ATT_BLOCK) = rows i0.. of q (or dO, `of_dout`) times keys (or values) j0.. transposed.
static void rows_times_t(float *s, const head_ops *h, int of_dout, int i0, int nq, int j0, int nk, int HS) {
    if (h->tile) {
        const uint16_t *a = of_dout ? h->dout16 : h->q16;
        size_t lda = of_dout ? h->ldd16 : h->ldq16;
        h->tile(nq, nk, HS / 2, (const uint32_t *)(a + (size_t)i0 * lda), lda / 2, (of_dout ? h->vw : h->kw) + j0,
                (size_t)h->T, s, ATT_BLOCK, 0);
        return;
    }
    const float *a = of_dout ? h->dout : h->q, *b = of_dout ? h->v : h->k;
    size_t lda = of_dout ? h->ldd : h->ldq, ldb = of_dout ? h->ldv : h->ldk;
    neox_att_f32_product_bt(nq, nk, HS, a + (size_t)i0 * lda, lda, 1, b + (size_t)j0 * ldb, ldb, s, ATT_BLOCK);
}

// c (nq rows, stride ldc) += t (nq, nk; pitch ATT_BLOCK) times the values (or keys, `keys`) j0..:
// p v and dS k. t is rounded to the operands first (in place on the fp32 path).
static void tile_times(float *c, size_t ldc, float *t, const head_ops *h, int keys, int nq, int j0, int nk, int HS,
                       neox_elem operands) {
    if (h->tile) {
        uint32_t a[ATT_BLOCK * ATT_BLOCK / 2];
        neox_att_pack_tile(a, ATT_BLOCK / 2, t, ATT_BLOCK, nq, nk);
        h->tile(nq, HS, (nk + 1) / 2, a, ATT_BLOCK / 2, (keys ? h->kr : h->vr) + (size_t)j0 / 2 * HS, (size_t)HS, c,
                ldc, 1);
        return;
    }
    round_tile(t, nq, nk, operands);
    const float *b = keys ? h->k : h->v;
    size_t ldb = keys ? h->ldk : h->ldv;
    neox_att_f32_product(nq, HS, nk, t, ATT_BLOCK, 1, b + (size_t)j0 * ldb, ldb, c, ldc, 1);
}

// c (nk rows, stride ldc) += t^T (t: nq, nk; pitch ATT_BLOCK) times the query block's rows: dS^T q and
// p^T dO. b16: those rows as pairs ((nq + 1) / 2, HS) on the bf16 path; b, ldb: as fp32 rows.
static void tile_t_times(float *c, size_t ldc, const float *t, const head_ops *h, const uint32_t *b16, const float *b,
                         size_t ldb, int nq, int nk, int HS) {
    if (h->tile) {
        uint32_t a[ATT_BLOCK * ATT_BLOCK / 2];
        neox_att_pack_tile_t(a, ATT_BLOCK / 2, t, ATT_BLOCK, nq, nk);
        h->tile(nk, HS, (nq + 1) / 2, a, ATT_BLOCK / 2, b16, (size_t)HS, c, ldc, 1);
        return;
    }
    neox_att_f32_product(nk, HS, nq, t, 1, ATT_BLOCK, b, ldb, c, ldc, 1);
}

// One query block [i0, i0 + nq) of one head: out rows (stride ldo) and lse; T keys.
NEOX_CLONES static void forward_query_block(float *out, int ldo, float *lse, const head_ops *h, int i0, int nq, int T,
                                            int HS, const neox_attention_opts *o, float slope,
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
        rows_times_t(s, h, 0, i0, nq, j0, nk, HS);
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
        tile_times(out + (size_t)i0 * ldo, (size_t)ldo, s, h, 0, nq, j0, nk, HS, o->operands);
    }
    for (int r = 0; r < nq; r++) {
        float *o = out + (size_t)(i0 + r) * ldo, inv = 1.0f / sum[r];
        for (int d = 0; d < HS; d++) o[d] *= inv;
        lse[i0 + r] = mx[r] + logf(sum[r]);
    }
}

// The operands of a call: fp32 views (rounded to o.operands), or with `tile` set the bf16 views and
// the packs of every key/value head (B * NKV of head_words words each).
typedef struct operands {
    view q, k, v;
    const float *dout;
    neox_att_tile_fn *tile;
    view16 q16, k16, v16;
    const uint16_t *dout16;
    uint32_t *kw, *vw, *kr, *vr;
    size_t head_words;
    int NKV;
} operands;

// Head h (key/value head g) of batch row b's operands; dout's head rows (B, Tq, NH, HS) when given.
static head_ops head_of(const operands *x, int b, int h, int g, int Tq, int T, int NH, int HS) {
    size_t merged = ((size_t)b * Tq * NH + h) * HS;
    if (x->tile) {
        size_t at = x->head_words * ((size_t)b * x->NKV + g);
        return (head_ops){.tile = x->tile, .q16 = head16_at(x->q16, b, h), .ldq16 = x->q16.s.row,
                          .dout16 = x->dout16 ? x->dout16 + merged : NULL, .ldd16 = (size_t)NH * HS,
                          .kw = x->kw + at, .vw = x->vw ? x->vw + at : NULL, .kr = x->kr ? x->kr + at : NULL,
                          .vr = x->vr ? x->vr + at : NULL, .T = T};
    }
    return (head_ops){.q = head_at(x->q, b, h), .ldq = x->q.s.row, .k = head_at(x->k, b, g), .ldk = x->k.s.row,
                      .v = head_at(x->v, b, g), .ldv = x->v.s.row, .dout = x->dout ? x->dout + merged : NULL,
                      .ldd = (size_t)NH * HS, .T = T};
}

static void forward_heads(float *out, float *lse, const operands *x, int B, int T, int NH, int NKV, int HS,
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
                head_ops ops = head_of(x, b, h, h / group, Tq, T, NH, HS);
                forward_query_block(out + ((size_t)b * Tq * NH + h) * HS, NH * HS, lse + head * Tq, &ops, i0, nq, T,
                                    HS, &o, slope_of(&o, h), dropout_row(&o, NH, b, h, T));
            }
}

// Gradients of one (query block, key block) tile of one head. With P the probabilities (recomputed
// from lse), K the dropout keep factors and D_i = dout_i . out_i:
// dV += (P*K)^T dO, dS = P * (K * (dO V^T) - D) * scale, dQ += dS Kb, dK += dS^T Q.
// dq: the head's query rows (row stride ldgq); dk, dv: its key/value head's (ldgk, ldgv). q16, dout16:
// the query block's rows of q and dO as pairs on the bf16 path.
NEOX_CLONES static void backward_tile(float *dq, size_t ldgq, float *dk, size_t ldgk, float *dv, size_t ldgv,
                                      const head_ops *h, const uint32_t *q16, const uint32_t *dout16, const float *lse,
                                      const float *D, int i0, int nq, int j0, int nk, int T, int HS,
                                      const neox_attention_opts *o, float slope, unsigned long long row0) {
    float dropout = o->dropout;
    neox_elem operands = o->operands;
    float p[ATT_BLOCK * ATT_BLOCK], dp[ATT_BLOCK * ATT_BLOCK], pk[ATT_BLOCK * ATT_BLOCK];
    rows_times_t(p, h, 0, i0, nq, j0, nk, HS);
    finish_scores(p, nq, nk, i0, j0, o, slope);
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * ATT_BLOCK, l = lse[i0 + r];
        #pragma omp simd
        for (int c = 0; c < nk; c++) pr[c] = expf(pr[c] - l);
    }
    rows_times_t(dp, h, 1, i0, nq, j0, nk, HS);
    const float *pv = p;  // the probabilities dV sees
    if (dropout > 0.0f || (operands != NEOX_ELEM_F32 && !h->tile)) {  // dP = K * (dO V^T); dV sees P * K, rounded
        for (int r = 0; r < nq; r++)
            for (int c = 0; c < nk; c++) {
                unsigned long long row = row0 + (unsigned long long)(i0 + r);
                float kf = dropout > 0.0f ? keep_factor(dropout, o->seed, row, T, j0 + c) : 1.0f;
                dp[(size_t)r * ATT_BLOCK + c] *= kf;
                float v = p[(size_t)r * ATT_BLOCK + c] * kf;
                pk[(size_t)r * ATT_BLOCK + c] = h->tile ? v : neox_round_to_elem(v, operands);  // packing rounds
            }
        pv = pk;
    }
    const float *dout = h->tile ? NULL : h->dout + (size_t)i0 * h->ldd;  // fp32 path: the block's rows
    const float *q = h->tile ? NULL : h->q + (size_t)i0 * h->ldq;
    tile_t_times(dv + (size_t)j0 * ldgv, ldgv, pv, h, dout16, dout, h->ldd, nq, nk, HS);
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * ATT_BLOCK, *dr = dp + (size_t)r * ATT_BLOCK, Di = D[r];
        #pragma omp simd
        for (int c = 0; c < nk; c++) pr[c] = pr[c] * (dr[c] - Di) * o->scale;  // p becomes dS
    }
    tile_times(dq + (size_t)i0 * ldgq, ldgq, p, h, 1, nq, j0, nk, HS, operands);  // rounds dS (fp32 path: in place)
    tile_t_times(dk + (size_t)j0 * ldgk, ldgk, p, h, q16, q, h->ldq, nq, nk, HS);
}

// Zeroes n rows of HS values (row stride ld): the gradients are summed into them.
static void zero_rows(float *x, size_t ld, int n, int HS) {
    for (int r = 0; r < n; r++) memset(x + (size_t)r * ld, 0, (size_t)HS * sizeof(float));
}

// D_i = sum_j P_ij dP_ij = dout_i . out_i for the nq query rows from i0 (also with dropout: out
// includes the mask), from the stored (act) values of the head's rows at `at` (row stride ldd).
static void row_dots(float *D, const void *dout, const void *out, neox_elem act, size_t at, size_t ldd, int i0, int nq,
                     int HS) {
    for (int r = 0; r < nq; r++) {
        size_t row = at + (size_t)(i0 + r) * ldd;
        float s = 0.0f;
        for (int d = 0; d < HS; d++) s += neox_act_get(dout, row + d, act) * neox_act_get(out, row + d, act);
        D[r] = s;
    }
}

// The gradients of head h (of key/value head g's group) of batch row b: dq's rows overwritten, dk's
// and dv's summed into. x holds dO rounded to the operands; dout and out (act) as stored.
static void backward_head(view dq, view dk, view dv, const operands *x, const void *dout, const void *out,
                          neox_elem act, const float *lse, int b, int h, int g, int T, int NH, int HS,
                          const neox_attention_opts *o) {
    int Tq = neox_attention_query_rows(o, T), ldd = NH * HS;
    size_t head = (size_t)b * NH + h, merged = ((size_t)b * Tq * NH + h) * HS;  // head h's rows in (B, Tq, NH, HS)
    float *dq_h = head_at(dq, b, h), *dk_g = head_at(dk, b, g), *dv_g = head_at(dv, b, g);
    head_ops ops = head_of(x, b, h, g, Tq, T, NH, HS);
    uint32_t q16[ATT_BLOCK / 2 * 128], dout16[ATT_BLOCK / 2 * 128];  // bf16 operands: HS <= 128 (kernels.h)
    zero_rows(dq_h, dq.s.row, Tq, HS);
    for (int blk = 0; blk < query_blocks(o, Tq); blk++) {
        int i0, nq;
        query_block(o, Tq, blk, &i0, &nq);
        float D[ATT_BLOCK];
        row_dots(D, dout, out, act, merged, (size_t)ldd, i0, nq, HS);
        if (ops.tile) {  // the block's query and dO rows in pairs, for dS^T q and p^T dO
            neox_att_pack_rows(q16, (size_t)HS, ops.q16 + (size_t)i0 * ops.ldq16, ops.ldq16, nq, HS);
            neox_att_pack_rows(dout16, (size_t)HS, ops.dout16 + (size_t)i0 * ops.ldd16, ops.ldd16, nq, HS);
        }
        int first, end;
        key_range(o, i0, nq, &first, &end);
        for (int j0 = first; j0 < end; j0 += ATT_BLOCK) {
            int nk = j0 + ATT_BLOCK < T ? ATT_BLOCK : T - j0;
            backward_tile(dq_h, dq.s.row, dk_g, dk.s.row, dv_g, dv.s.row, &ops, q16, dout16, lse + head * Tq, D, i0,
                          nq, j0, nk, T, HS, o, slope_of(o, h), dropout_row(o, NH, b, h, T));
        }
    }
}

static void backward_heads(view dq, view dk, view dv, const operands *x, const void *dout, const void *out,
                           neox_elem act, const float *lse, int B, int T, int NH, int NKV, int HS,
                           neox_attention_opts o) {
    int group = NH / NKV;
    // One thread per (b, key/value head): it alone writes the key/value gradients its group shares.
    #pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            zero_rows(head_at(dk, b, g), dk.s.row, T, HS);
            zero_rows(head_at(dv, b, g), dv.s.row, T, HS);
            for (int h = g * group; h < (g + 1) * group; h++)
                backward_head(dq, dk, dv, x, dout, out, act, lse, b, h, g, T, NH, HS, &o);
        }
}

// ---- storage and views (kernels.h, "Activation storage"; opts.views) --------------------------
// bf16 operands take the bf16 path wherever the tensors are stored in bf16 (read where they lie) or
// in fp32 (rounded into contiguous bf16 copies): the keys and values are packed once per call, the
// rest per block. Other operands (fp32, fp16) take fp32 views: under fp32 storage and fp32 operands
// the tensors where they are, otherwise contiguous fp32 copies rounded to the operands. Under bf16
// storage the gradients are made in contiguous fp32 room and rounded once as they are stored into
// their views: the reference the GPU's kernels are held to.

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

// q, k or v (B, H, T, HS) stored as act at xs, in bf16: the tensor itself under bf16 storage, else a
// contiguous rounded copy (to free with free_view16).
static view16 operand_view16(const void *x, neox_head_strides xs, int B, int H, int T, int HS, neox_elem act) {
    neox_head_strides s = neox_head_strides_of(xs, H, T, HS), c = neox_head_strides_contiguous(H, T, HS);
    if (act == NEOX_ELEM_BF16) return (view16){x, s};
    uint16_t *w = neox_cpu_scratch((size_t)B * H * T * HS * sizeof *w, "attention's bf16 operands");
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                neox_cast_f32_to_bf16(w + row_at(c, b, h, t), (const float *)x + row_at(s, b, h, t), (size_t)HS);
    return (view16){w, c};
}

static void free_view16(view16 w, const void *x) {
    if ((const void *)w.p != x) free((void *)w.p);
}

// Every key/value head of x (B, NKV, T, HS) packed as words (words: HS / 2 rows of T) and/or as row
// pairs (rows: (T + 1) / 2 rows of HS), head_words words per head; NULL for a form not asked for.
static uint32_t *packed(view16 x, int B, int NKV, int T, int HS, int as_words, size_t head_words) {
    uint32_t *w = neox_cpu_scratch((size_t)B * NKV * head_words * sizeof *w, "attention's packed keys and values");
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            uint32_t *d = w + ((size_t)b * NKV + g) * head_words;
            if (as_words) neox_att_pack_words(d, (size_t)T, head16_at(x, b, g), x.s.row, T, HS);
            else neox_att_pack_rows(d, (size_t)HS, head16_at(x, b, g), x.s.row, T, HS);
        }
    return w;
}

// The operands of a call with bf16 operands on the bf16 path; dout (B, Tq, NH, HS) in the backward.
static operands bf16_operands(neox_att_tile_fn *tile, const void *q, const void *k, const void *v, const void *dout,
                              int B, int T, int Tq, int NH, int NKV, int HS, const neox_attention_opts *o,
                              neox_elem act) {
    operands x = {.tile = tile, .head_words = (size_t)(T + 1) / 2 * HS, .NKV = NKV};
    x.q16 = operand_view16(q, o->views.q, B, NH, Tq, HS, act);
    x.k16 = operand_view16(k, o->views.k, B, NKV, T, HS, act);
    x.v16 = operand_view16(v, o->views.v, B, NKV, T, HS, act);
    x.kw = packed(x.k16, B, NKV, T, HS, 1, x.head_words);
    if (dout) {  // the backward: dO v^T and dS k
        x.vw = packed(x.v16, B, NKV, T, HS, 1, x.head_words);
        x.kr = packed(x.k16, B, NKV, T, HS, 0, x.head_words);
        size_t n = (size_t)B * Tq * NH * HS;
        uint16_t *d = act == NEOX_ELEM_BF16 ? (uint16_t *)dout : neox_cpu_scratch(n * sizeof *d, "attention's bf16 dO");
        if (act != NEOX_ELEM_BF16) neox_cast_f32_to_bf16(d, dout, n);
        x.dout16 = d;
    } else {  // the forward: p v
        x.vr = packed(x.v16, B, NKV, T, HS, 0, x.head_words);
    }
    return x;
}

static void free_bf16_operands(operands *x, const void *q, const void *k, const void *v, const void *dout) {
    free_view16(x->q16, q), free_view16(x->k16, k), free_view16(x->v16, v);
    free(x->kw), free(x->vw), free(x->kr), free(x->vr);
    if ((const void *)x->dout16 != dout) free((void *)x->dout16);
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

// The bf16 path's tile product for these operands, or NULL (the fp32 path).
static neox_att_tile_fn *bf16_tile(neox_elem operands) {
    return operands == NEOX_ELEM_BF16 ? neox_att_tile_best() : NULL;
}

void neox_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                            int NKV, int HS, neox_attention_opts o, neox_elem act) {
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS;
    float *ow = act == NEOX_ELEM_F32 ? (float *)out : neox_cpu_scratch(nq * sizeof(float), "attention's fp32 results");
    neox_att_tile_fn *tile = bf16_tile(o.operands);
    if (tile) {
        operands x = bf16_operands(tile, q, k, v, NULL, B, T, Tq, NH, NKV, HS, &o, act);
        forward_heads(ow, lse, &x, B, T, NH, NKV, HS, o);
        free_bf16_operands(&x, q, k, v, NULL);
    } else {
        operands x = {.q = operand_view(q, o.views.q, B, NH, Tq, HS, act, o.operands),
                      .k = operand_view(k, o.views.k, B, NKV, T, HS, act, o.operands),
                      .v = operand_view(v, o.views.v, B, NKV, T, HS, act, o.operands)};
        forward_heads(ow, lse, &x, B, T, NH, NKV, HS, o);
        free_view(x.q, q), free_view(x.k, k), free_view(x.v, v);
    }
    if (act != NEOX_ELEM_F32) {
        neox_act_store(out, 0, ow, nq, act);
        free(ow);
    }
}

void neox_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                             neox_attention_opts o, neox_elem act) {
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS;
    view dqw = result_view(dq, o.views.q, B, NH, Tq, HS, act);
    view dkw = result_view(dk, o.views.k, B, NKV, T, HS, act), dvw = result_view(dv, o.views.v, B, NKV, T, HS, act);
    neox_att_tile_fn *tile = bf16_tile(o.operands);
    if (tile) {
        operands x = bf16_operands(tile, q, k, v, dout, B, T, Tq, NH, NKV, HS, &o, act);
        backward_heads(dqw, dkw, dvw, &x, dout, out, act, lse, B, T, NH, NKV, HS, o);
        free_bf16_operands(&x, q, k, v, dout);
    } else {
        float *dw = widened(dout, nq, act);
        operands x = {.q = operand_view(q, o.views.q, B, NH, Tq, HS, act, o.operands),
                      .k = operand_view(k, o.views.k, B, NKV, T, HS, act, o.operands),
                      .v = operand_view(v, o.views.v, B, NKV, T, HS, act, o.operands),
                      .dout = rounded(dw, nq, o.operands)};
        backward_heads(dqw, dkw, dvw, &x, dout, out, act, lse, B, T, NH, NKV, HS, o);
        free_rounded(x.dout, dw), free_widened(dw, dout);
        free_view(x.q, q), free_view(x.k, k), free_view(x.v, v);
    }
    store_view(dq, o.views.q, dqw, B, NH, Tq, HS, act);
    store_view(dk, o.views.k, dkw, B, NKV, T, HS, act), store_view(dv, o.views.v, dvw, B, NKV, T, HS, act);
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
