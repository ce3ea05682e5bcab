// cross_entropy.c: softmax and cross-entropy fused over the vocabulary, so the probabilities are
// never stored: the forward keeps one log-sum-exp per row and the backward recomputes from it.
// The vocabulary loops are vectorised (libmvec's expf, see vector_math.h), with AVX-512 and AVX2 builds of
// each row function, the best one this CPU runs chosen at run time (the baseline build is x86-64-v2); the
// sum of exponentials is accumulated in double. Logits stored in 16 bits (kernels.h, "Activation
// storage"; the fused op also takes fp16) go through the same vectorised loops a block at a time,
// widened into a block on the stack (exact) and their gradient rounded once on the way back, so a
// row is read from memory once for its statistics and once more (in cache) for its gradient.
// Every op here (the fused one, the unfused phases, forward and backward) runs the same row
// functions, so they agree bit for bit.
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "storage.h"
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

// ---- rows in blocks ------------------------------------------------------------------------------
// A 16-bit row is visited CE_BLOCK elements at a time, widened into a stack block that stays in L1;
// an fp32 row is one block, read in place, so fp32 results are those of the loops above over the row.
enum { CE_BLOCK = 1024 };

static size_t elem_bytes(neox_elem e) { return e == NEOX_ELEM_F32 ? sizeof(float) : sizeof(uint16_t); }
static int block_len(neox_elem e, int j0, int V) {
    int n = V - j0;
    return e == NEOX_ELEM_F32 || n < CE_BLOCK ? n : CE_BLOCK;
}

// Elements [j0, j0 + n) of a row stored as e, as fp32: the row itself under fp32, else widened into buf.
static const float *load_block(const void *row, neox_elem e, int j0, int n, float *buf) {
    if (e != NEOX_ELEM_F16) return neox_act_load(row, (size_t)j0, (size_t)n, e, buf);
    for (int j = 0; j < n; j++) buf[j] = neox_f16_to_f32(((const uint16_t *)row)[j0 + j]);
    return buf;
}

// Stores the n fp32 values computed at neox_act_dest's address as elements [j0, j0 + n) of row.
static void store_block(void *row, neox_elem e, int j0, int n, const float *vals) {
    if (e != NEOX_ELEM_F16) {
        neox_act_store(row, (size_t)j0, vals, (size_t)n, e);
        return;
    }
    for (int j = 0; j < n; j++) ((uint16_t *)row)[j0 + j] = neox_f16_from_f32(vals[j]);
}

// One element of a row stored as e, widened (the target logit).
static float load_elem(const void *row, neox_elem e, int j) {
    if (e == NEOX_ELEM_BF16) return neox_bf16_to_f32(((const uint16_t *)row)[j]);
    if (e == NEOX_ELEM_F16) return neox_f16_to_f32(((const uint16_t *)row)[j]);
    return ((const float *)row)[j];
}

static float row_max_any(const void *z, neox_elem e, int V) {
    float buf[CE_BLOCK], mx = -INFINITY;
    for (int j0 = 0, n; j0 < V; j0 += n) {
        n = block_len(e, j0, V);
        float b = row_max(load_block(z, e, j0, n, buf), n);
        mx = b > mx ? b : mx;
    }
    return mx;
}

static double row_sumexp_any(const void *z, neox_elem e, float mx, int V) {
    float buf[CE_BLOCK];
    double sum = 0.0;
    for (int j0 = 0, n; j0 < V; j0 += n) {
        n = block_len(e, j0, V);
        sum += row_sumexp(load_block(z, e, j0, n, buf), mx, n);
    }
    return sum;
}

// dz = (exp(z - l) - onehot(target)) * w over one row (dz may be z); a 16-bit row rounds each
// element once, after the one-hot's subtraction.
static void row_grad(void *dz, const void *z, neox_elem e, float l, float w, int target, int V) {
    float buf[CE_BLOCK];
    for (int j0 = 0, n; j0 < V; j0 += n) {
        n = block_len(e, j0, V);
        const float *x = load_block(z, e, j0, n, buf);
        float *d = e == NEOX_ELEM_F32 ? (float *)dz + j0 : buf;  // (in place over the widened block)
        row_softmax_scaled(d, x, l, w, n);
        if (target >= j0 && target < j0 + n) d[target - j0] -= w;
        if (e != NEOX_ELEM_F32) store_block(dz, e, j0, n, d);
    }
}

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
// Each thread takes whole rows: a row's statistics and then its gradient, in place, while the row is
// still in cache.
void neox_cross_entropy_fused(void *logits, neox_elem logits_elem, float *mx, double *sum, double *target_logit,
                              const int *targets, const float *weight, float scale, const float *scale_at, int N, int V,
                              int stats_given) {
    if (scale_at) scale = *scale_at;
    size_t row_bytes = (size_t)V * elem_bytes(logits_elem);
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        void *z = (char *)logits + (size_t)i * row_bytes;
        int t = targets[i];
        if (!stats_given) {
            mx[i] = row_max_any(z, logits_elem, V);
            sum[i] = row_sumexp_any(z, logits_elem, mx[i], V);
            target_logit[i] = t >= 0 && t < V ? (double)load_elem(z, logits_elem, t) : 0.0;
        }
        float l = mx[i] + (float)log(sum[i]);
        row_grad(z, z, logits_elem, l, (weight ? weight[i] : 1.0f) * scale, t, V);
    }
}
