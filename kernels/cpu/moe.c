// moe.c: the token movement of a Mixture-of-Experts layer (lib/model/moe.c): each token's K expert
// slots gathered into rows grouped by expert, and the expert outputs combined back per token with
// the router's weights. Combining walks each token's own slots in order (no scatter-add), so sums
// do not depend on thread count or on the backend. Rows are read and written in their storage type
// (storage.h); the router's weights stay fp32.
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "storage.h"

void neox_gather_rows(void *out, const void *inp, const int *idx, int n, int C, neox_elem act) {
    size_t row = (size_t)C * neox_elem_size(act);
    #pragma omp parallel for
    for (int j = 0; j < n; j++) memcpy((char *)out + (size_t)j * row, (const char *)inp + (size_t)idx[j] * row, row);
}

void neox_moe_combine(void *out, const void *rows, const int *slot, const float *weight, int N, int K, int C,
                      neox_elem act) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        size_t o = (size_t)t * C;
        for (int c = 0; c < C; c++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) {
                float w = weight ? weight[t * K + k] : 1.0f;
                sum += w * neox_act_get(rows, (size_t)slot[t * K + k] * C + c, act);
            }
            neox_act_set(out, o + c, sum, act);
        }
    }
}

void neox_moe_combine_backward(void *drows, float *dweight, const void *dout, const void *rows, const int *slot,
                               const float *weight, int N, int K, int C, neox_elem act) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        size_t d = (size_t)t * C;
        for (int k = 0; k < K; k++) {
            size_t r = (size_t)slot[t * K + k] * C;
            float w = weight[t * K + k];
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                float dy = neox_act_get(dout, d + c, act);
                dot += (double)dy * neox_act_get(rows, r + c, act);
                neox_act_set(drows, r + c, w * dy, act);
            }
            dweight[t * K + k] = (float)dot;
        }
    }
}
