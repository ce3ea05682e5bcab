// gemm.h: the CPU backend's matrix multiply (kernels/cpu/gemm.c), shared by the kernels that need
// one. Row-major, as cblas_sgemm with CblasRowMajor: C = alpha * op(A) op(B) + beta * C, op(A) (M, K),
// op(B) (K, N), trans_* nonzero for the transposed operand.
#ifndef NEOX_CPU_GEMM_H
#define NEOX_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

void neox_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);
// Rows of B (N, K; elem bytes each) per chunk of a product of M rows (M <= NEOX_DECODE_MAX_ROWS)
// whose chunks the threads take one at a time: about eight per thread, and for M > 1 few enough
// that a chunk stays in a core's cache while every row of A meets it.
int neox_cpu_gemv_chunk_rows(int M, int N, int K, size_t elem);
// The one-row kernels gemm.c uses on this CPU (gemv.h), fp32 and bfloat16.
void neox_cpu_gemv_rows(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y);
void neox_cpu_gemv_bf16_rows(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x, float beta,
                             float *y);

#endif
