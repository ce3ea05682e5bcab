// attention.c: exact causal self-attention without a (T, T) matrix (flash-attention's online
// softmax, one query row at a time). Memory beyond the inputs is one log-sum-exp per query row plus
// a row of T scores on each thread's stack. Threads split (batch, head) in the forward and
// (batch, key/value head) in the backward, so the key/value gradients shared by a GQA group are
// written by one thread only.
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// Dropout keep factor for probability (b, h, i, j): 0 or 1/(1-p).
static inline float keep_factor(float p, unsigned long long seed, size_t row, int T, int j) {
    if (p <= 0.0f) return 1.0f;
    return neox_uniform(seed, (unsigned long long)row * T + j) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

void neox_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                            int NH, int NKV, int HS, float scale, float dropout, unsigned long long seed) {
    int group = NH / NKV;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            float p[T];
            const float *kh = k + ((size_t)b * NKV + h / group) * T * HS;
            const float *vh = v + ((size_t)b * NKV + h / group) * T * HS;
            for (int i = 0; i < T; i++) {
                size_t row = ((size_t)b * NH + h) * T + i;
                const float *qi = q + row * HS;
                float mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    p[j] = scale * dot(qi, kh + (size_t)j * HS, HS);
                    mx = p[j] > mx ? p[j] : mx;
                }
                float sum = 0.0f;
                for (int j = 0; j <= i; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                float *oi = out + (((size_t)b * T + i) * NH + h) * HS, inv = 1.0f / sum;
                memset(oi, 0, (size_t)HS * sizeof(float));
                for (int j = 0; j <= i; j++) axpy(oi, p[j] * inv * keep_factor(dropout, seed, row, T, j), vh + (size_t)j * HS, HS);
                lse[row] = mx + logf(sum);
            }
        }
}

void neox_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, const float *lse, int B, int T, int NH, int NKV,
                             int HS, float scale, float dropout, unsigned long long seed) {
    int group = NH / NKV;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            const float *kh = k + ((size_t)b * NKV + g) * T * HS, *vh = v + ((size_t)b * NKV + g) * T * HS;
            float *dkh = dk + ((size_t)b * NKV + g) * T * HS, *dvh = dv + ((size_t)b * NKV + g) * T * HS;
            memset(dkh, 0, (size_t)T * HS * sizeof(float));
            memset(dvh, 0, (size_t)T * HS * sizeof(float));
            for (int h = g * group; h < (g + 1) * group; h++)
                for (int i = 0; i < T; i++) {
                    size_t row = ((size_t)b * NH + h) * T + i;
                    const float *qi = q + row * HS;
                    const float *doi = dout + (((size_t)b * T + i) * NH + h) * HS;
                    const float *oi = out + (((size_t)b * T + i) * NH + h) * HS;
                    float *dqi = dq + row * HS;
                    memset(dqi, 0, (size_t)HS * sizeof(float));
                    // D = sum_j P_ij dP_ij = dout_i . out_i (also with dropout, as out includes the mask).
                    float D = dot(doi, oi, HS), l = lse[row];
                    for (int j = 0; j <= i; j++) {
                        const float *kj = kh + (size_t)j * HS, *vj = vh + (size_t)j * HS;
                        float pj = expf(scale * dot(qi, kj, HS) - l);
                        float kf = keep_factor(dropout, seed, row, T, j);
                        axpy(dvh + (size_t)j * HS, pj * kf, doi, HS);
                        float ds = pj * (kf * dot(doi, vj, HS) - D) * scale;
                        axpy(dqi, ds, kj, HS);
                        axpy(dkh + (size_t)j * HS, ds, qi, HS);
                    }
                }
        }
}
