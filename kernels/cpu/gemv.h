// gemv.h: the one-row matrix product of a decoding step, y = alpha * W x + beta * y with W (N, K)
// row-major (a linear layer's weight, or the tied embedding as the classifier), in three builds of
// the same contract: the readable reference loop, AVX2 + FMA and AVX-512F; and the same product with
// W and x bfloat16 (16-bit precision's operands, rounded by neox_cast_f32_to_bf16) and fp32 sums:
// the reference, AVX2 + FMA (widening) and AVX512_BF16 (vdpbf16ps, which treats subnormal inputs
// and sums as zero, as the bfloat16 GEMM of kernels/cpu/gemm_bf16.c does). kernels/cpu/gemm.c calls
// the fastest build this CPU runs, picked once at run time; the unit test holds every build this CPU
// can run to a double-precision product, and tests/oracle/test_gemv_bf16.py the bfloat16 builds to
// numpy.
#ifndef NEOX_CPU_GEMV_H
#define NEOX_CPU_GEMV_H

#include <stdint.h>

// y[n] = alpha * sum_k W[n * ldw + k] * x[k] + beta * y[n] for n in [0, N); beta == 0 never reads y.
typedef void neox_gemv_rows_fn(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta,
                               float *y);

neox_gemv_rows_fn neox_gemv_rows_reference, neox_gemv_rows_avx2, neox_gemv_rows_avx512;

// The same with W and x bfloat16; the sums in fp32.
typedef void neox_gemv_bf16_rows_fn(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x,
                                    float beta, float *y);

neox_gemv_bf16_rows_fn neox_gemv_bf16_rows_reference, neox_gemv_bf16_rows_avx2, neox_gemv_bf16_rows_avx512;

// The build for this CPU: AVX-512F, else AVX2 + FMA, else the reference loop.
neox_gemv_rows_fn *neox_gemv_rows_best(void);
// The bfloat16 build for this CPU: AVX512_BF16, else AVX2 + FMA, else the reference loop.
neox_gemv_bf16_rows_fn *neox_gemv_bf16_rows_best(void);
// Whether this CPU runs each vector build (the unit test tries only those; AVX512_BF16's test is
// neox_cpu_has_avx512_bf16, gemm_bf16.h).
int neox_cpu_has_avx512f(void);
int neox_cpu_has_avx2_fma(void);

#endif
