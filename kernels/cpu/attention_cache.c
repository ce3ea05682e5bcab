// attention_cache.c: causal attention of a few new query positions over a key/value cache, for
// generation with a KV cache. Each query row is computed like neox_attention_forward computes it
// (scores, running max, exp-sum, weighted values), so cached decoding matches recomputation.
#include <math.h>

#include "kernels/kernels.h"
#include "parallel.h"

void neox_attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int S, int pos0,
                           int NH, int NKV, int HS, int maxT, neox_attention_opts opts) {
    int group = NH / NKV, window = opts.window;
    float scale = opts.scale;
#pragma omp parallel for collapse(2) schedule(static) \
    if (NH * S > 1 && 2 * (size_t)NH * S * (pos0 + S) * HS >= NEOX_PARALLEL_MIN_FLOPS)
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < S; i++) {
            const float *qi = q + ((size_t)h * S + i) * HS;
            const float *K = kcache + (size_t)(h / group) * maxT * HS, *V = vcache + (size_t)(h / group) * maxT * HS;
            float *o = out + ((size_t)i * NH + h) * HS;
            int n = pos0 + i + 1, j_first = window > 0 && n > window ? n - window : 0;
            float scores[n], slope = opts.alibi ? opts.alibi[h] : 0.0f;
            float mx = -INFINITY;
            for (int j = j_first; j < n; j++) {
                float s = 0.0f;
                for (int d = 0; d < HS; d++) s += qi[d] * K[(size_t)j * HS + d];
                // As the blocked kernel: j - i relative to this query's position n - 1.
                scores[j] = slope != 0.0f ? s * scale + slope * (float)(j - (n - 1)) : s * scale;
                if (scores[j] > mx) mx = scores[j];
            }
            float sum = 0.0f;
            for (int d = 0; d < HS; d++) o[d] = 0.0f;
            for (int j = j_first; j < n; j++) {
                float p = expf(scores[j] - mx);
                sum += p;
                for (int d = 0; d < HS; d++) o[d] += p * V[(size_t)j * HS + d];
            }
            for (int d = 0; d < HS; d++) o[d] /= sum;
        }
}
