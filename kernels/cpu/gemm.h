// gemm.h: the CPU backend's matrix multiply (kernels/cpu/gemm.c), shared by the kernels that need
// one. Row-major, as cblas_sgemm with CblasRowMajor: C = alpha * op(A) op(B) + beta * C, op(A) (M, K),
// op(B) (K, N), trans_* nonzero for the transposed operand.
#ifndef NEOX_CPU_GEMM_H
#define NEOX_CPU_GEMM_H

void neox_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

#endif
