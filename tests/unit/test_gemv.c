// test_gemv.c: every build of the decoding step's one-row product (kernels/cpu/gemv.c) that this
// CPU runs, AVX-512F and AVX2 + FMA, against a double-precision dot product, and the readable
// reference loop too: row counts that are and are not multiples of the four rows done together,
// row lengths below one vector, with and without a masked tail, with whole vectors left after the
// unrolled steps, padded row strides, alpha and beta (beta 0 must not read y, which holds NaN
// there). The bfloat16 builds (reference, AVX2 + FMA, AVX512_BF16) on the same shapes, odd row
// lengths included (AVX512_BF16 multiplies pairs), against the double-precision product of the
// widened operands. A product of a few rows (a decoding step over several sequences, up to
// NEOX_DECODE_MAX_ROWS) gives each row bit for bit what the product of that row alone gives, in
// fp32 and bfloat16, on a weight large enough to be split over the threads.
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
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemv.h"
#include "kernels/kernels.h"

static float value(int i, int salt) { return (float)((i * 37 + salt * 11) % 23 - 11) / 8.0f; }

static void check_build(neox_gemv_rows_fn *gemv, const char *name, int N, int K, float beta) {
    int ldw = K + 3;
    float *W = neox_malloc((size_t)N * ldw * sizeof *W), *x = neox_malloc((size_t)K * sizeof *x);
    float *y = neox_malloc((size_t)N * sizeof *y);
    for (size_t i = 0; i < (size_t)N * ldw; i++) W[i] = value((int)i, 1);
    for (int k = 0; k < K; k++) x[k] = value(k, 2);
    for (int n = 0; n < N; n++) y[n] = beta != 0.0f ? value(n, 3) : NAN;
    gemv(N, K, 0.5f, W, ldw, x, beta, y);
    for (int n = 0; n < N; n++) {
        double dot = 0.0;
        for (int k = 0; k < K; k++) dot += (double)W[(size_t)n * ldw + k] * x[k];
        double expected = 0.5 * dot + (beta != 0.0f ? beta * value(n, 3) : 0.0);
        if (!(fabs(y[n] - expected) <= 1e-4 * (1.0 + fabs(expected))))
            fail_msg("%s N %d K %d beta %g: y[%d] = %g, expected %g", name, N, K, beta, n, y[n], expected);
    }
    free(W), free(x), free(y);
}

static void check_every_shape(neox_gemv_rows_fn *gemv, const char *name) {
    const int shapes[][2] = {{1, 1}, {3, 7}, {4, 16}, {5, 17}, {9, 33}, {64, 576}, {193, 1536}, {2, 100},
                               {4, 24}, {6, 30}, {3, 56}};  // whole vectors after the unrolled steps, then a tail
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int beta = 0; beta < 2; beta++) check_build(gemv, name, shapes[s][0], shapes[s][1], (float)beta);
}

static void test_reference(void **state) {
    (void)state;
    check_every_shape(neox_gemv_rows_reference, "reference");
}

static void test_avx2(void **state) {
    (void)state;
    if (!neox_cpu_has_avx2_fma()) {
        printf("this CPU has no AVX2 + FMA: that build cannot run here\n");
        return;
    }
    check_every_shape(neox_gemv_rows_avx2, "avx2");
}

static void test_avx512(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512f()) {
        printf("this CPU has no AVX-512F: that build cannot run here\n");
        return;
    }
    check_every_shape(neox_gemv_rows_avx512, "avx512");
}

// The build the matrix multiply uses is the most capable one this CPU runs.
static void test_best_build(void **state) {
    (void)state;
    neox_gemv_rows_fn *best = neox_gemv_rows_best();
    if (neox_cpu_has_avx512f()) assert_ptr_equal(best, neox_gemv_rows_avx512);
    else if (neox_cpu_has_avx2_fma()) assert_ptr_equal(best, neox_gemv_rows_avx2);
    else assert_ptr_equal(best, neox_gemv_rows_reference);
}

// ---- bfloat16 ----

static void check_bf16_build(neox_gemv_bf16_rows_fn *gemv, const char *name, int N, int K, float beta) {
    int ldw = K + 3;
    size_t nw = (size_t)N * ldw;
    float *wf = neox_malloc(nw * sizeof *wf), *xf = neox_malloc((size_t)K * sizeof *xf);
    uint16_t *W = neox_malloc(nw * sizeof *W), *x = neox_malloc((size_t)K * sizeof *x);
    float *y = neox_malloc((size_t)N * sizeof *y);
    for (size_t i = 0; i < nw; i++) wf[i] = value((int)i, 1) * 1.003f;  // not all exact in bfloat16
    for (int k = 0; k < K; k++) xf[k] = value(k, 2) * 0.997f;
    neox_cast_f32_to_bf16(W, wf, nw);
    neox_cast_f32_to_bf16(x, xf, (size_t)K);
    neox_cast_bf16_to_f32(wf, W, nw);  // the operands the product sees
    neox_cast_bf16_to_f32(xf, x, (size_t)K);
    for (int n = 0; n < N; n++) y[n] = beta != 0.0f ? value(n, 3) : NAN;
    gemv(N, K, 0.5f, W, ldw, x, beta, y);
    for (int n = 0; n < N; n++) {
        double dot = 0.0, mag = 0.0;
        for (int k = 0; k < K; k++) {
            dot += (double)wf[(size_t)n * ldw + k] * xf[k];
            mag += fabs((double)wf[(size_t)n * ldw + k] * xf[k]);
        }
        double expected = 0.5 * dot + (beta != 0.0f ? beta * value(n, 3) : 0.0);
        if (!(fabs(y[n] - expected) <= 1e-5 * (1.0 + mag)))
            fail_msg("%s N %d K %d beta %g: y[%d] = %g, expected %g", name, N, K, beta, n, y[n], expected);
    }
    free(wf), free(xf), free(W), free(x), free(y);
}

static void check_every_bf16_shape(neox_gemv_bf16_rows_fn *gemv, const char *name) {
    const int shapes[][2] = {{1, 1}, {3, 7}, {4, 16}, {5, 17}, {9, 33}, {64, 576}, {193, 1536}, {2, 100},
                               {4, 24}, {6, 30}, {3, 56}, {2, 63}, {3, 64}, {2, 95}, {1, 129}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int beta = 0; beta < 2; beta++) check_bf16_build(gemv, name, shapes[s][0], shapes[s][1], (float)beta);
}

static void test_bf16_reference(void **state) {
    (void)state;
    check_every_bf16_shape(neox_gemv_bf16_rows_reference, "bf16 reference");
}

static void test_bf16_avx2(void **state) {
    (void)state;
    if (!neox_cpu_has_avx2_fma()) {
        printf("this CPU has no AVX2 + FMA: that build cannot run here\n");
        return;
    }
    check_every_bf16_shape(neox_gemv_bf16_rows_avx2, "bf16 avx2");
}

static void test_bf16_avx512(void **state) {
    (void)state;
    if (!neox_cpu_has_avx512_bf16()) {
        printf("this CPU has no AVX512_BF16: that build cannot run here\n");
        return;
    }
    check_every_bf16_shape(neox_gemv_bf16_rows_avx512, "bf16 avx512");
}

static void test_bf16_best_build(void **state) {
    (void)state;
    neox_gemv_bf16_rows_fn *best = neox_gemv_bf16_rows_best();
    if (neox_cpu_has_avx512_bf16()) assert_ptr_equal(best, neox_gemv_bf16_rows_avx512);
    else if (neox_cpu_has_avx2_fma()) assert_ptr_equal(best, neox_gemv_bf16_rows_avx2);
    else assert_ptr_equal(best, neox_gemv_bf16_rows_reference);
}

// Rows 0..M of C = A W^T + C (C starting from a bias-like row) against each row's product alone.
static void check_few_rows(int M, int N, int K, int bf16) {
    float *a = malloc((size_t)M * K * sizeof *a), *w = malloc((size_t)N * K * sizeof *w);
    float *c = malloc((size_t)M * N * sizeof *c), *alone = malloc((size_t)N * sizeof *alone);
    uint16_t *a16 = malloc((size_t)M * K * sizeof *a16), *w16 = malloc((size_t)N * K * sizeof *w16);
    for (int i = 0; i < M * K; i++) a[i] = value(i, 1) * 0.37f;
    for (int i = 0; i < N * K; i++) w[i] = value(i, 2) * 0.11f + 1e-3f * (float)(i % 101);
    neox_cast_f32_to_bf16(a16, a, (size_t)M * K);
    neox_cast_f32_to_bf16(w16, w, (size_t)N * K);
    for (int i = 0; i < M * N; i++) c[i] = value(i % N, 3);
    if (bf16) neox_gemm_ex(0, 1, M, N, K, 1.0f, a16, K, w16, K, NEOX_ELEM_BF16, 1.0f, c, N, NEOX_ELEM_F32);
    else neox_cpu_sgemm(0, 1, M, N, K, 1.0f, a, K, w, K, 1.0f, c, N);
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) alone[n] = value(n, 3);
        if (bf16) neox_gemm_ex(0, 1, 1, N, K, 1.0f, a16 + (size_t)m * K, K, w16, K, NEOX_ELEM_BF16, 1.0f, alone, N, NEOX_ELEM_F32);
        else neox_cpu_sgemm(0, 1, 1, N, K, 1.0f, a + (size_t)m * K, K, w, K, 1.0f, alone, N);
        if (memcmp(alone, c + (size_t)m * N, (size_t)N * sizeof *alone) != 0)
            fail_msg("%s, %d rows of %dx%d: row %d differs from its product alone", bf16 ? "bfloat16" : "fp32", M, N, K, m);
    }
    free(a), free(w), free(c), free(alone), free(a16), free(w16);
}

static void test_few_rows_as_alone(void **state) {
    (void)state;
    int rows[] = {2, 3, 7, NEOX_DECODE_MAX_ROWS};
    for (int i = 0; i < 4; i++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            check_few_rows(rows[i], 1000, 333, bf16);  // 333,000 weights: over the threads
            check_few_rows(rows[i], 40, 67, bf16);     // on the calling thread
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avx512),
        cmocka_unit_test(test_best_build),
        cmocka_unit_test(test_bf16_reference),
        cmocka_unit_test(test_bf16_avx2),
        cmocka_unit_test(test_bf16_avx512),
        cmocka_unit_test(test_bf16_best_build),
        cmocka_unit_test(test_few_rows_as_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
