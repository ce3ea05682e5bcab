// embedding.c: token (and learned position) embedding lookup and its gradient scatter-add.
#include <string.h>

#include "kernels/kernels.h"

void neox_embedding_forward(float *out, const int *ids, const float *wte, const float *wpe, int B, int T, int C) {
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        if (ids[bt] < 0) memset(o, 0, (size_t)C * sizeof(float));
        else memcpy(o, wte + (size_t)ids[bt] * C, (size_t)C * sizeof(float));
        if (wpe) {
            const float *p = wpe + (size_t)(bt % T) * C;
            for (int c = 0; c < C; c++) o[c] += p[c];
        }
    }
}

void neox_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *ids, int B, int T, int C) {
    // Rows of dwte may repeat (the same token twice), so threads split the channels, not the tokens;
    // each thread then adds in token order and the result does not depend on the thread count.
    #pragma omp parallel
    {
        #pragma omp for
        for (int c0 = 0; c0 < C; c0 += 64) {
            int c1 = c0 + 64 < C ? c0 + 64 : C;
            for (int bt = 0; bt < B * T; bt++) {
                const float *d = dout + (size_t)bt * C;
                if (ids[bt] >= 0) {
                    float *e = dwte + (size_t)ids[bt] * C;
                    for (int c = c0; c < c1; c++) e[c] += d[c];
                }
                if (dwpe) {
                    float *p = dwpe + (size_t)(bt % T) * C;
                    for (int c = c0; c < c1; c++) p[c] += d[c];
                }
            }
        }
    }
}
