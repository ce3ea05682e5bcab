// cross_entropy.c: softmax and cross-entropy fused over the vocabulary, so the probabilities are
// never stored: the forward keeps one log-sum-exp per row and the backward recomputes from it.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"

void neox_cross_entropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += expf(z[j] - mx);
        float l = mx + (float)log(sum);
        lse[i] = l;
        losses[i] = l - z[targets[i]];
    }
}

void neox_cross_entropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                                 const float *weight, float scale, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * V;
        float *dz = dlogits + (size_t)i * V;
        float w = (weight ? weight[i] : 1.0f) * scale, l = lse[i];
        for (int j = 0; j < V; j++) dz[j] = expf(z[j] - l) * w;
        dz[targets[i]] -= w;
    }
}
