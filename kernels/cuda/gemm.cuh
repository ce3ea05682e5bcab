// gemm.cuh: the row-major matrix products shared by the CUDA ops (kernels/cuda/linear.cu): one owner,
// neox_cuda_matmul, that runs a product on cuBLASLt with an epilogue (bias, bias gradient, GELU) and
// falls back to cuBLAS (cublasGemmEx) with separate kernels for the epilogue when cuBLASLt has no
// algorithm for it; and the deterministic column sums used for bias and norm-weight gradients
// (kernels/cuda/reduce.cu).
#ifndef NEOX_CUDA_GEMM_CUH
#define NEOX_CUDA_GEMM_CUH

#include <cublasLt.h>
#include <cublas_v2.h>

#include "kernels/kernels.h"

cublasHandle_t neox_cuda_cublas(void);
// The cuBLASLt handle and the workspace (its size in *bytes) every cuBLASLt product shares (linear.cu).
cublasLtHandle_t neox_cuda_lt_handle(void);
void *neox_cuda_lt_workspace(size_t *bytes);
int neox_cuda_tf32(void);

// What a product does to its result before storing it (cuBLASLt's epilogues), in row-major terms:
//   NONE        C = alpha op(A) op(B) + beta C
//   BIAS        C = alpha op(A) op(B) + beta C + bias (bias: (N) fp32, added to every row)
//   BGRADB      C as NONE, and bias (M) fp32 is overwritten with the sums over K of op(A)'s rows
//               (the bias gradient of a weight-gradient product dW = dout^T inp: dbias = dout's column sums)
//   GELU_AUX_BIAS  aux = alpha op(A) op(B) + bias (the pre-activation, kept for backward), C = gelu(aux)
//   DGELU       C = (alpha op(A) op(B)) * gelu'(aux) (the gradient through the activation)
//   DGELU_BGRAD C as DGELU, and bias (N) fp32 is overwritten with C's column sums (the bias gradient
//               of the linear whose output aux was)
// GELU is the tanh approximation (cuBLASLt's, kernels/activation_math.h's neox_gelu_tanh): use the GELU
// epilogues only where neox_cuda_epilogue_gelu_matches says the model's function is that one. aux
// is (M, N) with row stride ldaux, of C's element type; the GELU epilogues need beta = 0.
typedef enum neox_cuda_epilogue {
    NEOX_CUDA_EPI_NONE, NEOX_CUDA_EPI_BIAS, NEOX_CUDA_EPI_BGRADB, NEOX_CUDA_EPI_GELU_AUX_BIAS, NEOX_CUDA_EPI_DGELU,
    NEOX_CUDA_EPI_DGELU_BGRAD
} neox_cuda_epilogue;

// A row-major product C (M, N; row stride ldc) = alpha op(A) op(B) + beta C as cblas_sgemm takes it,
// A and B of element type ab, C of type c (fp32 accumulation; TF32 for fp32 operands only when
// neox_cuda_set_tf32 allowed it), with an epilogue.
typedef struct neox_cuda_matmul_args {
    int trans_a, trans_b, M, N, K;
    float alpha, beta;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    neox_elem ab;
    void *C;
    int ldc;
    neox_elem c;
    neox_cuda_epilogue epilogue;
    float *bias;  // BIAS, GELU_AUX_BIAS: read; BGRADB: written
    void *aux;    // GELU_AUX_BIAS: written; DGELU: read
    int ldaux;
} neox_cuda_matmul_args;

// The one place that chooses how a product runs: cuBLASLt (its heuristic's algorithm for the shape,
// cached), else cuBLAS with the epilogue as separate kernels. The same result either way up to
// summation order.
void neox_cuda_matmul(const neox_cuda_matmul_args *g);
// Whether cuBLASLt's GELU epilogues compute the model's activation function: only the tanh
// approximation (GPT-NeoX's bias_gelu_fusion, HF "gelu_new"); the exact erf GELU is not fused.
int neox_cuda_epilogue_gelu_matches(neox_act_fn fn);

// Row-major C = alpha op(A) op(B) + beta C as cblas_sgemm takes it, any element types of kernels.h
// (neox_cuda_matmul without an epilogue).
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
