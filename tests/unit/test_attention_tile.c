// test_attention_tile.c: attention's tile products on bf16 pairs and in fp32 (kernels/cpu/attention_tile.c)
// and the attention that uses them. Each build this CPU runs (the reference; AVX512_BF16 where present) is
// held exactly to a double-precision product of values whose products and sums fp32 holds exactly,
// for row counts around the 4-row register block, column counts around its 16-column vectors and
// 64-column block, several pair counts, with and without accumulation (nothing written past the
// rows and columns asked for); the two builds agree bit for bit on random values (the reference
// takes each pair in the instruction's order); the packing functions place and round each element
// as attention_tile.h says, half-empty pairs zero; the fp32 products, exact the same way in each of
// their forms. Then attention under bf16 storage at head sizes
// 64 and 128, an odd sequence length in one key tile (half-empty pairs along both the keys and the
// queries), against a naive attention in double that rounds where kernels.h says.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/kernels.h"

static uint16_t bf16_of(float x) {
    uint16_t h;
    neox_cast_f32_to_bf16(&h, &x, 1);
    return h;
}

// Small multiples of 1/16 (exact in bf16; their products and sums of a few hundred exact in fp32).
static float value(size_t i, int salt) { return (float)((int)((i * 37 + (size_t)salt * 11) % 29) - 14) / 16.0f; }

static uint32_t pair(float lo, float hi) { return (uint32_t)bf16_of(lo) | (uint32_t)bf16_of(hi) << 16; }

static void check_exact(neox_att_tile_fn *tile, const char *name, int M, int N, int KP, int accumulate) {
    size_t lda = (size_t)KP + 3, ldb = (size_t)N + 5, ldc = (size_t)N + 2;
    uint32_t *a = neox_malloc((size_t)(M + 1) * lda * sizeof *a), *b = neox_malloc((size_t)KP * ldb * sizeof *b);
    float *c = neox_malloc((size_t)(M + 1) * ldc * sizeof *c);
    for (int i = 0; i < M; i++)
        for (int p = 0; p < KP; p++) a[i * lda + p] = pair(value(i * lda + 2 * p, 1), value(i * lda + 2 * p + 1, 1));
    for (int p = 0; p < KP; p++)
        for (int j = 0; j < N; j++) b[p * ldb + j] = pair(value(p * ldb + j, 2), value(p * ldb + j, 3));
    for (size_t i = 0; i < (size_t)(M + 1) * ldc; i++) c[i] = accumulate && i < (size_t)M * ldc ? value(i, 4) : NAN;
    tile(M, N, KP, a, lda, b, ldb, c, ldc, accumulate);
    for (int i = 0; i <= M; i++)
        for (int j = 0; j < (int)ldc; j++) {
            float got = c[i * ldc + j];
            if (i == M || j >= N) {  // past the rows and columns asked for: untouched
                if (!isnan(got) && !(accumulate && i < M && got == value(i * ldc + j, 4)))
                    fail_msg("%s M %d N %d KP %d: wrote C[%d][%d]", name, M, N, KP, i, j);
                continue;
            }
            double want = accumulate ? value(i * ldc + j, 4) : 0.0;
            for (int p = 0; p < KP; p++)
                want += (double)value(i * lda + 2 * p, 1) * value(p * ldb + j, 2) +
                        (double)value(i * lda + 2 * p + 1, 1) * value(p * ldb + j, 3);
            if (got != want)
                fail_msg("%s M %d N %d KP %d acc %d: C[%d][%d] = %.9g, expected %.9g", name, M, N, KP, accumulate, i,
                         j, got, want);
        }
    free(a), free(b), free(c);
}

static void check_every_shape(neox_att_tile_fn *tile, const char *name) {
    const int shapes[][3] = {{1, 1, 1}, {3, 17, 8}, {4, 16, 32}, {5, 64, 32}, {64, 64, 32}, {61, 63, 31},
                             {64, 128, 64}, {7, 130, 3}, {33, 300, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int acc = 0; acc < 2; acc++) check_exact(tile, name, shapes[s][0], shapes[s][1], shapes[s][2], acc);
}

static void test_reference(void **state) {
    (void)state;
    check_every_shape(neox_att_tile_reference, "reference");
}

static void test_avx512_bf16(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512_bf16()) {
        printf("this CPU has no AVX512_BF16: that build cannot run here\n");
        return;
    }
    check_every_shape(neox_att_tile_avx512, "avx512_bf16");
    assert_ptr_equal(neox_att_tile_best(), neox_att_tile_avx512);
}

// Random normal-range values, sums rounded at every step: the builds agree bit for bit.
static void test_builds_agree(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512_bf16()) {
        printf("this CPU has no AVX512_BF16: nothing to compare\n");
        return;
    }
    enum { M = 13, N = 70, KP = 40 };
    uint32_t a[M * KP], b[KP * N];
    float c1[M * N], c2[M * N];
    uint64_t s = 12345;
    for (size_t i = 0; i < M * KP + KP * N; i++) {
        float x[2];
        for (int h = 0; h < 2; h++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[h] = ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 3.0f + 0.01f;
        }
        *(i < M * KP ? &a[i] : &b[i - M * KP]) = pair(x[0], x[1]);
    }
    for (int i = 0; i < M * N; i++) c1[i] = c2[i] = (float)i * 0.37f - 3.0f;
    neox_att_tile_reference(M, N, KP, a, KP, b, N, c1, N, 1);
    neox_att_tile_avx512(M, N, KP, a, KP, b, N, c2, N, 1);
    assert_memory_equal(c1, c2, sizeof c1);
}

// Packing: each word's halves where attention_tile.h puts them, rounded to nearest even, zero past the edge.
static void test_packing(void **state) {
    (void)state;
    enum { R = 5, C = 6, LD = 8 };
    uint16_t x[R * LD];
    float t[R * LD];
    for (int i = 0; i < R * LD; i++) x[i] = (uint16_t)(i + 1), t[i] = 1.0f + (float)i / 128.0f;
    // Ties to even: 1 + 2^-8 lies half-way between 1 and 1 + 2^-7 (to 1), 1 + 3 * 2^-8 between 1 + 2^-7
    // and 1 + 2^-6 (to 1 + 2^-6).
    t[0] = 1.0f + 1.0f / 256, t[1] = 1.0f + 3.0f / 256;
    uint32_t w[C / 2 * R], rows[(R + 1) / 2 * C], pt[R * ((C + 1) / 2)], ptt[C * ((R + 1) / 2)];
    neox_att_pack_words(w, R, x, LD, R, C);
    for (int p = 0; p < C / 2; p++)
        for (int r = 0; r < R; r++)
            assert_int_equal(w[p * R + r], (uint32_t)x[r * LD + 2 * p] | (uint32_t)x[r * LD + 2 * p + 1] << 16);
    neox_att_pack_rows(rows, C, x, LD, R, C);
    for (int p = 0; p < (R + 1) / 2; p++)
        for (int c = 0; c < C; c++) {
            uint32_t hi = 2 * p + 1 < R ? x[(2 * p + 1) * LD + c] : 0;  // the row past R: zero
            assert_int_equal(rows[p * C + c], (uint32_t)x[2 * p * LD + c] | hi << 16);
        }
    neox_att_pack_tile(pt, (C + 1) / 2, t, LD, R, C - 1);  // 5 columns: the last pair half empty
    assert_int_equal(pt[0], 0x3f80u | 0x3f82u << 16);
    for (int r = 0; r < R; r++)
        for (int p = 0; p < C / 2; p++) {
            uint32_t hi = 2 * p + 1 < C - 1 ? bf16_of(t[r * LD + 2 * p + 1]) : 0;
            if (r > 0 || p > 0) assert_int_equal(pt[r * (C / 2) + p], bf16_of(t[r * LD + 2 * p]) | hi << 16);
        }
    neox_att_pack_tile_t(ptt, (R + 1) / 2, t, LD, R, C);  // 5 rows: the last pair half empty
    for (int c = 0; c < C; c++)
        for (int p = 0; p < (R + 1) / 2; p++) {
            uint32_t hi = 2 * p + 1 < R ? bf16_of(t[(2 * p + 1) * LD + c]) : 0;
            assert_int_equal(ptt[c * ((R + 1) / 2) + p], bf16_of(t[2 * p * LD + c]) | hi << 16);
        }
}

// ---- fp32 products ------------------------------------------------------------------------------
// C = A B or C += A B with A as rows or transposed (a tile's columns), and C = A B with B transposed, exact
// against double on the same small multiples of 1/16: rows around the 4-row block, columns around
// the 16-column one, K and N over the transposed B's 64 x 64 chunks; nothing past the rows and
// columns asked for written.
static void check_f32(int M, int N, int K, int a_t, int b_t, int accumulate) {
    size_t lda = (size_t)(a_t ? M : K) + 3, ldb = (size_t)(b_t ? K : N) + 1, ldc = (size_t)N + 2;
    size_t na = (size_t)(a_t ? K : M) * lda, nb = (size_t)(b_t ? N : K) * ldb, nc = (size_t)(M + 1) * ldc;
    float *a = neox_malloc(na * sizeof *a), *b = neox_malloc(nb * sizeof *b), *c = neox_malloc(nc * sizeof *c);
    for (size_t i = 0; i < na; i++) a[i] = value(i, 5);
    for (size_t i = 0; i < nb; i++) b[i] = value(i, 6);
    for (size_t i = 0; i < nc; i++) c[i] = accumulate && i < (size_t)M * ldc ? value(i, 7) : NAN;
    size_t a_row = a_t ? 1 : lda, a_col = a_t ? lda : 1;
    if (b_t) neox_att_f32_product_bt(M, N, K, a, a_row, a_col, b, ldb, c, ldc);
    else neox_att_f32_product(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate);
    for (int i = 0; i <= M; i++)
        for (int j = 0; j < (int)ldc; j++) {
            float got = c[i * ldc + j];
            if (i == M || j >= N) {
                if (!isnan(got) && !(accumulate && i < M && got == value(i * ldc + j, 7)))
                    fail_msg("fp32 M %d N %d K %d: wrote C[%d][%d]", M, N, K, i, j);
                continue;
            }
            double want = accumulate ? value(i * ldc + j, 7) : 0.0;
            for (int k = 0; k < K; k++)
                want += (double)a[i * a_row + k * a_col] * b[b_t ? (size_t)j * ldb + k : (size_t)k * ldb + j];
            if (got != want)
                fail_msg("fp32 M %d N %d K %d a_t %d b_t %d acc %d: C[%d][%d] = %.9g, expected %.9g", M, N, K, a_t, b_t,
                         accumulate, i, j, got, want);
        }
    free(a), free(b), free(c);
}

static void test_f32_products(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 1, 1},    {3, 17, 5},   {4, 16, 64},  {64, 64, 64},
                             {61, 63, 80}, {7, 70, 130}, {64, 128, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int form = 0; form < 4; form++)
            for (int acc = 0; acc < 2; acc++)
                if (!(acc && form >> 1)) check_f32(shapes[s][0], shapes[s][1], shapes[s][2], form & 1, form >> 1, acc);
}

// ---- attention under bf16 storage on the bf16 path ------------------------------------------------
enum { T = 61, NH = 2, NKV = 1 };

static float rb(double x) { return neox_bf16_to_f32(bf16_of((float)x)); }

// Naive attention in double over bf16 q, k, v, dout (B = 1), rounding P before it weights v and dout
// and dS before it weights k and q: out (T, NH, HS), dq (NH, T, HS), dk, dv (NKV, T, HS).
static void naive(double *out, double *dq, double *dk, double *dv, const float *q, const float *k, const float *v,
                  const float *dout, const float *lse, double scale, int HS) {
    memset(dq, 0, sizeof(double) * NH * T * HS), memset(dk, 0, sizeof(double) * NKV * T * HS);
    memset(dv, 0, sizeof(double) * NKV * T * HS), memset(out, 0, sizeof(double) * NH * T * HS);
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++) {
            const float *qi = q + ((size_t)h * T + i) * HS, *di = dout + ((size_t)i * NH + h) * HS;
            double sc[T], mx = -1e300, sum = 0, D = 0;
            for (int j = 0; j <= i; j++) {
                sc[j] = 0;
                for (int d = 0; d < HS; d++) sc[j] += (double)qi[d] * k[j * HS + d];
                sc[j] *= scale, mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= i; j++) sum += exp(sc[j] - mx);
            for (int j = 0; j <= i; j++)
                for (int d = 0; d < HS; d++)
                    out[((size_t)i * NH + h) * HS + d] += rb(exp(sc[j] - mx)) * v[j * HS + d] / sum;
            for (int d = 0; d < HS; d++) D += (double)di[d] * rb(out[((size_t)i * NH + h) * HS + d]);
            for (int j = 0; j <= i; j++) {
                double p = exp(sc[j] - lse[h * T + i]), dp = 0;
                for (int d = 0; d < HS; d++) dp += (double)di[d] * v[j * HS + d];
                double ds = rb(p * (dp - D) * scale);
                for (int d = 0; d < HS; d++) {
                    dv[j * HS + d] += rb(p) * di[d];
                    dq[((size_t)h * T + i) * HS + d] += ds * k[j * HS + d];
                    dk[j * HS + d] += ds * qi[d];
                }
            }
        }
}

static void check_attention(int HS) {
    size_t nq = (size_t)NH * T * HS, nkv = (size_t)NKV * T * HS;
    float *f[4];
    uint16_t *x[4];  // q, k, v, dout in bf16
    size_t n[4] = {nq, nkv, nkv, nq};
    for (int t = 0; t < 4; t++) {
        f[t] = neox_malloc(n[t] * sizeof(float)), x[t] = neox_malloc(n[t] * sizeof(uint16_t));
        for (size_t i = 0; i < n[t]; i++) f[t][i] = rb(sin(0.37 * (double)i + t) * (t == 3 ? 0.1 : 1.0));
    }
    // The last key (alone in a half-empty pair along the keys) takes most of the last query's weight
    // (alone in a half-empty pair along the queries), so a pair lost at either edge shows.
    for (int d = 0; d < HS; d++) f[1][(size_t)(T - 1) * HS + d] = rb(3.0 * f[0][(size_t)(T - 1) * HS + d]);
    for (int t = 0; t < 4; t++) neox_cast_f32_to_bf16(x[t], f[t], n[t]);
    uint16_t *out = neox_malloc(nq * 2), *dq = neox_malloc(nq * 2);
    uint16_t *dk = neox_malloc(nkv * 2), *dv = neox_malloc(nkv * 2);
    float *lse = neox_malloc((size_t)NH * T * sizeof *lse), scale = 1.0f / sqrtf((float)HS) * 2.0f;
    neox_attention_opts o = {.scale = scale, .operands = neox_attention_operands(NEOX_ELEM_BF16, HS)};
    assert_int_equal(o.operands, NEOX_ELEM_BF16);
    neox_attention_forward(out, lse, x[0], x[1], x[2], 1, T, NH, NKV, HS, o, NEOX_ELEM_BF16);
    neox_attention_backward(dq, dk, dv, x[3], x[0], x[1], x[2], out, lse, 1, T, NH, NKV, HS, o, NEOX_ELEM_BF16);
    double *w[4] = {neox_malloc(nq * 8), neox_malloc(nq * 8), neox_malloc(nkv * 8), neox_malloc(nkv * 8)};
    naive(w[0], w[1], w[2], w[3], f[0], f[1], f[2], f[3], lse, scale, HS);
    const uint16_t *got[4] = {out, dq, dk, dv};
    size_t m[4] = {nq, nq, nkv, nkv};
    for (int t = 0; t < 4; t++) {
        double worst = 0, amax = 0;
        for (size_t i = 0; i < m[t]; i++)
            worst = fmax(worst, fabs(neox_bf16_to_f32(got[t][i]) - w[t][i])), amax = fmax(amax, fabs(w[t][i]));
        // A bf16 unit (2^-8 relative) for the stored result, a few more where a rounding boundary moved.
        if (!(worst < 4.0 / 256 * amax))
            fail_msg("HS %d tensor %d (out, dq, dk, dv): worst %.3g of the largest %.3g", HS, t, worst, amax);
    }
    for (int t = 0; t < 4; t++) free(f[t]), free(x[t]), free(w[t]);
    free(out), free(dq), free(dk), free(dv), free(lse);
}

static void test_attention_bf16_storage(void **state) {
    (void)state;
    check_attention(64);
    check_attention(128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),   cmocka_unit_test(test_avx512_bf16),
        cmocka_unit_test(test_builds_agree), cmocka_unit_test(test_packing),
        cmocka_unit_test(test_f32_products), cmocka_unit_test(test_attention_bf16_storage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
