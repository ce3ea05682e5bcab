// gemm_bf16.h: the bfloat16 matrix product of 16-bit precision on the CPU, C (fp32) = alpha op(A)
// op(B) + beta C with A and B bfloat16, in two builds of the same contract: the reference (each
// operand widened to fp32, then sgemm: products exact, sums in fp32) and AVX512_BF16 (vdpbf16ps on
// operands packed in pairs along K, sums in fp32; the instruction flushes subnormal inputs and
// results to zero, as torch's oneDNN kernels on these CPUs do). neox_gemm_ex takes the fastest build
// this CPU runs; the unit test holds each to a double-precision product.
#ifndef NEOX_CPU_GEMM_BF16_H
#define NEOX_CPU_GEMM_BF16_H

#include <stdint.h>

// op(A) is (M, K): A (M, K) row-major with stride lda, or (K, M) when trans_a; op(B) is (K, N): B
// (K, N), or (N, K) when trans_b. beta == 0 never reads C.
typedef void neox_gemm_bf16_fn(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                               const uint16_t *B, int ldb, float beta, float *C, int ldc);

neox_gemm_bf16_fn neox_gemm_bf16_reference, neox_gemm_bf16_avx512;

// C (M, N; row stride ldc, bf16) = alpha op(A) op(B) + addend, each element's fp32 sum rounded once
// (kernels.h's neox_bf16_from_f32); the addend is bias[j] (bias given), C's old value widened
// (accumulate; not with a bias) or nothing: the same bits as the product into fp32 rows holding the
// addend (beta 1) rounded afterwards, without the rows (a linear layer's output or input gradient
// under bf16 storage). Done only by the AVX512_BF16 build, and only where neox_gemm_ex takes its
// packed product (not a decoding step's at most NEOX_DECODE_MAX_ROWS rows against B (N, K)); returns
// 0 (C untouched) where it is not done, 1 where it is.
int neox_gemm_bf16_rounded(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, const float *bias, int accumulate, uint16_t *C, int ldc);

// AVX512_BF16 when this CPU has it, else the reference.
neox_gemm_bf16_fn *neox_gemm_bf16_best(void);
int neox_cpu_has_avx512_bf16(void);

#endif
