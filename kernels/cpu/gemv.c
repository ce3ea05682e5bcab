// gemv.c: the one-row products of a decoding step (see gemv.h). One token through a layer reads
// every weight once and does one multiply-add with it, so the speed is the rate the weights stream
// from memory. Every build reads the rows one after another, as they lie in memory (one sequential
// stream per thread, which the hardware prefetcher follows), keeps several accumulators so the adds
// do not wait on each other, and masks the row's tail instead of finishing it one element at a
// time. The bfloat16 builds read half the bytes: AVX512_BF16's vdpbf16ps multiplies pairs of
// bfloat16 elements and adds them into fp32 sums; AVX2 widens each element to fp32 (a shift: the
// product of two bfloat16 values is exact in fp32) and uses FMA.
#include <immintrin.h>
#include <string.h>

#include "gemm_bf16.h"
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

// A bfloat16 value widened to fp32: its 16 bits are the high half of the fp32 bits.
static float widen_bf16(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void neox_gemv_bf16_rows_reference(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x, float beta,
                                   float *y) {
    for (int n = 0; n < N; n++) {
        const uint16_t *w = W + (size_t)n * ldw;
        float dot = 0.0f;
        for (int k = 0; k < K; k++) dot += widen_bf16(w[k]) * widen_bf16(x[k]);
        y[n] = finish(dot, alpha, beta, &y[n]);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)

// ---- AVX-512F: 16 lanes ----

// One row against x: four accumulators, whole vectors, then the masked tail.
__attribute__((target("avx512f"))) static float dot_avx512(const float *w, const float *x, int K) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
    }
    for (; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// Row by row in memory order, as the AVX2 build (see there): four rows at a time against one load
// of x split the weights into four short streams, which the prefetchers follow worse.
__attribute__((target("avx512f"))) void neox_gemv_rows_avx512(int N, int K, float alpha, const float *W, int ldw,
                                                               const float *x, float beta, float *y) {
    for (int n = 0; n < N; n++) y[n] = finish(dot_avx512(W + (size_t)n * ldw, x, K), alpha, beta, &y[n]);
}

// One bfloat16 row against x: each vdpbf16ps adds 32 products into 16 fp32 sums; two accumulators.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static float dot_bf16_avx512(const uint16_t *w,
                                                                                    const uint16_t *x, int K) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32), (__m512bh)_mm512_loadu_si512(x + k + 32));
    }
    for (; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(m, w + k), (__m512bh)_mm512_maskz_loadu_epi16(m, x + k));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void neox_gemv_bf16_rows_avx512(int N, int K, float alpha,
                                                                                       const uint16_t *W, int ldw,
                                                                                       const uint16_t *x, float beta,
                                                                                       float *y) {
    for (int n = 0; n < N; n++) y[n] = finish(dot_bf16_avx512(W + (size_t)n * ldw, x, K), alpha, beta, &y[n]);
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

// Eight bfloat16 elements widened to fp32 lanes.
__attribute__((target("avx2,fma"))) static __m256 load8_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// One bfloat16 row against x, widened: four accumulators, whole vectors, then the tail through a
// zero-padded copy of its last few elements (AVX2 has no masked 16-bit load).
__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const uint16_t *w, const uint16_t *x, int K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(load8_bf16(w + k), load8_bf16(x + k), a0);
        a1 = _mm256_fmadd_ps(load8_bf16(w + k + 8), load8_bf16(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(load8_bf16(w + k + 16), load8_bf16(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(load8_bf16(w + k + 24), load8_bf16(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(load8_bf16(w + k), load8_bf16(x + k), a0);
    if (k < K) {
        uint16_t wt[8] = {0}, xt[8] = {0};
        memcpy(wt, w + k, (size_t)(K - k) * sizeof *wt);
        memcpy(xt, x + k, (size_t)(K - k) * sizeof *xt);
        a1 = _mm256_fmadd_ps(load8_bf16(wt), load8_bf16(xt), a1);
    }
    return sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

__attribute__((target("avx2,fma"))) void neox_gemv_bf16_rows_avx2(int N, int K, float alpha, const uint16_t *W, int ldw,
                                                                   const uint16_t *x, float beta, float *y) {
    for (int n = 0; n < N; n++) y[n] = finish(dot_bf16_avx2(W + (size_t)n * ldw, x, K), alpha, beta, &y[n]);
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

neox_gemv_bf16_rows_fn *neox_gemv_bf16_rows_best(void) {
    if (neox_cpu_has_avx512_bf16()) return neox_gemv_bf16_rows_avx512;
    if (neox_cpu_has_avx2_fma()) return neox_gemv_bf16_rows_avx2;
    return neox_gemv_bf16_rows_reference;
}

#else  // not x86-64: the reference loop stands in for the vector builds, which never run here

void neox_gemv_rows_avx512(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    neox_gemv_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
void neox_gemv_rows_avx2(int N, int K, float alpha, const float *W, int ldw, const float *x, float beta, float *y) {
    neox_gemv_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
void neox_gemv_bf16_rows_avx512(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x, float beta,
                                float *y) {
    neox_gemv_bf16_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
void neox_gemv_bf16_rows_avx2(int N, int K, float alpha, const uint16_t *W, int ldw, const uint16_t *x, float beta,
                              float *y) {
    neox_gemv_bf16_rows_reference(N, K, alpha, W, ldw, x, beta, y);
}
int neox_cpu_has_avx512f(void) { return 0; }
int neox_cpu_has_avx2_fma(void) { return 0; }
neox_gemv_rows_fn *neox_gemv_rows_best(void) { return neox_gemv_rows_reference; }
neox_gemv_bf16_rows_fn *neox_gemv_bf16_rows_best(void) { return neox_gemv_bf16_rows_reference; }

#endif
