// gemm.c: the CPU backend's matrix multiply. Every kernel's parallel work runs on one thread pool,
// OpenMP's: a GEMM is cut into one panel of output rows (or columns) per OpenMP thread and each
// panel is a single-threaded OpenBLAS sgemm. Letting OpenBLAS run its own pthreads beside the
// OpenMP ones instead leaves two pools busy-waiting for the same cores between kernels (measured:
// about a tenth of the CPU time of a training step went to spinning). Inside a parallel region
// (attention's tiles) the call goes straight to OpenBLAS on the calling thread.
#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "gemm.h"

// Below this many multiply-adds a GEMM is not worth waking the other threads for.
#define GEMM_PARALLEL_MIN (1 << 21)
// Panels start on multiples of this many rows/columns (OpenBLAS's register blocks divide it).
enum { GEMM_PANEL_ALIGN = 32 };

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void make_blas_single_threaded(void) { openblas_set_num_threads(1); }

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

void neox_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    pthread_once(&blas_once, make_blas_single_threaded);
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
