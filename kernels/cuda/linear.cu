// linear.cu: matrix products on cuBLAS (cublasGemmEx, fp32 accumulation; TF32 tensor cores for fp32
// inputs only when neox_cuda_set_tf32 allowed them) and torch.nn.Linear forward and backward on
// top of them, as kernels/cpu/linear.c does it: forward = broadcast bias then GEMM with beta = 1,
// backward = two GEMMs and the bias gradient's column sums.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

static cudaDataType_t data_type(neox_elem e) {
    return e == NEOX_ELEM_BF16 ? CUDA_R_16BF : e == NEOX_ELEM_F16 ? CUDA_R_16F : CUDA_R_32F;
}

void neox_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                    const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    if (M <= 0 || N <= 0) return;
    // cuBLAS is column-major: the row-major (M, N) C is the column-major (N, M) C^T = op(B)^T op(A)^T,
    // and a row-major operand read column-major is its transpose, so B goes first with the same flags.
    cublasComputeType_t compute =
        ab == NEOX_ELEM_F32 && neox_cuda_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasStatus_t st = cublasGemmEx(neox_cuda_cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, data_type(ab), ldb, A,
                                     data_type(ab), lda, &beta, C, data_type(c), ldc, compute, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "neox cuda: cublasGemmEx(%c%c, M=%d N=%d K=%d, lda=%d ldb=%d ldc=%d) failed: %s\n",
                trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, lda, ldb, ldc, cublasGetStatusString(st));
        abort();
    }
}

extern "C" void neox_cuda_gemm_ex(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                                  const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    neox_cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, ab, beta, C, ldc, c);
}

// out: (N, ldo), each row's first OC columns = bias. Grid: (column blocks, rows).
__global__ void broadcast_rows_kernel(float *out, int ldo, const float *bias, int N, int OC) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = blockIdx.y; i < N; i += gridDim.y)
        if (c < OC) out[(size_t)i * ldo + c] = bias[c];
}

extern "C" void neox_cuda_linear_forward(float *out, int ldo, const float *inp, const float *weight, const float *bias,
                                         int N, int IC, int OC) {
    if (bias && N > 0) {
        dim3 grid((OC + 255) / 256, N < 65535 ? N : 65535);
        broadcast_rows_kernel<<<grid, 256, 0, neox_cuda_current_stream()>>>(out, ldo, bias, N, OC);
        CUDA_LAUNCHED();
    }
    neox_cuda_gemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, NEOX_ELEM_F32, bias ? 1.0f : 0.0f, out, ldo,
                   NEOX_ELEM_F32);
}

extern "C" void neox_cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, int ldo,
                                          const float *inp, const float *weight, int N, int IC, int OC, int accumulate) {
    if (dinp)  // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        neox_cuda_gemm(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, NEOX_ELEM_F32, accumulate ? 1.0f : 0.0f, dinp, IC,
                       NEOX_ELEM_F32);
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC); NULL when only dinp or dbias is wanted
    if (dweight) neox_cuda_gemm(1, 0, OC, IC, N, 1.0f, dout, ldo, inp, IC, NEOX_ELEM_F32, 1.0f, dweight, IC, NEOX_ELEM_F32);
    if (dbias) neox_cuda_column_sums(dbias, dout, ldo, NULL, NULL, NULL, N, OC);
}
