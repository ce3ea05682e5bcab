// attention_cache.c: causal attention of a few new query positions over a key/value cache, for
// generation with a KV cache. Each query row is computed as the attention it stands for (scores,
// running max, exp-sum, weighted values), equal to neox_attention_forward's blocked form to
// rounding. A decoding step runs one row per head: the dot products are vector reductions (a
// serial sum waited on each add's latency), and the row is split over threads only when the cache
// is long enough to pay for waking them.
#include <math.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "vector_math.h"

// One query row qi over cached keys and values [j_first, n) (rows of HS): softmax(qi . K * scale +
// ALiBi) @ V into o; scores has room for n.
NEOX_CLONES static void attend_row(float *o, float *scores, const float *qi, const float *K, const float *V, int j_first,
                                   int n, int HS, float scale, float slope) {
    float mx = -INFINITY;
    for (int j = j_first; j < n; j++) {
        const float *kj = K + (size_t)j * HS;
        float s = 0.0f;
        #pragma omp simd reduction(+ : s)
        for (int d = 0; d < HS; d++) s += qi[d] * kj[d];
        // As the blocked kernel: j - i relative to this query's position n - 1.
        scores[j] = slope != 0.0f ? s * scale + slope * (float)(j - (n - 1)) : s * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0.0f;
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    for (int j = j_first; j < n; j++) {
        float p = expf(scores[j] - mx);
        const float *vj = V + (size_t)j * HS;
        sum += p;
        #pragma omp simd
        for (int d = 0; d < HS; d++) o[d] += p * vj[d];
    }
    for (int d = 0; d < HS; d++) o[d] /= sum;
}

void neox_attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int S, int pos0,
                           int NH, int NKV, int HS, int maxT, neox_attention_opts opts) {
    int group = NH / NKV, window = opts.window;
#pragma omp parallel for collapse(2) schedule(static) \
    if (NH * S > 1 && 2 * (size_t)NH * S * (pos0 + S) * HS >= NEOX_PARALLEL_MIN_FLOPS)
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < S; i++) {
            const float *K = kcache + (size_t)(h / group) * maxT * HS, *V = vcache + (size_t)(h / group) * maxT * HS;
            int n = pos0 + i + 1, j_first = window > 0 && n > window ? n - window : 0;
            float scores[n];
            attend_row(out + ((size_t)i * NH + h) * HS, scores, q + ((size_t)h * S + i) * HS, K, V, j_first, n, HS,
                       opts.scale, opts.alibi ? opts.alibi[h] : 0.0f);
        }
}
