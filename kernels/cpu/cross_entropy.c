// cross_entropy.c: softmax and cross-entropy fused over the vocabulary, so the probabilities are
// never stored: the forward keeps one log-sum-exp per row and the backward recomputes from it.
// The vocabulary loops are vectorised (libmvec's expf, see vector_math.h), with AVX-512 and AVX2 builds of
// each row function, the best one this CPU runs chosen at run time (the baseline build is x86-64-v2); the
// sum of exponentials is accumulated in double. Logits stored in 16 bits (kernels.h, "Activation
// storage"; the fused op also takes fp16) are widened element by element and their gradient rounded once.
#include <math.h>
#include <stddef.h>
#include <stdint.h>

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

// ---- rows stored in 16 bits ----------------------------------------------------------------------
// A 16-bit element widened, or rounded back from fp32.
static float load_elem(const void *row, neox_elem e, int j) {
    if (e == NEOX_ELEM_BF16) return neox_bf16_to_f32(((const uint16_t *)row)[j]);
    if (e == NEOX_ELEM_F16) return neox_f16_to_f32(((const uint16_t *)row)[j]);
    return ((const float *)row)[j];
}

static void store_elem(void *row, neox_elem e, int j, float x) {
    if (e == NEOX_ELEM_BF16) ((uint16_t *)row)[j] = neox_bf16_from_f32(x);
    else if (e == NEOX_ELEM_F16) ((uint16_t *)row)[j] = neox_f16_from_f32(x);
    else ((float *)row)[j] = x;
}

// The statistics of one 16-bit row (fp32 rows take the vectorised functions above).
static float row_max_elem(const void *z, neox_elem e, int V) {
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) {
        float x = load_elem(z, e, j);
        mx = x > mx ? x : mx;
    }
    return mx;
}

static double row_sumexp_elem(const void *z, neox_elem e, float mx, int V) {
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += (double)expf(load_elem(z, e, j) - mx);
    return sum;
}

// dz = (exp(z - l) - onehot(target)) * w over one row (dz may be z); a 16-bit row rounds each
// element once, after the one-hot's subtraction.
static void row_grad(void *dz, const void *z, neox_elem e, float l, float w, int target, int V) {
    if (e != NEOX_ELEM_F32) {
        for (int j = 0; j < V; j++) {
            float d = expf(load_elem(z, e, j) - l) * w;
            store_elem(dz, e, j, j == target ? d - w : d);
        }
        return;
    }
    row_softmax_scaled(dz, z, l, w, V);
    if (target >= 0 && target < V) ((float *)dz)[target] -= w;
}

// The row functions of a row stored as e: the vectorised fp32 ones, or element by element.
static float row_max_any(const void *z, neox_elem e, int V) {
    return e == NEOX_ELEM_F32 ? row_max(z, V) : row_max_elem(z, e, V);
}
static double row_sumexp_any(const void *z, neox_elem e, float mx, int V) {
    return e == NEOX_ELEM_F32 ? row_sumexp(z, mx, V) : row_sumexp_elem(z, e, mx, V);
}
static size_t elem_bytes(neox_elem e) { return e == NEOX_ELEM_F32 ? sizeof(float) : sizeof(uint16_t); }

void neox_cross_entropy_forward(float *losses, float *lse, const void *logits, const int *targets, int N, int V,
                                neox_elem act) {
    size_t row_bytes = (size_t)V * elem_bytes(act);
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const void *z = (const char *)logits + (size_t)i * row_bytes;
        float mx = row_max_any(z, act, V);
        float l = mx + (float)log(row_sumexp_any(z, act, mx, V));
        lse[i] = l;
        losses[i] = targets[i] >= 0 && targets[i] < V ? l - load_elem(z, act, targets[i]) : 0.0f;  // masked: no loss
    }
}

void neox_cross_entropy_backward(void *dlogits, const void *logits, const float *lse, const int *targets,
                                 const float *weight, float scale, const float *scale_at, int N, int V, neox_elem act) {
    size_t row_bytes = (size_t)V * elem_bytes(act);
    if (scale_at) scale = *scale_at;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float w = (weight ? weight[i] : 1.0f) * scale;
        row_grad((char *)dlogits + (size_t)i * row_bytes, (const char *)logits + (size_t)i * row_bytes, act, lse[i], w,
                 targets[i], V);
    }
}

void neox_cross_entropy_row_max(float *mx, const void *logits, int N, int V, neox_elem act) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) mx[i] = row_max_any((const char *)logits + (size_t)i * V * elem_bytes(act), act, V);
}

void neox_cross_entropy_row_sumexp(double *sum, const void *logits, const float *mx, int N, int V, neox_elem act) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++)
        sum[i] = row_sumexp_any((const char *)logits + (size_t)i * V * elem_bytes(act), act, mx[i], V);
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

void neox_cross_entropy_target_logit(double *out, const void *logits, const int *targets, int N, int V,
                                     neox_elem act) {
    for (int i = 0; i < N; i++)
        out[i] = targets[i] >= 0 && targets[i] < V ? load_elem((const char *)logits + (size_t)i * V * elem_bytes(act),
                                                               act, targets[i])
                                                   : 0.0;
}

// ---- the fused loss and gradient (neox_cross_entropy_fused) -------------------------------------
void neox_cross_entropy_fused(void *logits, neox_elem logits_elem, float *mx, double *sum, double *target_logit,
                              const int *targets, const float *weight, float scale, const float *scale_at, int N, int V,
                              int stats_given) {
    if (scale_at) scale = *scale_at;
    size_t row_bytes = (size_t)V * (logits_elem == NEOX_ELEM_F32 ? sizeof(float) : sizeof(uint16_t));
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        void *z = (char *)logits + (size_t)i * row_bytes;
        int t = targets[i];
        if (!stats_given) {
            int f32 = logits_elem == NEOX_ELEM_F32;
            mx[i] = f32 ? row_max(z, V) : row_max_elem(z, logits_elem, V);
            sum[i] = f32 ? row_sumexp(z, mx[i], V) : row_sumexp_elem(z, logits_elem, mx[i], V);
            target_logit[i] = t >= 0 && t < V ? (double)load_elem(z, logits_elem, t) : 0.0;
        }
        float l = mx[i] + (float)log(sum[i]);
        row_grad(z, z, logits_elem, l, (weight ? weight[i] : 1.0f) * scale, t, V);
    }
}
