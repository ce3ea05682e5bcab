// fp8.cu: precision fp8's ops on the GPU (kernels.h, "FP8"), as kernels/cpu/fp8.c computes them: the
// fused amax and scaled cast (kernels.h's own rounding, so the bytes are the CPU's), delayed
// scaling's update, and the FP8 product on cuBLASLt (E4M3/E5M2 operands, their scale inverses as
// cuBLASLt's A/B scale pointers, fp32 accumulation and result; compute capability 8.9 or newer).
// cuBLASLt's FP8 kernels take only the "TN" layout (in row-major terms op(A) = A, op(B) = B^T), so an
// operand in the other layout is transposed into scratch first, as Transformer Engine keeps
// transposed FP8 copies. Where cuBLASLt cannot run it (an older GPU, dimensions or strides not
// multiples of 16, no algorithm), the operands are widened to fp32 (exact) and multiplied there.
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

// ---- the fused amax and scaled cast --------------------------------------------------------------
// out, inp: (n); amax (one float, or NULL) gains the block maxima by atomicMax on its bits (non-negative
// floats order as their bit patterns), NaN passed over.
__global__ void fp8_cast_kernel(uint8_t *out, float *amax, const float *inp, size_t n, const float *scale,
                                neox_fp8_format fmt) {
    const float s = *scale;
    float largest = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i], a = fabsf(x);
        largest = a > largest ? a : largest;
        out[i] = neox_fp8_from_f32(x * s, fmt);
    }
    if (!amax) return;
    largest = block_max(largest);
    if (threadIdx.x == 0 && largest > 0.0f) atomicMax((unsigned int *)amax, __float_as_uint(largest));
}

extern "C" void neox_cuda_fp8_cast(uint8_t *out, float *amax, const float *inp, size_t n, const float *scale,
                                   neox_fp8_format fmt) {
    if (!n) return;
    fp8_cast_kernel<<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>(out, amax, inp, n, scale, fmt);
    CUDA_LAUNCHED();
}

// ---- delayed scaling's update: one thread per tensor ---------------------------------------------
__global__ void fp8_update_kernel(float *history, float *scale, float *scale_inv, int len, int ld, int n,
                                  float scaled_max, int algo_max) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) neox_fp8_update_one(history + j, len, ld, scale + j, scale_inv + j, scaled_max, algo_max);
}

extern "C" void neox_cuda_fp8_update_scales(float *history, float *scale, float *scale_inv, int len, int ld, int n,
                                            neox_fp8_format fmt, int margin, int algo_max) {
    if (n <= 0) return;
    float scaled_max = neox_fp8_max(fmt) * ldexpf(1.0f, -margin);
    fp8_update_kernel<<<(n + 127) / 128, 128, 0, neox_cuda_current_stream()>>>(history, scale, scale_inv, len, ld, n,
                                                                                scaled_max, algo_max);
    CUDA_LAUNCHED();
}

// ---- the product -----------------------------------------------------------------------------------
// Scratch of its own (the product needs up to three buffers at once), grown when needed.
typedef struct grown {
    void *p;
    size_t bytes;
} grown;

static void *grow(grown *g, size_t bytes) {
    if (bytes > g->bytes) {
        if (g->p) neox_cuda_free(g->p);  // (cudaFree waits for the ops that used it)
        g->p = neox_cuda_alloc(bytes);
        g->bytes = bytes;
    }
    return g->p;
}

// out (cols, rows) = in (rows, cols; row stride ld)^T, bytes. Grid-stride over out's elements.
__global__ void transpose_bytes_kernel(uint8_t *out, const uint8_t *in, int rows, int cols, int ld) {
    size_t n = (size_t)rows * cols;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        size_t c = k / rows, r = k % rows;
        out[k] = in[r * ld + c];
    }
}

static const uint8_t *transposed(grown *g, const uint8_t *in, int rows, int cols, int ld) {
    uint8_t *out = (uint8_t *)grow(g, (size_t)rows * cols);
    transpose_bytes_kernel<<<blocks_for((size_t)rows * cols, 256), 256, 0, neox_cuda_current_stream()>>>(out, in, rows,
                                                                                                          cols, ld);
    CUDA_LAUNCHED();
    return out;
}

static cudaDataType_t fp8_type(neox_fp8_format f) { return f == NEOX_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

static int fp8_capable(void) {
    static int known = -1;
    if (known < 0) {
        int device = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        known = major * 10 + minor >= 89;
    }
    return known;
}

static void lt_ok(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "neox cuda: FP8 product: %s failed: %s\n", what, cublasGetStatusString(st));
    abort();
}

// A cached cuBLASLt plan for one TN shape: C (M, N) = A (M, K) B (N, K)^T, row-major.
typedef struct fp8_plan {
    int used, found;
    int M, N, K, lda, ldb, ldc, fa, fb;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} fp8_plan;

enum { FP8_PLANS = 256 };
static fp8_plan g_fp8_plans[FP8_PLANS];

// In cuBLASLt's column-major view D' (N, M) = B' A'^T... its first operand is our B (N, K) read as
// (K, N) and transposed, its second our A read as (K, M): TRANSA = T, TRANSB = N, the FP8 layout.
static void make_fp8_plan(fp8_plan *p, neox_fp8_format fa, neox_fp8_format fb) {
    cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    lt_ok(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    lt_ok(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "TRANSA");
    lt_ok(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt), "TRANSB");
    lt_ok(cublasLtMatrixLayoutCreate(&p->a, fp8_type(fb), p->K, p->N, p->ldb), "layout A");
    lt_ok(cublasLtMatrixLayoutCreate(&p->b, fp8_type(fa), p->K, p->M, p->lda), "layout B");
    lt_ok(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, p->N, p->M, p->ldc), "layout C");
    cublasLtMatmulPreference_t pref;
    lt_ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    size_t ws_bytes;
    (void)neox_cuda_lt_workspace(&ws_bytes);
    uint64_t ws = ws_bytes;
    lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "WS");
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(neox_cuda_lt_handle(), p->op, p->a, p->b, p->c, p->c, pref, 1,
                                                       &result, &count);
    p->found = st == CUBLAS_STATUS_SUCCESS && count > 0;
    if (p->found) p->algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
}

static fp8_plan *fp8_plan_for(int M, int N, int K, int lda, int ldb, int ldc, neox_fp8_format fa, neox_fp8_format fb) {
    unsigned h = (unsigned)(M * 73856093) ^ (unsigned)(N * 19349663) ^ (unsigned)(K * 83492791) ^
                 (unsigned)(lda * 2654435761u) ^ (unsigned)(ldb * 40503) ^ (unsigned)ldc ^ (unsigned)(fa * 7 + fb * 13);
    for (int probe = 0; probe < FP8_PLANS; probe++) {
        fp8_plan *p = &g_fp8_plans[(h + (unsigned)probe) % FP8_PLANS];
        if (p->used && p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb && p->ldc == ldc &&
            p->fa == (int)fa && p->fb == (int)fb)
            return p;
        if (!p->used) {
            p->used = 1, p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldb = ldb, p->ldc = ldc;
            p->fa = (int)fa, p->fb = (int)fb;
            make_fp8_plan(p, fa, fb);
            return p;
        }
    }
    return NULL;
}

// The TN product on cuBLASLt: -1 when it has no algorithm for it.
static int gemm_fp8_lt(int M, int N, int K, const uint8_t *A, int lda, neox_fp8_format fa, const float *a_scale_inv,
                       const uint8_t *B, int ldb, neox_fp8_format fb, const float *b_scale_inv, float beta, float *C,
                       int ldc) {
    fp8_plan *p = fp8_plan_for(M, N, K, lda, ldb, ldc, fa, fb);
    if (!p || !p->found) return -1;
    // cuBLASLt's A is our B and its B our A, so their scales swap too.
    lt_ok(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv),
          "A_SCALE_POINTER");
    lt_ok(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv),
          "B_SCALE_POINTER");
    float alpha = 1.0f;
    size_t ws_bytes;
    void *ws = neox_cuda_lt_workspace(&ws_bytes);
    lt_ok(cublasLtMatmul(neox_cuda_lt_handle(), p->op, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c, &p->algo, ws,
                         ws_bytes, neox_cuda_current_stream()),
          "cublasLtMatmul");
    return 0;
}

// x (n) = FP8 bytes widened to fp32 (exact).
__global__ void widen_fp8_kernel(float *x, const uint8_t *in, size_t n, neox_fp8_format fmt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = neox_fp8_to_f32(in[i], fmt);
}

// C (M, N; ldc) = (*sa * *sb) * D (M, N packed) + beta * C, the scale inverses read on the device.
__global__ void scale_result_kernel(float *C, int ldc, const float *D, int M, int N, const float *sa, const float *sb,
                                    float beta) {
    float s = *sa * *sb;
    size_t n = (size_t)M * N;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        float *c = C + (k / N) * ldc + k % N;
        *c = beta != 0.0f ? s * D[k] + beta * *c : s * D[k];
    }
}

static const float *widened(grown *g, const uint8_t *in, size_t n, neox_fp8_format fmt) {
    float *x = (float *)grow(g, (n ? n : 1) * sizeof(float));
    widen_fp8_kernel<<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>(x, in, n, fmt);
    CUDA_LAUNCHED();
    return x;
}

static size_t extent(int rows, int cols, int ld) { return rows ? (size_t)(rows - 1) * ld + cols : 0; }

static int multiple_of_16(int x) { return x % 16 == 0; }

extern "C" void neox_cuda_gemm_fp8(int trans_a, int trans_b, int M, int N, int K, const uint8_t *A, int lda,
                                   neox_fp8_format fa, const float *a_scale_inv, const uint8_t *B, int ldb,
                                   neox_fp8_format fb, const float *b_scale_inv, float beta, float *C, int ldc) {
    static grown ta, tb, wa, wb, d;
    if (M <= 0 || N <= 0) return;
    int both_e5m2 = fa == NEOX_FP8_E5M2 && fb == NEOX_FP8_E5M2;  // (cuBLASLt takes at most one E5M2 operand)
    if (fp8_capable() && !both_e5m2 && multiple_of_16(M) && multiple_of_16(N) && multiple_of_16(K) &&
        multiple_of_16(lda) && multiple_of_16(ldb) && multiple_of_16(ldc)) {
        // As stored, A is (K, M) when transposed and (M, K) otherwise; B is (N, K) or (K, N).
        const uint8_t *a = trans_a ? transposed(&ta, A, K, M, lda) : A;
        const uint8_t *b = trans_b ? B : transposed(&tb, B, K, N, ldb);
        if (gemm_fp8_lt(M, N, K, a, trans_a ? K : lda, fa, a_scale_inv, b, trans_b ? ldb : K, fb, b_scale_inv, beta,
                        C, ldc) == 0)
            return;
    }
    const float *a = widened(&wa, A, trans_a ? extent(K, M, lda) : extent(M, K, lda), fa);
    const float *b = widened(&wb, B, trans_b ? extent(N, K, ldb) : extent(K, N, ldb), fb);
    float *D = (float *)grow(&d, (size_t)M * N * sizeof(float));
    neox_cuda_gemm(trans_a, trans_b, M, N, K, 1.0f, a, lda, b, ldb, NEOX_ELEM_F32, 0.0f, D, N, NEOX_ELEM_F32);
    scale_result_kernel<<<blocks_for((size_t)M * N, 256), 256, 0, neox_cuda_current_stream()>>>(
        C, ldc, D, M, N, a_scale_inv, b_scale_inv, beta);
    CUDA_LAUNCHED();
}
