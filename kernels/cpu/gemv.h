// gemv.h: the one-row matrix product of a decoding step, y = alpha * W x + beta * y with W (N, K)
// row-major (a linear layer's weight, or the tied embedding as the classifier), in three builds of
// the same contract: the readable reference loop, AVX2 + FMA and AVX-512F. kernels/cpu/gemm.c
// calls neox_gemv_rows_best(), the fastest build this CPU runs, picked once at run time; the unit
// test holds every build this CPU can run to the reference.
#ifndef NEOX_CPU_GEMV_H
#define NEOX_CPU_GEMV_H

// y[n] = alpha * sum_k W[n * ldw + k] * x[k] + beta * y[n] for n in [0, N); beta == 0 never reads y.
typedef void neox_gemv_rows_fn(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta,
                               float *y);

neox_gemv_rows_fn neox_gemv_rows_reference, neox_gemv_rows_avx2, neox_gemv_rows_avx512;

// The build for this CPU: AVX-512F, else AVX2 + FMA, else the reference loop.
neox_gemv_rows_fn *neox_gemv_rows_best(void);
// Whether this CPU runs each vector build (the unit test tries only those).
int neox_cpu_has_avx512f(void);
int neox_cpu_has_avx2_fma(void);

#endif
