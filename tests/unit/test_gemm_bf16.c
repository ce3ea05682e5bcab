// test_gemm_bf16.c: both builds of the bfloat16 matrix product (kernels/cpu/gemm_bf16.c) this CPU
// runs, the reference (widen, sgemm) and AVX512_BF16 (vdpbf16ps on packed pairs), against a
// double-precision product of the same bfloat16 values: every transposition, odd K (a pair half
// empty), M and N that are and are not multiples of the 8 x 32 register block and the 128-row
// cache block, K over several cache blocks, fewer than 8 rows (the decoding step's in-place dot products, K tails masked), padded strides, alpha and beta (beta 0 must not read C, which holds NaN there);
// the product rounded into bf16 as it is stored, bit for bit against the fp32 product rounded after
// (results that are subnormal included: the activation storage's rounding keeps them); and the
// larger row items of a product whose packed B outgrows L2, bit for bit against smaller products.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/kernels.h"

// Values exact in bfloat16 (k/16 for small k), varied by position and operand.
static uint16_t bf16_of(float x) {
    uint16_t h;
    neox_cast_f32_to_bf16(&h, &x, 1);
    return h;
}
static float value(size_t i, int salt) { return (float)((int)((i * 37 + (size_t)salt * 11) % 29) - 14) / 16.0f; }

static void check(neox_gemm_bf16_fn *gemm, const char *name, int ta, int tb, int M, int N, int K, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    uint16_t *A = neox_malloc(na * sizeof *A), *B = neox_malloc(nb * sizeof *B);
    float *C = neox_malloc(nc * sizeof *C);
    for (size_t i = 0; i < na; i++) A[i] = bf16_of(value(i, 1));
    for (size_t i = 0; i < nb; i++) B[i] = bf16_of(value(i, 2));
    for (size_t i = 0; i < nc; i++) C[i] = beta != 0.0f ? value(i, 3) : NAN;
    gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double dot = 0.0;
            for (int k = 0; k < K; k++)
                dot += (double)value(ta ? (size_t)k * lda + i : (size_t)i * lda + k, 1) *
                       value(tb ? (size_t)j * ldb + k : (size_t)k * ldb + j, 2);
            double want = 0.5 * dot + (beta != 0.0f ? beta * value((size_t)i * ldc + j, 3) : 0.0);
            double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= 1e-5 * (1.0 + fabs(want))))
                fail_msg("%s ta %d tb %d M %d N %d K %d beta %g: C[%d][%d] = %.9g, expected %.9g", name, ta, tb, M, N, K,
                         beta, i, j, got, want);
        }
    // Columns past N in the padded stride are not written.
    for (int i = 0; i < M && beta == 0.0f; i++)
        for (int j = N; j < ldc; j++)
            if (!isnan(C[(size_t)i * ldc + j])) fail_msg("%s: wrote C[%d][%d] past N", name, i, j);
    free(A), free(B), free(C);
}

static void check_every_shape(neox_gemm_bf16_fn *gemm, const char *name) {
    // M below 8 with B (N, K) takes the in-place dot products; K 33 and 70 end in a masked tail; K
    // 576 and 1100 take two and three blocks along K (the sums carried between them), split over
    // columns (N > M) and over rows.
    const int shapes[][3] = {{1, 1, 1}, {1, 33, 7}, {7, 31, 16}, {8, 32, 17}, {9, 65, 64}, {130, 40, 33},
                             {3, 200, 576}, {2, 9, 70}, {5, 3, 32}, {41, 33, 1100}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 4; t++)
            for (int beta = 0; beta < 2; beta++)
                check(gemm, name, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], (float)beta);
}

static void test_reference(void **state) {
    (void)state;
    check_every_shape(neox_gemm_bf16_reference, "reference");
}

static void test_avx512_bf16(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512_bf16()) {
        printf("this CPU has no AVX512_BF16: that build cannot run here\n");
        return;
    }
    check_every_shape(neox_gemm_bf16_avx512, "avx512_bf16");
}

// neox_gemm_bf16_rounded (a linear layer's bf16 results stored straight from the product) gives the
// bits of the AVX512_BF16 product into fp32 rows holding the addend (a bias, or C's old value
// widened: beta 1), rounded afterwards by the activation storage's rounding, for the forward's
// layout (B (N, K)) and the input gradient's (B (K, N)); writes nothing past N in a padded stride,
// and declines (C untouched) at NEOX_DECODE_MAX_ROWS rows against B (N, K) and for both addends.
enum addend { NONE, BIAS, OLD };

static void check_rounded(int trans_b, int M, int N, int K, enum addend add) {
    int lda = K + 3, ldb = (trans_b ? K : N) + 1, ldc = N + 2;
    size_t nb = (size_t)(trans_b ? N : K) * ldb;
    uint16_t *A = neox_malloc((size_t)M * lda * sizeof *A), *B = neox_malloc(nb * sizeof *B);
    uint16_t *C = neox_malloc((size_t)M * ldc * sizeof *C), *want = neox_malloc((size_t)M * N * sizeof *want);
    float *rows = neox_malloc((size_t)M * N * sizeof *rows), *bias = neox_malloc((size_t)N * sizeof *bias);
    for (size_t i = 0; i < (size_t)M * lda; i++) A[i] = bf16_of(value(i, 1) * 1.37f);
    for (size_t i = 0; i < nb; i++) B[i] = bf16_of(value(i, 2) * 0.71f);
    for (int j = 0; j < N; j++) bias[j] = value((size_t)j, 4) * 3.1f + 0.013f;  // not exact in bf16
    A[0] = 0x7fc0, A[lda] = 0x7f80, A[2 * lda] = 0xff80;  // rows of NaN, of infinities (and NaN where 0 x inf)
    // Row 3 zero, so its results are the addends alone, some subnormal (rounded, not flushed to zero).
    for (int k = 0; k < K; k++) A[3 * (size_t)lda + k] = 0;
    for (int j = 1; j < N; j += 5) bias[j] = (j & 2 ? -1e-39f : 3e-39f) * (float)j;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            uint16_t old = j < N ? bf16_of(value((size_t)i * N + j, 3) * 2.3f) : 0x7fc1;  // 0x7fc1: no result's NaN
            if (i == 3 && j < N && j % 3 == 0) old = (uint16_t)(j % 2 ? 0x8000 | (j & 0x7f) : j & 0x7f);  // subnormal
            C[(size_t)i * ldc + j] = add == OLD || j >= N ? old : 0x7fc1;
            if (j < N) rows[(size_t)i * N + j] = add == BIAS ? bias[j] : add == OLD ? neox_bf16_to_f32(old) : 0.0f;
        }
    neox_gemm_bf16_avx512(0, trans_b, M, N, K, 0.37f, A, lda, B, ldb, add == NONE ? 0.0f : 1.0f, rows, N);
    neox_cast_f32_to_bf16(want, rows, (size_t)M * N);
    assert_int_equal(neox_gemm_bf16_rounded(0, trans_b, M, N, K, 0.37f, A, lda, B, ldb, add == BIAS ? bias : NULL,
                                            add == OLD, C, ldc),
                     1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            uint16_t got = C[(size_t)i * ldc + j], expect = j < N ? want[(size_t)i * N + j] : 0x7fc1;
            if (got != expect)
                fail_msg("tb %d M %d N %d K %d addend %d: C[%d][%d] = 0x%04x, expected 0x%04x", trans_b, M, N, K, add, i,
                         j, got, expect);
        }
    free(A), free(B), free(C), free(want), free(rows), free(bias);
}

static void test_rounded_store(void **state) {
    (void)state;
    uint16_t a[32 * 4] = {0}, b[4] = {0}, c[32] = {0x7fc1};
    float bias[1] = {1.0f};
    if (!neox_cpu_has_avx512_bf16()) {
        assert_int_equal(neox_gemm_bf16_rounded(0, 1, 32, 1, 4, 1.0f, a, 4, b, 4, NULL, 0, c, 1), 0);
        printf("this CPU has no AVX512_BF16: the rounded store is declined\n");
        return;
    }
    assert_int_equal(neox_gemm_bf16_rounded(0, 1, NEOX_DECODE_MAX_ROWS, 1, 4, 1.0f, a, 4, b, 4, NULL, 0, c, 1), 0);
    assert_int_equal(neox_gemm_bf16_rounded(0, 1, 32, 1, 4, 1.0f, a, 4, b, 4, bias, 1, c, 1), 0);
    assert_int_equal(c[0], 0x7fc1);
    // B (K, N) has no decoding path: a few rows are done.
    const int shapes[][3] = {{17, 33, 17}, {130, 40, 33}, {200, 70, 64}, {24, 32, 576}, {5, 45, 20}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tb = 0; tb < 2; tb++)
            for (int add = NONE; add <= OLD; add++)
                if (tb == 0 || shapes[s][0] > NEOX_DECODE_MAX_ROWS)
                    check_rounded(tb, shapes[s][0], shapes[s][1], shapes[s][2], (enum addend)add);
}

// A product split by rows whose packed B outgrows L2 takes items of twice the rows (here 1 thread,
// 520 rows, B (8200, 64) packed: 1.05 MB): the same bits as the same rows in two products of 260,
// which take the usual items, and within fp32's rounding of the reference build (widen, sgemm).
static void test_large_b_items(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512_bf16()) return;
    enum { M = 520, N = 64, K = 8200 };
    uint16_t *A = neox_malloc((size_t)M * K * sizeof *A), *B = neox_malloc((size_t)K * N * sizeof *B);
    float *whole = neox_malloc((size_t)M * N * sizeof *whole), *halves = neox_malloc((size_t)M * N * sizeof *halves);
    float *ref = neox_malloc((size_t)M * N * sizeof *ref);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = bf16_of(value(i, 1));
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = bf16_of(value(i, 2));
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    neox_gemm_bf16_avx512(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, whole, N);
    for (int h = 0; h < 2; h++)
        neox_gemm_bf16_avx512(0, 0, M / 2, N, K, 1.0f, A + (size_t)h * (M / 2) * K, K, B, N, 0.0f,
                              halves + (size_t)h * (M / 2) * N, N);
    omp_set_num_threads(threads);
    neox_gemm_bf16_reference(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, ref, N);
    assert_memory_equal(whole, halves, (size_t)M * N * sizeof *whole);
    for (size_t i = 0; i < (size_t)M * N; i++)
        if (!(fabsf(whole[i] - ref[i]) <= 1e-2f + 1e-4f * fabsf(ref[i])))
            fail_msg("C[%zu] = %.9g, the reference build %.9g", i, whole[i], ref[i]);
    free(A), free(B), free(whole), free(halves), free(ref);
}

// neox_gemm_ex, the backends' entry, takes the best build for bfloat16 operands and fp32 results.
static void test_gemm_ex_takes_it(void **state) {
    (void)state;
    uint16_t a[6], b[6];
    float c[4] = {NAN, NAN, NAN, NAN};
    for (int i = 0; i < 6; i++) a[i] = bf16_of((float)(i + 1)), b[i] = bf16_of((float)(6 - i));
    neox_gemm_ex(0, 1, 2, 2, 3, 1.0f, a, 3, b, 3, NEOX_ELEM_BF16, 0.0f, c, 2, NEOX_ELEM_F32);
    // rows (1 2 3), (4 5 6) against (6 5 4), (3 2 1)
    assert_true(c[0] == 28.0f && c[1] == 10.0f && c[2] == 73.0f && c[3] == 28.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_avx512_bf16),
        cmocka_unit_test(test_gemm_ex_takes_it),
        cmocka_unit_test(test_rounded_store),
        cmocka_unit_test(test_large_b_items),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
