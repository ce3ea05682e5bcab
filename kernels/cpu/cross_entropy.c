// cross_entropy.c: softmax and cross-entropy fused over the vocabulary, so the probabilities are
// never stored: the forward keeps one log-sum-exp per row and the backward recomputes from it.
// The vocabulary loops are vectorised (libmvec's expf, see vector_math.h), with an AVX2 build of
// each row function chosen at run time where the CPU has it (the baseline build is x86-64-v2); the
// sum of exponentials is accumulated in double.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "vector_math.h"

NEOX_CLONES static float row_logsumexp(const float *z, int V) {
    float mx = -INFINITY;
    #pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    double sum = 0.0;
    #pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) sum += (double)expf(z[j] - mx);
    return mx + (float)log(sum);
}

NEOX_CLONES static void row_softmax_scaled(float *dz, const float *z, float l, float w, int V) {
    #pragma omp simd
    for (int j = 0; j < V; j++) dz[j] = expf(z[j] - l) * w;
}

void neox_cross_entropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * V;
        float l = row_logsumexp(z, V);
        lse[i] = l;
        losses[i] = l - z[targets[i]];
    }
}

void neox_cross_entropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                                 const float *weight, float scale, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float w = (weight ? weight[i] : 1.0f) * scale;
        float *dz = dlogits + (size_t)i * V;
        row_softmax_scaled(dz, logits + (size_t)i * V, lse[i], w, V);
        dz[targets[i]] -= w;
    }
}
