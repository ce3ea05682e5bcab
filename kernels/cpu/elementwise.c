// elementwise.c: residual additions, dropout, jitter and the deterministic normal sampler. The
// residual additions, bias, dropout and jitter read and write activations in their storage type
// (storage.h); add_inplace is for fp32 buffers only (gradients).
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "storage.h"

double neox_normal(unsigned long long seed, unsigned long long index) {
    unsigned long long h = neox_hash64(seed, index);
    double u1 = ((double)(h >> 32) + 1.0) / 4294967297.0;  // (0, 1): log never sees 0
    double u2 = (double)(h & 0xFFFFFFFFull) / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void neox_add(void *out, const void *a, const void *b, size_t n, neox_elem act) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) neox_act_set(out, i, neox_act_get(a, i, act) + neox_act_get(b, i, act), act);
}

void neox_add_inplace(float *acc, const float *x, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

void neox_add_bias(void *x, const float *bias, int N, int C, neox_elem act) {
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        for (int c = 0; c < C; c++) neox_act_set(x, row + c, neox_act_get(x, row + c, act) + bias[c], act);
    }
}

void neox_dropout(void *out, const void *inp, size_t n, float p, unsigned long long seed, unsigned long long offset,
                  const unsigned long long *row0_at, unsigned long long row_elems, neox_elem act) {
    float keep_scale = 1.0f / (1.0f - p);
    if (row0_at) offset += *row0_at * row_elems;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        neox_act_set(out, i, neox_uniform(seed, offset + i) >= p ? neox_act_get(inp, i, act) * keep_scale : 0.0f, act);
}

void neox_jitter(void *out, const void *inp, size_t n, float eps, unsigned long long seed, neox_elem act) {
    float low = 1.0f - eps, span = (1.0f + eps) - low;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) neox_act_set(out, i, neox_act_get(inp, i, act) * (low + neox_uniform(seed, i) * span), act);
}
