// gemv.c: the one-row products of a decoding step (see gemv.h). One token through a layer reads
// every weight once and does one multiply-add with it, so the speed is the rate the weights stream
// from memory. The AVX2 build reads the rows one after another (one sequential stream), the AVX-512
// build four at a time against one load of x; both keep several accumulators so the adds do not
// wait on each other, and mask the row's tail instead of finishing it one element at a time.
#include <immintrin.h>

#include "gemv.h"

static float finish(float dot, float alpha, float beta, const float *y) { return alpha * dot + (beta != 0.0f ? beta * *y : 0.0f); }

void neox_gemv_rows_reference(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    for (int n = 0; n < N; n++) {
        const float *w = W + (size_t)n * ldw;
        float dot = 0.0f;
        for (int k = 0; k < K; k++) dot += w[k] * x[k];
        y[n] = finish(dot, alpha, beta, &y[n]);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)

// ---- AVX-512F: 16 lanes ----

__attribute__((target("avx512f"))) static float dot_avx512(const float *w, const float *x, int K) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    }
    for (; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// Rows w0..w3 (stride ldw) against x: out[r] = w_r . x. Whole vectors first, the masked tail once.
__attribute__((target("avx512f"))) static void dot4_avx512(float out[4], const float *w, int ldw, const float *x,
                                                            int K) {
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * (size_t)ldw, *w3 = w + 3 * (size_t)ldw;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + k), xv, a3);
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w3 + k), xv, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);
}

__attribute__((target("avx512f"))) void neox_gemv_rows_avx512(int N, int K, float alpha, const float *W, int ldw,
                                                               const float *x, float beta, float *y) {
    int n = 0;
    for (; n + 4 <= N; n += 4) {
        float d[4];
        dot4_avx512(d, W + (size_t)n * ldw, ldw, x, K);
        for (int r = 0; r < 4; r++) y[n + r] = finish(d[r], alpha, beta, &y[n + r]);
    }
    for (; n < N; n++) y[n] = finish(dot_avx512(W + (size_t)n * ldw, x, K), alpha, beta, &y[n]);
}

// ---- AVX2 + FMA: 8 lanes ----

__attribute__((target("avx2,fma"))) static __m256i tail_mask8(int left) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lanes);  // lane i on while i < left
}

__attribute__((target("avx2,fma"))) static float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// One row against x: four accumulators so that the FMAs do not wait on each other's latency, whole
// vectors, then the masked tail.
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *w, const float *x, int K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    if (k < K) {
        __m256i m = tail_mask8(K - k);
        a1 = _mm256_fmadd_ps(_mm256_maskload_ps(w + k, m), _mm256_maskload_ps(x + k, m), a1);
    }
    return sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// Row by row, in the order the rows lie in memory: the weights are one sequential read, which the
// hardware prefetcher follows. Four rows at a time against one load of x (as the AVX-512 build
// does) made four short streams per block of rows instead, and streamed 20-40% slower on Zen 3 for
// rows of 576 (bench figures in docs/performance.md); x stays in L1 either way.
__attribute__((target("avx2,fma"))) void neox_gemv_rows_avx2(int N, int K, float alpha, const float *W, int ldw,
                                                              const float *x, float beta, float *y) {
    for (int n = 0; n < N; n++) y[n] = finish(dot_avx2(W + (size_t)n * ldw, x, K), alpha, beta, &y[n]);
}

int neox_cpu_has_avx512f(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}
int neox_cpu_has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

neox_gemv_rows_fn *neox_gemv_rows_best(void) {
    if (neox_cpu_has_avx512f()) return neox_gemv_rows_avx512;
    if (neox_cpu_has_avx2_fma()) return neox_gemv_rows_avx2;
    return neox_gemv_rows_reference;
}

#else  // not x86-64: the reference loop stands in for the vector builds, which never run here

void neox_gemv_rows_avx512(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    neox_gemv_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
void neox_gemv_rows_avx2(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    neox_gemv_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
int neox_cpu_has_avx512f(void) { return 0; }
int neox_cpu_has_avx2_fma(void) { return 0; }
neox_gemv_rows_fn *neox_gemv_rows_best(void) { return neox_gemv_rows_reference; }

#endif
