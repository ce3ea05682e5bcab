// fp8.c: the CPU reference of precision fp8's ops (kernels.h, "FP8"): the scaled cast with its amax,
// the FP8 product and delayed scaling's update. The CPU has no FP8 arithmetic: the product widens
// its operands to bfloat16, which holds every E4M3 and E5M2 value exactly, and multiplies them as
// bfloat16 precision does, so the emulated device (these ops) equals the CPU bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "parallel.h"

void neox_fp8_cast(uint8_t *out, float *amax, const float *inp, size_t n, const float *scale, neox_fp8_format fmt) {
    const float s = *scale;
    float largest = 0.0f;
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS) reduction(max : largest)
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(inp[i]);
        if (a > largest) largest = a;  // (NaN compares false: ignored, as fmaxf ignores it)
        out[i] = neox_fp8_from_f32(inp[i] * s, fmt);
    }
    if (amax && largest > *amax) *amax = largest;
}

static size_t extent(size_t rows, size_t cols, size_t ld) { return rows ? (rows - 1) * ld + cols : 0; }

// The bfloat16 copy of an FP8 matrix stored (rows, cols) with row stride ld (exact).
static uint16_t *widen_fp8(const uint8_t *x, size_t rows, size_t cols, size_t ld, neox_fp8_format fmt) {
    size_t n = extent(rows, cols, ld);
    uint16_t *w = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!w) {
        fprintf(stderr, "neox_gemm_fp8: out of memory widening a %zux%zu operand\n", rows, cols);
        abort();
    }
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) w[i] = neox_bf16_from_f32(neox_fp8_to_f32(x[i], fmt));
    return w;
}

void neox_gemm_fp8(int trans_a, int trans_b, int M, int N, int K, const uint8_t *A, int lda, neox_fp8_format fa,
                   const float *a_scale_inv, const uint8_t *B, int ldb, neox_fp8_format fb, const float *b_scale_inv,
                   float beta, float *C, int ldc) {
    // As stored, A is (K, M) when transposed and (M, K) otherwise; B is (N, K) or (K, N).
    uint16_t *a = trans_a ? widen_fp8(A, K, M, lda, fa) : widen_fp8(A, M, K, lda, fa);
    uint16_t *b = trans_b ? widen_fp8(B, N, K, ldb, fb) : widen_fp8(B, K, N, ldb, fb);
    neox_gemm_ex(trans_a, trans_b, M, N, K, *a_scale_inv * *b_scale_inv, a, lda, b, ldb, NEOX_ELEM_BF16, beta, C, ldc,
                 NEOX_ELEM_F32);
    free(a);
    free(b);
}

void neox_fp8_update_scales(float *history, float *scale, float *scale_inv, int len, int ld, int n, neox_fp8_format fmt,
                            int margin, int algo_max) {
    const float scaled_max = neox_fp8_max(fmt) * ldexpf(1.0f, -margin);
    for (int j = 0; j < n; j++) neox_fp8_update_one(history + j, len, ld, scale + j, scale_inv + j, scaled_max, algo_max);
}
