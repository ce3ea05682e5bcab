// test_gemm.c: the CPU backend's matrix multiply (kernels/cpu/gemm.c) against a plain triple loop
// in double precision: every transpose combination, padded leading dimensions, beta 0 and 1, one
// row (the matrix-vector path of a decoding step) and several, below and above the sizes at
// which the work is split over OpenMP threads.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "core.h"
#include "kernels/cpu/gemm.h"

static float value(int i, int salt) { return (float)((i * 37 + salt * 11) % 23 - 11) / 8.0f; }

// C (M, N, ldc) = alpha op(A) op(B) + beta C, computed directly.
static void reference(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            C[(size_t)i * ldc + j] = (float)(alpha * s + beta * C[(size_t)i * ldc + j]);
        }
}

static void check_case(int ta, int tb, int M, int N, int K, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = neox_malloc(na * sizeof *A), *B = neox_malloc(nb * sizeof *B);
    float *C = neox_malloc(nc * sizeof *C), *R = neox_malloc(nc * sizeof *R);
    for (size_t i = 0; i < na; i++) A[i] = value((int)i, 1);
    for (size_t i = 0; i < nb; i++) B[i] = value((int)i, 2);
    for (size_t i = 0; i < nc; i++) C[i] = R[i] = value((int)i, 3);
    neox_cpu_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc);
    reference(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, R, ldc);
    for (size_t i = 0; i < nc; i++)
        if (fabsf(C[i] - R[i]) > 1e-4f * (1.0f + fabsf(R[i])))
            fail_msg("ta %d tb %d M %d N %d K %d beta %g: C[%zu] = %g, expected %g", ta, tb, M, N, K, beta, i, C[i], R[i]);
    free(A), free(B), free(C), free(R);
}

static void test_products(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 7, 5}, {1, 1, 1}, {1, 1200, 300}, {1, 300, 1200}, {3, 70, 9}, {64, 96, 48}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int beta = 0; beta < 2; beta++) check_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], (float)beta);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
