// optimizer_passes.c: the update's passes over the whole parameter and gradient buffers, timed on
// a model's parameter count: the gradient norm's sum of squares (neox_sum_squares against the plain
// double loop under an OpenMP reduction that it replaced) and clipping + AdamW (neox_scale then the
// update, against the update with the clipping coefficient folded in). Rounds alternate the two
// ways of each; the best time of each is printed with the ratio. The results are compared too (the
// fused update must give the same bits).
// Usage: optimizer_passes [n=162322944] [rounds=5]   (n: floats; 162322944 is GPT-NeoX 125M's)
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"

static double plain_sum_squares(const float *x, size_t n) {
    double sum = 0.0;
    #pragma omp parallel for reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

static float *filled(size_t n, unsigned long long seed, float scale, int positive) {
    float *x = neox_malloc(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float v = scale * (float)neox_normal(seed, i);
        x[i] = positive && v < 0 ? -v : v;
    }
    return x;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 162322944;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    float *p = filled(n, 1, 0.02f, 0), *g = filled(n, 2, 1e-3f, 0), *m = filled(n, 3, 1e-4f, 0);
    float *v = filled(n, 4, 1e-7f, 1), *gc = neox_malloc(n * sizeof(float));
    float *p2 = neox_malloc(n * sizeof(float)), *m2 = neox_malloc(n * sizeof(float)), *v2 = neox_malloc(n * sizeof(float));
    memcpy(p2, p, n * sizeof(float)), memcpy(m2, m, n * sizeof(float)), memcpy(v2, v, n * sizeof(float));
    neox_segment all = {0, n, 0.1f};
    float coef = 0.25f;
    double best[4] = {1e30, 1e30, 1e30, 1e30}, sums[2] = {0, 0};
    printf("# n %zu floats, %d threads\n", n, omp_get_max_threads());
    for (int r = 0; r < rounds; r++) {
        double t0 = neox_now();
        sums[0] = plain_sum_squares(g, n);
        double t1 = neox_now();
        sums[1] = neox_sum_squares(g, n);
        double t2 = neox_now();
        memcpy(gc, g, n * sizeof(float));  // (untimed: the scaled pass writes its input)
        double t3 = neox_now();
        neox_scale(gc, n, coef);
        neox_step_scalars sc = {.lr = 1e-4f, .step = r + 1};
        neox_adamw_segments(p, gc, m, v, &all, 1, &sc, 0.9f, 0.95f, 1e-8f, 1.0f, NULL);
        double t4 = neox_now();
        neox_adamw_segments(p2, g, m2, v2, &all, 1, &sc, 0.9f, 0.95f, 1e-8f, coef, NULL);
        double t5 = neox_now();
        double t[4] = {t1 - t0, t2 - t1, t4 - t3, t5 - t4};
        for (int k = 0; k < 4; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
        printf("round %d: sum of squares %.1f / %.1f ms, scale + AdamW %.1f ms, AdamW scaling as it reads %.1f ms\n",
               r + 1, 1e3 * t[0], 1e3 * t[1], 1e3 * t[2], 1e3 * t[3]);
    }
    int same = memcmp(p, p2, n * sizeof(float)) == 0 && memcmp(m, m2, n * sizeof(float)) == 0;
    printf("sum of squares: plain loop %.1f ms, neox_sum_squares %.1f ms (best), %.2fx; relative difference %.1e\n",
           1e3 * best[0], 1e3 * best[1], best[0] / best[1], (sums[1] - sums[0]) / sums[0]);
    printf("clipping + AdamW: two passes %.1f ms, one %.1f ms (best), %.2fx; same bits: %s\n", 1e3 * best[2],
           1e3 * best[3], best[2] / best[3], same ? "yes" : "NO");
    return same ? 0 : 1;
}
