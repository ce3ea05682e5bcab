// optimizer_types.c: each optimizer's update (lib/optim through the CPU backend, as neox-train
// steps it) timed per parameter on the same buffers: AdamW, SGD with momentum, Lion, madgrad_wd
// with momentum and SM3 without and with momentum. The parameters are cut into segments as a
// model's tensors are (every 4M floats, alternating weight decay; for SM3 each a 2048-column matrix,
// the last a vector when its length is not a whole number of rows), rounds alternate the optimizers so that load drifts hit them alike,
// and each one's best round is printed in ns per parameter with its ratio to AdamW's.
// Usage: optimizer_types [n=162322944] [rounds=5]   (n: floats; 162322944 is GPT-NeoX 125M's)
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "kernels/backend.h"
#include "optim.h"

static float *filled(size_t n, unsigned long long seed, float scale) {
    float *x = neox_malloc(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)neox_normal(seed, i);
    return x;
}

static const struct { const char *label; neox_optimizer_kind kind; double momentum; } RUNS[] = {
    {"adamw", NEOX_OPTIMIZER_ADAM, 0.0},
    {"sgd (momentum 0.9)", NEOX_OPTIMIZER_SGD, 0.9},
    {"lion", NEOX_OPTIMIZER_LION, 0.0},
    {"madgrad_wd (momentum 0.9)", NEOX_OPTIMIZER_MADGRAD_WD, 0.9},
    {"sm3", NEOX_OPTIMIZER_SM3, 0.0},
    {"sm3 (momentum 0.9)", NEOX_OPTIMIZER_SM3, 0.9},
};
enum { NRUNS = sizeof RUNS / sizeof *RUNS, SEGMENT = 1 << 22, COLS = 2048 };

// SM3's view of the segments: one tensor each.
static neox_optimizer_tensor *segment_tensors(const neox_segment *segs, int nseg) {
    neox_optimizer_tensor *ts = neox_calloc((size_t)nseg, sizeof *ts);
    for (int s = 0; s < nseg; s++) {
        size_t len = segs[s].end - segs[s].begin;
        int matrix = len % COLS == 0;
        ts[s] = (neox_optimizer_tensor){.offset = segs[s].begin, .numel = len, .matrix = matrix,
                                        .rows = matrix ? (int64_t)(len / COLS) : (int64_t)len, .cols = matrix ? COLS : 1};
    }
    return ts;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 162322944;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    const neox_backend *be = neox_backend_cpu();
    float *p = filled(n, 1, 0.02f), *g = filled(n, 2, 1e-3f);
    int nseg = (int)((n + SEGMENT - 1) / SEGMENT);
    neox_segment *segs = neox_malloc((size_t)nseg * sizeof *segs);
    for (int s = 0; s < nseg; s++) {
        size_t b = (size_t)s * SEGMENT, e = b + SEGMENT < n ? b + SEGMENT : n;
        segs[s] = (neox_segment){b, e, s % 2 ? 0.0f : 0.1f};
    }
    neox_optimizer *opt[NRUNS];
    neox_optimizer_tensor *tensors = segment_tensors(segs, nseg);
    for (int r = 0; r < NRUNS; r++) {
        neox_optimizer_settings s = {.kind = RUNS[r].kind, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                     .momentum = RUNS[r].momentum, .weight_decay = 0.1};
        opt[r] = neox_optimizer_make(&s, be, n);
        neox_optimizer_set_tensors(opt[r], 0, tensors, nseg);  // (SM3's shapes; nothing for the others)
        neox_optimizer_step(opt[r], p, g, segs, nseg, 1e-4, 1);  // first touch of the state, untimed
    }
    double best[NRUNS];
    for (int r = 0; r < NRUNS; r++) best[r] = 1e30;
    for (int round = 0; round < rounds; round++)
        for (int r = 0; r < NRUNS; r++) {
            double t0 = omp_get_wtime();
            neox_optimizer_step(opt[r], p, g, segs, nseg, 1e-4, 2 + round);
            double t = omp_get_wtime() - t0;
            if (t < best[r]) best[r] = t;
        }
    printf("# %zu parameters, %d threads, best of %d rounds\n", n, omp_get_max_threads(), rounds);
    printf("%-28s %12s %14s %10s\n", "optimizer", "ms", "ns/parameter", "vs adamw");
    for (int r = 0; r < NRUNS; r++)
        printf("%-28s %12.1f %14.3f %9.2fx\n", RUNS[r].label, best[r] * 1e3, best[r] * 1e9 / (double)n,
               best[r] / best[0]);
    for (int r = 0; r < NRUNS; r++) neox_optimizer_free(opt[r]);
    free(segs), free(tensors), free(p), free(g);
    return 0;
}
