// linear.cu: matrix products and torch.nn.Linear forward and backward on them, as kernels/cpu/
// linear.c computes them. One owner runs every product (neox_cuda_matmul): cuBLASLt with the
// epilogue fused (the bias in forward, the bias gradient in backward, GELU-tanh and its derivative
// for the MLP), its heuristic's algorithm cached per shape and a 32 MiB workspace allocated once;
// where cuBLASLt offers no algorithm, cuBLAS (cublasGemmEx) with the epilogue as separate kernels.
// fp32 accumulation throughout; TF32 tensor cores for fp32 operands only when neox_cuda_set_tf32
// allowed them. The linear ops also take bf16 activations (and the weights' bf16 copy) through fp32
// rows rounded once ("bf16 activation storage" below).
#include <cublasLt.h>
#include <string.h>

#include "kernels/activation_math.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

static cudaDataType_t data_type(neox_elem e) {
    return e == NEOX_ELEM_BF16 ? CUDA_R_16BF : e == NEOX_ELEM_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static cublasComputeType_t compute_type(neox_elem ab) {
    return ab == NEOX_ELEM_F32 && neox_cuda_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static int g_use_lt = 1;
static long g_lt_runs, g_fallbacks;

extern "C" void neox_cuda_set_cublaslt(int allow) { g_use_lt = allow != 0; }
extern "C" void neox_cuda_matmul_counts(long *lt, long *fallback) { *lt = g_lt_runs, *fallback = g_fallbacks; }

int neox_cuda_epilogue_gelu_matches(neox_act_fn fn) {
    return neox_linear_act_route(fn, NEOX_ELEM_F32) == NEOX_EPILOGUE_CUBLASLT;
}

// ---- the cuBLAS path ----------------------------------------------------------------------------
static void gemm_cublas(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    // cuBLAS is column-major: the row-major (M, N) C is the column-major (N, M) C^T = op(B)^T op(A)^T,
    // and a row-major operand read column-major is its transpose, so B goes first with the same flags.
    cublasStatus_t st = cublasGemmEx(neox_cuda_cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, data_type(ab), ldb, A,
                                     data_type(ab), lda, &beta, C, data_type(c), ldc, compute_type(ab),
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "neox cuda: cublasGemmEx(%c%c, M=%d N=%d K=%d, lda=%d ldb=%d ldc=%d) failed: %s\n",
                trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, lda, ldb, ldc, cublasGetStatusString(st));
        abort();
    }
}

// c: (N, ldc) fp32, each row's first OC columns = bias. Grid: (column blocks, rows).
__global__ void broadcast_rows_kernel(float *c, int ldc, const float *bias, int N, int OC) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = blockIdx.y; i < N; i += gridDim.y)
        if (j < OC) c[(size_t)i * ldc + j] = bias[j];
}

static void broadcast_rows(float *c, int ldc, const float *bias, int N, int OC) {
    dim3 grid((OC + 255) / 256, N < 65535 ? N : 65535);
    broadcast_rows_kernel<<<grid, 256, 0, neox_cuda_current_stream()>>>(c, ldc, bias, N, OC);
    CUDA_LAUNCHED();
}

// c: (M, ldc) fp32 rows, elementwise: GELU_AUX_BIAS keeps the pre-activation in aux and writes
// gelu(aux) to c; DGELU multiplies c by gelu'(aux). One thread per element, grid-stride.
__global__ void gelu_epilogue_kernel(float *c, int ldc, float *aux, int ldaux, int M, int N, int backward) {
    size_t n = (size_t)M * N;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k / N, j = k % N;
        float *x = c + i * ldc + j, *a = aux + i * ldaux + j;
        if (backward) *x = neox_gelu_tanh_grad(*a) * *x;
        else *a = *x, *x = neox_gelu_tanh(*x);
    }
}

// A caller's misuse of neox_cuda_matmul (no input can cause it): report and stop.
static void require(int ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "neox cuda: internal error: %s (a bug in neox.c; please report)\n", what);
    abort();
}

// The epilogue as separate kernels around a plain product (the fallback): the bias broadcast first
// under beta = 0 (then added by the product's beta = 1), the rest after.
static void fallback_matmul(const neox_cuda_matmul_args *g) {
    int with_bias = (g->epilogue == NEOX_CUDA_EPI_BIAS || g->epilogue == NEOX_CUDA_EPI_GELU_AUX_BIAS) && g->bias;
    require(g->beta == 0.0f || g->epilogue == NEOX_CUDA_EPI_NONE || g->epilogue == NEOX_CUDA_EPI_BGRADB,
            "a bias or GELU epilogue with beta != 0");
    require(g->epilogue == NEOX_CUDA_EPI_NONE || g->epilogue == NEOX_CUDA_EPI_BGRADB || g->c == NEOX_ELEM_F32,
            "the fallback's bias and GELU epilogues take fp32 results");
    if (with_bias) broadcast_rows((float *)g->C, g->ldc, g->bias, g->M, g->N);
    gemm_cublas(g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->ab,
                with_bias ? 1.0f : g->beta, g->C, g->ldc, g->c);
    if (g->epilogue == NEOX_CUDA_EPI_BGRADB) {  // op(A) is (M, K): its rows' sums are the columns of A^T
        require(g->trans_a, "BGRADB takes dout as A^T");
        CUDA_CHECK(cudaMemsetAsync(g->bias, 0, (size_t)g->M * sizeof(float), neox_cuda_current_stream()));
        neox_cuda_column_sums_act(g->bias, g->A, g->lda, NULL, NULL, NULL, g->K, g->M, g->ab);
    }
    int dgelu = g->epilogue == NEOX_CUDA_EPI_DGELU || g->epilogue == NEOX_CUDA_EPI_DGELU_BGRAD;
    if (g->epilogue == NEOX_CUDA_EPI_GELU_AUX_BIAS || dgelu) {
        gelu_epilogue_kernel<<<blocks_for((size_t)g->M * g->N, 256), 256, 0, neox_cuda_current_stream()>>>(
            (float *)g->C, g->ldc, (float *)g->aux, g->ldaux, g->M, g->N, dgelu);
        CUDA_LAUNCHED();
    }
    if (g->epilogue == NEOX_CUDA_EPI_DGELU_BGRAD) {  // the bias gradient: C's column sums
        CUDA_CHECK(cudaMemsetAsync(g->bias, 0, (size_t)g->N * sizeof(float), neox_cuda_current_stream()));
        neox_cuda_column_sums(g->bias, (const float *)g->C, g->ldc, NULL, NULL, NULL, g->M, g->N);
    }
}

// ---- the cuBLASLt path ----------------------------------------------------------------------------
enum { LT_WORKSPACE = 32 << 20, LT_CACHE = 1024 };

static cublasLtHandle_t lt_handle(void) {
    static cublasLtHandle_t h;
    if (!h && cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "neox cuda: cuBLASLt did not start\n");
        abort();
    }
    return h;
}

// Allocated on first use, from the backend's allocator (so the device peak counts it), never freed.
static void *lt_workspace(void) {
    static void *w;
    if (!w) w = neox_cuda_alloc(LT_WORKSPACE);
    return w;
}

// The handle and workspace for the other cuBLASLt products (kernels/cuda/fp8.cu's FP8 GEMMs).
cublasLtHandle_t neox_cuda_lt_handle(void) { return lt_handle(); }
void *neox_cuda_lt_workspace(size_t *bytes) {
    *bytes = LT_WORKSPACE;
    return lt_workspace();
}

// What the heuristic's choice depends on: the shapes, types, epilogue, and the operands' alignments.
typedef struct lt_key {
    int trans_a, trans_b, M, N, K, lda, ldb, ldc, ldaux;
    int ab, c, epilogue, compute, beta_zero;
    int align_a, align_b, align_c, align_aux;
} lt_key;

// A cached plan: the descriptors of the product and the algorithm (found 0: cuBLASLt has none).
typedef struct lt_plan {
    int used, found;
    lt_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

static lt_plan g_plans[LT_CACHE];

// The largest power of two up to 256 dividing the address (what cuBLASLt's kernels may assume).
static int alignment(const void *p) {
    uintptr_t x = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(x & (uintptr_t)a)) a <<= 1;
    return a;
}

static lt_key key_of(const neox_cuda_matmul_args *g) {
    lt_key k;
    memset(&k, 0, sizeof k);  // (padding too: the key is hashed and compared as bytes)
    k.trans_a = g->trans_a, k.trans_b = g->trans_b, k.M = g->M, k.N = g->N, k.K = g->K;
    k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc, k.ldaux = g->aux ? g->ldaux : 0;
    k.ab = g->ab, k.c = g->c, k.epilogue = g->epilogue, k.compute = compute_type(g->ab), k.beta_zero = g->beta == 0.0f;
    k.align_a = alignment(g->A), k.align_b = alignment(g->B), k.align_c = alignment(g->C);
    k.align_aux = g->aux ? alignment(g->aux) : 0;
    return k;
}

static uint64_t hash_key(const lt_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "neox cuda: %s failed: %s\n", what, cublasGetStatusString(st));
    abort();
}

static cublasLtEpilogue_t lt_epilogue(neox_cuda_epilogue e) {
    switch (e) {
    case NEOX_CUDA_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case NEOX_CUDA_EPI_BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
    case NEOX_CUDA_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case NEOX_CUDA_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case NEOX_CUDA_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

// The column-major view cuBLAS takes (see gemm_cublas): D' (N, M) = op(B)' op(A)', so cuBLASLt's
// first operand is our B and its second our A; the bias runs along D's rows (our columns, N) and
// BGRADB sums its second operand (our op(A)) into M values.
static void make_plan(lt_plan *p, const neox_cuda_matmul_args *g) {
    cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescCreate(&p->op, compute_type(g->ab), CUDA_R_32F), "cublasLtMatmulDescCreate");
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    cublasLtEpilogue_t epi = lt_epilogue(g->epilogue);
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
    if (g->epilogue != NEOX_CUDA_EPI_NONE && g->epilogue != NEOX_CUDA_EPI_DGELU) {  // our biases are fp32
        cudaDataType_t bt = CUDA_R_32F;
        lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "BIAS_TYPE");
    }
    if (g->aux) {
        int64_t ld = g->ldaux;
        lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), "AUX_LD");
    }
    // Layouts (rows, columns, leading dimension) of the stored column-major matrices.
    int b_rows = g->trans_b ? g->K : g->N, b_cols = g->trans_b ? g->N : g->K;
    int a_rows = g->trans_a ? g->M : g->K, a_cols = g->trans_a ? g->K : g->M;
    lt_check(cublasLtMatrixLayoutCreate(&p->a, data_type(g->ab), b_rows, b_cols, g->ldb), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&p->b, data_type(g->ab), a_rows, a_cols, g->lda), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&p->c, data_type(g->c), g->N, g->M, g->ldc), "layout C");
    cublasLtMatmulPreference_t pref;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t ws = LT_WORKSPACE;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "WS");
    uint32_t al[4] = {(uint32_t)p->key.align_b, (uint32_t)p->key.align_a, (uint32_t)p->key.align_c,
                      (uint32_t)p->key.align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) lt_check(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]), "ALIGN");
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &count);
    p->found = st == CUBLAS_STATUS_SUCCESS && count > 0;
    if (p->found) p->algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
}

// The plan for g's key, made on first sight; a full table makes no more (NULL: the fallback).
static lt_plan *plan_for(const neox_cuda_matmul_args *g) {
    lt_key k = key_of(g);
    uint64_t h = hash_key(&k);
    for (int probe = 0; probe < LT_CACHE; probe++) {
        lt_plan *p = &g_plans[(h + (uint64_t)probe) % LT_CACHE];
        if (p->used && !memcmp(&p->key, &k, sizeof k)) return p;
        if (!p->used) {
            p->used = 1, p->key = k;
            make_plan(p, g);
            return p;
        }
    }
    return NULL;
}

static void set_pointer(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const void *ptr) {
    lt_check(cublasLtMatmulDescSetAttribute(op, attr, &ptr, sizeof ptr), "epilogue pointer");
}

static int matmul_lt(const neox_cuda_matmul_args *g) {
    lt_plan *p = plan_for(g);
    if (!p || !p->found) return -1;
    if (g->bias) set_pointer(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g->bias);
    if (g->aux) set_pointer(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g->aux);
    lt_check(cublasLtMatmul(lt_handle(), p->op, &g->alpha, g->B, p->a, g->A, p->b, &g->beta, g->C, p->c, g->C, p->c,
                            &p->algo, lt_workspace(), LT_WORKSPACE, neox_cuda_current_stream()),
             "cublasLtMatmul");
    return 0;
}

void neox_cuda_matmul(const neox_cuda_matmul_args *g) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g_use_lt && matmul_lt(g) == 0) {
        g_lt_runs++;
        return;
    }
    g_fallbacks++;
    fallback_matmul(g);
}

void neox_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                    const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    neox_cuda_matmul_args g = {trans_a, trans_b, M, N, K, alpha, beta, A, lda, B, ldb, ab, C, ldc, c,
                               NEOX_CUDA_EPI_NONE, NULL, NULL, 0};
    neox_cuda_matmul(&g);
}

// A small buffer of its own for the bias gradient's sums and a zero bias (the shared scratch may be
// taken by the product's fallback kernels), grown when needed.
static float *bias_buffer(int n) {
    static float *buf;
    static int cap;
    if (n > cap) {
        if (buf) neox_cuda_free(buf);  // (cudaFree waits for the ops that used it)
        buf = (float *)neox_cuda_alloc((size_t)n * sizeof(float));
        cap = n;
    }
    return buf;
}

// ---- the ops --------------------------------------------------------------------------------------
extern "C" void neox_cuda_gemm_ex(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                                  const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    neox_cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, ab, beta, C, ldc, c);
}

// ---- bf16 activation storage (kernels.h, "Activation storage") ---------------------------------
// Products of 16-bit operands accumulate in fp32 and are rounded once as they are stored, as the
// CPU's kernels/cpu/linear.c rounds them. A product with no bias is stored in the operand type by
// cuBLASLt itself (dinp's old value widened and added under beta = 1, then rounded: the CPU's order of
// rounding). cuBLASLt's bias epilogue takes a bias of the output's type only, and ours are fp32, so a
// biased product goes into fp32 rows with the bias in the epilogue, then is rounded as it is stored.

// rows (N, C; fp32, packed) -> x (N, C; row stride ld, type S). One thread per element, grid-stride.
template <typename S> __global__ void store_rows_kernel(S *x, int ld, const float *rows, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        act_store(x, (k / C) * ld + k % C, rows[k]);
}

static void store_rows(void *x, int ld, const float *rows, int N, int C, neox_elem act) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    ACT_DISPATCH(act, S, store_rows_kernel<S><<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>(
                             (S *)x, ld, rows, N, C));
    CUDA_LAUNCHED();
}


static void forward16(void *out, int ldo, const void *inp, const void *weight, const float *bias, int N, int IC, int OC,
                      neox_elem act) {
    if (!bias) {
        neox_cuda_gemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, act, 0.0f, out, ldo, act);
        return;
    }
    if (neox_linear_bias_route(act, ldo, OC) == NEOX_EPILOGUE_CUDNN &&
        neox_cuda_linear_bias_cudnn_forward(out, inp, weight, bias, N, IC, OC))
        return;
    float *rows = (float *)neox_cuda_scratch((size_t)N * OC * sizeof(float));
    neox_cuda_matmul_args g = {0, 1, N, OC, IC, 1.0f, 0.0f, inp, IC, weight, IC, act, rows, OC, NEOX_ELEM_F32,
                               bias ? NEOX_CUDA_EPI_BIAS : NEOX_CUDA_EPI_NONE, (float *)bias, NULL, 0};
    neox_cuda_matmul(&g);
    store_rows(out, ldo, rows, N, OC, act);
}

// dweight (OC, IC; fp32) += dout^T (OC, N) @ inp (N, IC), operands of type ab, with dbias += dout's
// column sums made by the same product (BGRADB, which overwrites: into scratch, then added) when both
// are asked for, so dout is not read again for them.
static void weight_grads(float *dweight, float *dbias, const void *dout, int ldo, const void *inp, int N, int IC,
                         int OC, neox_elem ab) {
    float *sums = dbias ? bias_buffer(OC) : NULL;
    neox_cuda_matmul_args g = {1, 0, OC, IC, N, 1.0f, 1.0f, dout, ldo, inp, IC, ab, dweight, IC,
                               NEOX_ELEM_F32, dbias ? NEOX_CUDA_EPI_BGRADB : NEOX_CUDA_EPI_NONE, sums, NULL, 0};
    neox_cuda_matmul(&g);
    if (dbias) neox_cuda_add_inplace(dbias, sums, (size_t)OC);
}

static void backward16(void *dinp, float *dweight, float *dbias, const void *dout, int ldo, const void *inp,
                       const void *weight, int N, int IC, int OC, int accumulate, neox_elem act) {
    if (dinp)  // dinp (N, IC) (+)= dout (N, OC) @ weight (OC, IC), stored in the operand type
        neox_cuda_gemm(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, act, accumulate ? 1.0f : 0.0f, dinp, IC, act);
    if (dweight) weight_grads(dweight, dbias, dout, ldo, inp, N, IC, OC, act);  // dbias by the same product
    else if (dbias) neox_cuda_column_sums_act(dbias, dout, ldo, NULL, NULL, NULL, N, OC, act);
}

// out (N, ldo) = inp (N, IC) @ weight (OC, IC)^T (+ bias in the epilogue).
extern "C" void neox_cuda_linear_forward(void *out, int ldo, const void *inp, const void *weight, const float *bias,
                                         int N, int IC, int OC, neox_elem act) {
    if (act != NEOX_ELEM_F32) {
        forward16(out, ldo, inp, weight, bias, N, IC, OC, act);
        return;
    }
    neox_cuda_matmul_args g = {0, 1, N, OC, IC, 1.0f, 0.0f, inp, IC, weight, IC, NEOX_ELEM_F32, out, ldo,
                               NEOX_ELEM_F32, bias ? NEOX_CUDA_EPI_BIAS : NEOX_CUDA_EPI_NONE, (float *)bias, NULL, 0};
    neox_cuda_matmul(&g);
}


extern "C" void neox_cuda_linear_backward(void *dinp, float *dweight, float *dbias, const void *dout, int ldo,
                                          const void *inp, const void *weight, int N, int IC, int OC, int accumulate,
                                          neox_elem act) {
    if (act != NEOX_ELEM_F32) {
        backward16(dinp, dweight, dbias, dout, ldo, inp, weight, N, IC, OC, accumulate, act);
        return;
    }
    if (dinp)  // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        neox_cuda_gemm(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, NEOX_ELEM_F32, accumulate ? 1.0f : 0.0f, dinp, IC,
                       NEOX_ELEM_F32);
    const float *d = (const float *)dout;
    if (dweight) weight_grads(dweight, dbias, d, ldo, inp, N, IC, OC, NEOX_ELEM_F32);  // NULL: only dinp or dbias
    else if (dbias) neox_cuda_column_sums(dbias, d, ldo, NULL, NULL, NULL, N, OC);
}

extern "C" void neox_cuda_linear_gelu_forward(float *out, float *pre, const float *inp, const float *weight,
                                              const float *bias, int N, int IC, int OC) {
    neox_cuda_matmul_args g = {0, 1, N, OC, IC, 1.0f, 0.0f, inp, IC, weight, IC, NEOX_ELEM_F32, out, OC,
                               NEOX_ELEM_F32, NEOX_CUDA_EPI_GELU_AUX_BIAS, (float *)bias, pre, OC};
    if (!bias) {  // cuBLASLt's GELU_AUX without a bias: a zero bias keeps one epilogue (and one plan kind)
        g.bias = bias_buffer(OC);
        CUDA_CHECK(cudaMemsetAsync(g.bias, 0, (size_t)OC * sizeof(float), neox_cuda_current_stream()));
    }
    neox_cuda_matmul(&g);
}

extern "C" void neox_cuda_linear_dgelu_backward(float *dpre, const float *dout, const float *weight, const float *pre,
                                                int N, int IC, int OC) {
    neox_cuda_matmul_args g = {0, 0, N, IC, OC, 1.0f, 0.0f, dout, OC, weight, IC, NEOX_ELEM_F32, dpre, IC,
                               NEOX_ELEM_F32, NEOX_CUDA_EPI_DGELU, NULL, (void *)pre, IC};
    neox_cuda_matmul(&g);
}

// The backend's fused linear + activation (kernels.h), where the route's rule sends each call
// (kernels/linear_act_route.c): cuBLASLt's GELU epilogues (fp32, GELU's tanh approximation), one cuDNN
// graph (bf16, either GELU; linear_act_cudnn.cu, which may find no plan), else the linear and
// activation ops in turn.
extern "C" void neox_cuda_linear_act_forward(void *out, void *pre, const void *inp, const void *weight,
                                             const float *bias, int N, int IC, int OC, neox_act_fn fn, neox_elem act) {
    neox_epilogue_route route = neox_linear_act_route(fn, act);
    if (route == NEOX_EPILOGUE_CUBLASLT) {
        neox_cuda_linear_gelu_forward((float *)out, (float *)pre, (const float *)inp, (const float *)weight, bias, N,
                                      IC, OC);
        return;
    }
    if (route == NEOX_EPILOGUE_CUDNN && neox_cuda_linear_act_cudnn_forward(out, pre, inp, weight, bias, N, IC, OC, fn))
        return;
    neox_cuda_linear_forward(pre, OC, inp, weight, bias, N, IC, OC, act);
    neox_cuda_activation_forward(out, pre, (size_t)N * OC, fn, act);
}

// dpre (N, IC) = fn'(pre) * (dout (N, OC) @ weight (OC, IC)); dbias (IC) += dpre's column sums: on
// cuBLASLt fused as DGELU_BGRAD (which overwrites its sums: into the bias buffer, then added, as
// weight_grads does); after cuDNN's graph or the separate ops, column sums of dpre.
extern "C" void neox_cuda_linear_act_backward(void *dpre, float *dbias, const void *dout, const void *weight,
                                              const void *pre, int N, int IC, int OC, neox_act_fn fn, neox_elem act) {
    neox_epilogue_route route = neox_linear_act_route(fn, act);
    if (route == NEOX_EPILOGUE_CUBLASLT) {
        float *sums = dbias ? bias_buffer(IC) : NULL;
        neox_cuda_matmul_args g = {0, 0, N, IC, OC, 1.0f, 0.0f, dout, OC, weight, IC, NEOX_ELEM_F32, dpre, IC,
                                   NEOX_ELEM_F32, dbias ? NEOX_CUDA_EPI_DGELU_BGRAD : NEOX_CUDA_EPI_DGELU, sums,
                                   (void *)pre, IC};
        neox_cuda_matmul(&g);
        if (dbias) neox_cuda_add_inplace(dbias, sums, (size_t)IC);
        return;
    }
    if (route != NEOX_EPILOGUE_CUDNN || !neox_cuda_linear_act_cudnn_backward(dpre, dout, weight, pre, N, IC, OC, fn)) {
        neox_cuda_linear_backward(dpre, NULL, NULL, dout, OC, NULL, weight, N, IC, OC, 0, act);
        neox_cuda_activation_backward(dpre, dpre, pre, (size_t)N * IC, fn, act);  // (elementwise: in place)
    }
    if (dbias) neox_cuda_linear_backward(NULL, NULL, dbias, dpre, IC, NULL, NULL, N, IC, IC, 0, act);
}
