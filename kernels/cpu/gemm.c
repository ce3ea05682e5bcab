// gemm.c: the CPU backend's matrix multiply. Every kernel's parallel work runs on one thread pool,
// OpenMP's: a GEMM is cut into one panel of output rows (or columns) per OpenMP thread and each
// panel is a single-threaded OpenBLAS sgemm. Letting OpenBLAS run its own pthreads beside the
// OpenMP ones instead leaves two pools busy-waiting for the same cores between kernels (measured:
// about a tenth of the CPU time of a training step went to spinning). Inside a parallel region
// (attention's tiles) the call goes straight to OpenBLAS on the calling thread. A product with
// one row (a decoding step: one position through a linear layer) is a matrix-vector product and
// goes to a GEMV: OpenBLAS's sgemm would first pack (copy) the whole weight matrix for that one
// row, which took half of generation's time. A weight stored (N, K), as linear layers and the tied
// classifier store theirs, goes to kernels/cpu/gemv.c's build for this CPU (AVX-512 where it has
// it); other layouts to OpenBLAS's sgemv. A bfloat16 product with one row against such a weight
// (16-bit precision's decoding step) goes to gemv.c's bfloat16 build. Either one-row product hands
// its rows to the threads in chunks, taken one at a time (a thread slowed by other work takes fewer).
// Up to NEOX_DECODE_MAX_ROWS rows against such a weight (a decoding step over several sequences; a
// short prompt; attention's tiles of a few query rows against their keys) go through the same
// one-row kernel, row by row on each chunk of the weight while it is in cache:
// the weights stream from memory once for all the rows, and each row's result is bit for bit the
// one it would have alone.
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "gemm_bf16.h"
#include "gemv.h"
#include "kernels/kernels.h"

// Below this many multiply-adds a GEMM is not worth waking the other threads for.
#define GEMM_PARALLEL_MIN (1 << 21)
// A matrix-vector product reads each weight once: below this many weights (1 MB) the matrix is read
// faster by one thread than the other threads can be woken.
#define GEMV_PARALLEL_MIN (1 << 18)
// A matrix-vector product's rows go to the threads in about this many chunks per thread.
#define GEMV_CHUNKS_PER_THREAD 8
// Bytes of B a chunk of a few-row product holds (about a core's L2 share).
#define GEMV_FEW_CHUNK_BYTES ((size_t)256 << 10)
// Panels start on multiples of this many rows/columns (OpenBLAS's register blocks divide it).
enum { GEMM_PANEL_ALIGN = 32 };

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static neox_gemv_rows_fn *gemv_rows;
static neox_gemv_bf16_rows_fn *gemv_bf16_rows;
static neox_gemm_bf16_fn *bf16_gemm;
static void make_blas_single_threaded(void) {
    openblas_set_num_threads(1);
    gemv_rows = neox_gemv_rows_best();
    gemv_bf16_rows = neox_gemv_bf16_rows_best();
    bf16_gemm = neox_gemm_bf16_best();
}

static void sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

// [start, end) of part t of n over length len, on GEMM_PANEL_ALIGN boundaries.
static void panel(int len, int t, int n, int *start, int *end) {
    int blocks = (len + GEMM_PANEL_ALIGN - 1) / GEMM_PANEL_ALIGN;
    int b0 = (int)((long)blocks * t / n), b1 = (int)((long)blocks * (t + 1) / n);
    *start = b0 * GEMM_PANEL_ALIGN < len ? b0 * GEMM_PANEL_ALIGN : len;
    *end = b1 * GEMM_PANEL_ALIGN < len ? b1 * GEMM_PANEL_ALIGN : len;
}

// Rows per chunk of a matrix-vector product: the threads take chunks one at a time (each chunk one
// sequential stream of rows) until none is left, so a thread that the machine slows (another
// program on its core, a busier memory channel) takes fewer and the others do not wait for it at
// the end; about GEMV_CHUNKS_PER_THREAD chunks per thread, never below GEMM_PANEL_ALIGN rows. Each
// row's sum is the same whichever thread computes it.
static int gemv_chunk_rows(int N) {
    int per = N / (omp_get_max_threads() * GEMV_CHUNKS_PER_THREAD);
    per = per / GEMM_PANEL_ALIGN * GEMM_PANEL_ALIGN;
    return per > GEMM_PANEL_ALIGN ? per : GEMM_PANEL_ALIGN;
}

// Columns [s, e) of the one-row C = alpha * a op(B) + beta * C, a with stride inc: op(B)^T a.
static void sgemv_part(int trans_b, int s, int e, int K, float alpha, const float *a, int inc, const float *B, int ldb,
                       float beta, float *C) {
    if (e <= s) return;
    if (trans_b && inc == 1)  // B is (N, K): rows s..e of B times a
        gemv_rows(e - s, K, alpha, B + (size_t)s * ldb, ldb, a, beta, C + s);
    else if (trans_b)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, e - s, K, alpha, B + (size_t)s * ldb, ldb, a, inc, beta, C + s, 1);
    else          // B is (K, N): columns s..e of B, transposed, times a
        cblas_sgemv(CblasRowMajor, CblasTrans, K, e - s, alpha, B + s, ldb, a, inc, beta, C + s, 1);
}

// M == 1: the row of op(A) is A's first row (trans_a: its first column, stride lda).
static void sgemv_row(int trans_a, int trans_b, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C) {
    int inc = trans_a ? lda : 1;
    if (omp_in_parallel() || omp_get_max_threads() == 1 || (double)N * K < GEMV_PARALLEL_MIN) {
        sgemv_part(trans_b, 0, N, K, alpha, A, inc, B, ldb, beta, C);
        return;
    }
    int rows = gemv_chunk_rows(N), chunks = (N + rows - 1) / rows;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < chunks; i++) {
        int s = i * rows, e = s + rows < N ? s + rows : N;
        sgemv_part(trans_b, s, e, K, alpha, A, inc, B, ldb, beta, C);
    }
}

// C (1, N) = alpha * a (K) B^T + beta * C with a and B (N, K) bfloat16: rows of B in chunks over
// the threads when the matrix is large enough to pay for waking them.
static void bf16_gemv_row(int N, int K, float alpha, const uint16_t *a, const uint16_t *B, int ldb, float beta, float *C) {
    if (omp_in_parallel() || omp_get_max_threads() == 1 || (double)N * K < GEMV_PARALLEL_MIN) {
        gemv_bf16_rows(N, K, alpha, B, ldb, a, beta, C);
        return;
    }
    int rows = gemv_chunk_rows(N), chunks = (N + rows - 1) / rows;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < chunks; i++) {
        int s = i * rows, e = s + rows < N ? s + rows : N;
        gemv_bf16_rows(e - s, K, alpha, B + (size_t)s * ldb, ldb, a, beta, C + s);
    }
}

// Rows per chunk when a few rows share the pass (M > 1): a chunk of B stays in the core's cache
// (GEMV_FEW_CHUNK_BYTES) while every row of A is multiplied with it.
static int gemv_few_chunk_rows(int N, int K, size_t elem) {
    int fit = (int)(GEMV_FEW_CHUNK_BYTES / ((size_t)K * elem)) / GEMM_PANEL_ALIGN * GEMM_PANEL_ALIGN, rows = gemv_chunk_rows(N);
    if (fit < GEMM_PANEL_ALIGN) fit = GEMM_PANEL_ALIGN;
    return rows < fit ? rows : fit;
}

static int gemv_serial(int N, int K) {
    return omp_in_parallel() || omp_get_max_threads() == 1 || (double)N * K < GEMV_PARALLEL_MIN;
}

int neox_cpu_gemv_chunk_rows(int M, int N, int K, size_t elem) {
    return M == 1 ? gemv_chunk_rows(N) : gemv_few_chunk_rows(N, K, elem);
}

void neox_cpu_gemv_rows(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    pthread_once(&blas_once, make_blas_single_threaded);
    gemv_rows(N, K, alpha, W, ldw, x, beta, y);
}

void neox_cpu_gemv_bf16_rows(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x, float beta,
                             float *y) {
    pthread_once(&blas_once, make_blas_single_threaded);
    gemv_bf16_rows(N, K, alpha, W, ldw, x, beta, y);
}

// C (M, N; ldc) = alpha * A (M, K; lda) B^T + beta * C for a few rows of A (a decoding step over
// several sequences), B (N, K): each chunk of B's rows comes from memory once for all M rows, and
// each row of C is the one-row kernel's, the same as a product of that row alone.
static void sgemv_rows_few(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                           float *C, int ldc) {
    int rows = gemv_few_chunk_rows(N, K, sizeof(float)), chunks = (N + rows - 1) / rows;
    #pragma omp parallel for schedule(dynamic, 1) if (!gemv_serial(N, K))
    for (int i = 0; i < chunks; i++) {
        int s = i * rows, e = s + rows < N ? s + rows : N;
        for (int m = 0; m < M; m++)
            gemv_rows(e - s, K, alpha, B + (size_t)s * ldb, ldb, A + (size_t)m * lda, beta, C + (size_t)m * ldc + s);
    }
}

// The same with A and B bfloat16.
static void bf16_gemv_rows_few(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                               float beta, float *C, int ldc) {
    int rows = gemv_few_chunk_rows(N, K, sizeof(uint16_t)), chunks = (N + rows - 1) / rows;
    #pragma omp parallel for schedule(dynamic, 1) if (!gemv_serial(N, K))
    for (int i = 0; i < chunks; i++) {
        int s = i * rows, e = s + rows < N ? s + rows : N;
        for (int m = 0; m < M; m++)
            gemv_bf16_rows(e - s, K, alpha, B + (size_t)s * ldb, ldb, A + (size_t)m * lda, beta, C + (size_t)m * ldc + s);
    }
}

void neox_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    pthread_once(&blas_once, make_blas_single_threaded);
    if (M == 1 && N > 0 && K > 0) {
        sgemv_row(trans_a, trans_b, N, K, alpha, A, lda, B, ldb, beta, C);
        return;
    }
    if (M <= NEOX_DECODE_MAX_ROWS && !trans_a && trans_b && N > 0 && K > 0) {
        sgemv_rows_few(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (omp_in_parallel() || omp_get_max_threads() == 1 || (double)M * N * K < GEMM_PARALLEL_MIN) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int split_rows = M >= N;
    #pragma omp parallel
    {
        int s, e;
        panel(split_rows ? M : N, omp_get_thread_num(), omp_get_num_threads(), &s, &e);
        if (split_rows)  // rows s..e of op(A) and of C
            sgemm1(trans_a, trans_b, e - s, N, K, alpha, trans_a ? A + s : A + (size_t)s * lda, lda, B, ldb, beta,
                   C + (size_t)s * ldc, ldc);
        else             // columns s..e of op(B) and of C
            sgemm1(trans_a, trans_b, M, e - s, K, alpha, A, lda, trans_b ? B + (size_t)s * ldb : B + s, ldb, beta,
                   C + s, ldc);
    }
}

// Widens a rows x cols matrix (row stride ld) of 16-bit or fp32 elements into an fp32 copy with
// the same stride; only (rows - 1) * ld + cols elements are read (a strided view's last row is short).
static size_t extent(size_t rows, size_t cols, size_t ld) { return rows ? (rows - 1) * ld + cols : 0; }

static float *widen(const void *x, size_t rows, size_t cols, size_t ld, neox_elem e) {
    size_t n = extent(rows, cols, ld);
    float *w = malloc((n ? n : 1) * sizeof(float));
    if (!w) return NULL;
    if (e == NEOX_ELEM_BF16) neox_cast_bf16_to_f32(w, x, n);
    else if (e == NEOX_ELEM_F16) neox_cast_f16_to_f32(w, x, n);
    else memcpy(w, x, n * sizeof(float));
    return w;
}

void neox_gemm_ex(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
                  int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    if (ab == NEOX_ELEM_F32 && c == NEOX_ELEM_F32) {
        neox_cpu_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (ab == NEOX_ELEM_BF16 && c == NEOX_ELEM_F32) {  // 16-bit precision's products
        pthread_once(&blas_once, make_blas_single_threaded);
        if (M == 1 && N > 0 && K > 0 && !trans_a && trans_b) {
            bf16_gemv_row(N, K, alpha, A, B, ldb, beta, C);
            return;
        }
        if (M <= NEOX_DECODE_MAX_ROWS && N > 0 && K > 0 && !trans_a && trans_b) {
            bf16_gemv_rows_few(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
        bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    // As stored, A is (K, M) when transposed and (M, K) otherwise; B is (N, K) or (K, N).
    float *a = trans_a ? widen(A, K, M, lda, ab) : widen(A, M, K, lda, ab);
    float *b = trans_b ? widen(B, N, K, ldb, ab) : widen(B, K, N, ldb, ab);
    float *cw = widen(C, M, N, ldc, c);
    if (!a || !b || !cw) {
        fprintf(stderr, "neox_gemm_ex: out of memory widening a %dx%dx%d product\n", M, N, K);
        abort();
    }
    neox_cpu_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, cw, ldc);
    size_t n = extent(M, N, ldc);
    if (c == NEOX_ELEM_BF16) neox_cast_f32_to_bf16(C, cw, n);
    else if (c == NEOX_ELEM_F16) neox_cast_f32_to_f16(C, cw, n);
    else memcpy(C, cw, n * sizeof(float));
    free(a);
    free(b);
    free(cw);
}
