// cross_entropy.c: softmax and cross-entropy fused over the vocabulary, so the probabilities are
// never stored: the forward keeps one log-sum-exp per row and the backward recomputes from it.
// The vocabulary loops are vectorised (libmvec's expf, see vector_math.h), with AVX-512 and AVX2 builds of
// each row function, the best one this CPU runs chosen at run time (the baseline build is x86-64-v2); the
// sum of exponentials is accumulated in double.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "vector_math.h"

NEOX_CLONES static float row_max(const float *z, int V) {
    float mx = -INFINITY;
    #pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    return mx;
}

NEOX_CLONES static double row_sumexp(const float *z, float mx, int V) {
    double sum = 0.0;
    #pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) sum += (double)expf(z[j] - mx);
    return sum;
}

NEOX_CLONES static void row_softmax_scaled(float *dz, const float *z, float l, float w, int V) {
    #pragma omp simd
    for (int j = 0; j < V; j++) dz[j] = expf(z[j] - l) * w;
}

void neox_cross_entropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * V;
        float mx = row_max(z, V);
        float l = mx + (float)log(row_sumexp(z, mx, V));
        lse[i] = l;
        losses[i] = targets[i] >= 0 && targets[i] < V ? l - z[targets[i]] : 0.0f;  // a masked position: no loss
    }
}

void neox_cross_entropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                                 const float *weight, float scale, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float w = (weight ? weight[i] : 1.0f) * scale;
        float *dz = dlogits + (size_t)i * V;
        row_softmax_scaled(dz, logits + (size_t)i * V, lse[i], w, V);
        if (targets[i] >= 0 && targets[i] < V) dz[targets[i]] -= w;
    }
}

void neox_cross_entropy_row_max(float *mx, const float *logits, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) mx[i] = row_max(logits + (size_t)i * V, V);
}

void neox_cross_entropy_row_sumexp(double *sum, const float *logits, const float *mx, int N, int V) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) sum[i] = row_sumexp(logits + (size_t)i * V, mx[i], V);
}

void neox_cross_entropy_loss(float *lse, double *loss, const float *mx, const double *stats, const float *mask, int N) {
    double sum = 0.0, wsum = 0.0;
    for (int i = 0; i < N; i++) {
        lse[i] = mx[i] + (float)log(stats[i]);
        float row = lse[i] - (float)stats[N + i];
        sum += (double)mask[i] * row;
        wsum += mask[i];
    }
    loss[0] = sum, loss[1] = wsum;
}

void neox_cross_entropy_target_logit(double *out, const float *logits, const int *targets, int N, int V) {
    for (int i = 0; i < N; i++) out[i] = targets[i] >= 0 && targets[i] < V ? logits[(size_t)i * V + targets[i]] : 0.0;
}
