// moe.c: the token movement of a Mixture-of-Experts layer (lib/model/moe.c): each token's K expert
// slots gathered into rows grouped by expert, and the expert outputs combined back per token with
// the router's weights. Combining walks each token's own slots in order (no scatter-add), so sums
// do not depend on thread count or on the backend.
#include <stddef.h>

#include "kernels/kernels.h"

void neox_gather_rows(float *out, const float *inp, const int *idx, int n, int C) {
    #pragma omp parallel for
    for (int j = 0; j < n; j++) {
        const float *src = inp + (size_t)idx[j] * C;
        float *dst = out + (size_t)j * C;
        for (int c = 0; c < C; c++) dst[c] = src[c];
    }
}

void neox_moe_combine(float *out, const float *rows, const int *slot, const float *weight, int N, int K, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float *r = rows + (size_t)slot[t * K + k] * C;
            float w = weight ? weight[t * K + k] : 1.0f;
            for (int c = 0; c < C; c++) o[c] += w * r[c];
        }
    }
}

void neox_moe_combine_backward(float *drows, float *dweight, const float *dout, const float *rows, const int *slot,
                               const float *weight, int N, int K, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float *d = dout + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            size_t j = (size_t)slot[t * K + k];
            const float *r = rows + j * C;
            float w = weight[t * K + k], *dr = drows + j * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dot += (double)d[c] * r[c];
                dr[c] = w * d[c];
            }
            dweight[t * K + k] = (float)dot;
        }
    }
}
