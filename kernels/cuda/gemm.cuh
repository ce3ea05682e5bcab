// gemm.cuh: the row-major GEMM on cuBLAS shared by the CUDA ops (kernels/cuda/linear.cu), and the
// deterministic column sums used for bias and norm-weight gradients (kernels/cuda/reduce.cu).
#ifndef NEOX_CUDA_GEMM_CUH
#define NEOX_CUDA_GEMM_CUH

#include <cublas_v2.h>

#include "kernels/kernels.h"

cublasHandle_t neox_cuda_cublas(void);
int neox_cuda_tf32(void);

// Row-major C = alpha op(A) op(B) + beta C as cblas_sgemm takes it, any element types of kernels.h.
void neox_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                    const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c);

// acc[c] += sum over rows i of a[i*lda + c] * (b ? (b[i*C + c] - (shift ? shift[i] : 0)) * scale[i] : 1),
// summed in a fixed order (partial sums over fixed row chunks, then the chunks in order).
void neox_cuda_column_sums(float *acc, const float *a, int lda, const float *b, const float *shift,
                           const float *scale, int N, int C);
// The same with a and b activations of storage type act (kernels.h, "Activation storage").
void neox_cuda_column_sums_act(float *acc, const void *a, int lda, const void *b, const float *shift,
                               const float *scale, int N, int C, neox_elem act);
// Its two halves, for kernels that make the partial sums themselves (the fused norm backward): the
// row chunks for N rows (returns their count; rows of each in *rows_per_chunk; the partial sums of
// chunk k are of rows k * rows_per_chunk .. in 8 lanes, lane l taking rows l, l + 8, ..., then the
// lanes in order), and acc[c] += partial (chunks, C) summed over the chunks in order.
int neox_cuda_column_chunks(int N, int *rows_per_chunk);
void neox_cuda_column_finish(float *acc, const float *partial, int chunks, int C);

#endif
