// bootstrap.c: the standard error lm-evaluation-harness 0.4 reports for perplexity, reproduced
// draw for draw. The harness (lm_eval/api/metrics.py, bootstrap_stderr) cuts `iters` resamples
// into chunks of min(1000, iters); chunk i (0 <= i < iters / chunk) uses Python's random.Random(i)
// and draws `chunk` resamples with rnd.choices(xs, k=len(xs)); each resample's statistic is
// exp(-mean); the standard error is the sample standard deviation (n - 1) of all of them. Python's
// generator is MT19937 (lib/core) seeded by init_by_array with the seed's 32-bit words, random()
// takes 53 bits from two outputs, and choices picks xs[floor(random() * n)]; all of it is
// reimplemented here, so the numbers are the harness's (checked against CPython in tests/oracle/test_eval.py).
#include <math.h>
#include <string.h>

#include "eval.h"

// random.Random(seed) for a non-negative integer: the key is its 32-bit words, least significant
// first ([0] for 0).
static void seed_python(neox_mt19937 *g, uint64_t seed) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    neox_mt19937_seed_by_array(g, key, key[1] ? 2 : 1);
}

// random.random(): 53 random bits in [0, 1).
static double next_double(neox_mt19937 *g) {
    uint32_t a = neox_mt19937_next(g) >> 5, b = neox_mt19937_next(g) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

double neox_python_random(uint64_t seed, int64_t k) {
    neox_mt19937 g;
    seed_python(&g, seed);
    double x = 0.0;
    for (int64_t i = 0; i <= k; i++) x = next_double(&g);
    return x;
}

int64_t neox_bootstrap_chunk(int64_t iters) { return iters < 1000 ? iters : 1000; }

int64_t neox_bootstrap_count(int64_t iters) {
    int64_t chunk = neox_bootstrap_chunk(iters);
    return chunk > 0 ? iters / chunk * chunk : 0;
}

// One chunk: `chunk` resamples of exp(-mean) drawn with random.Random(seed).choices, summed in
// draw order as Python's sum() adds a list.
static void bootstrap_chunk(const double *ll, int64_t n, uint64_t seed, int64_t chunk, double *out) {
    neox_mt19937 g;
    seed_python(&g, seed);
    double dn = (double)n;
    for (int64_t r = 0; r < chunk; r++) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += ll[(int64_t)(next_double(&g) * dn)];  // floor: the product is >= 0
        out[r] = exp(-(sum / dn));
    }
}

void neox_bootstrap_perplexity(const double *ll, int64_t n, int64_t iters, int part, int parts, double *replicates) {
    int64_t chunk = neox_bootstrap_chunk(iters), chunks = chunk > 0 ? iters / chunk : 0;
    #pragma omp parallel for schedule(dynamic)
    for (int64_t c = part; c < chunks; c += parts) bootstrap_chunk(ll, n, (uint64_t)c, chunk, replicates + c * chunk);
}

double neox_sample_stddev(const double *x, int64_t n) {
    if (n < 2) return NAN;
    double sum = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    double mu = sum / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mu) * (x[i] - mu);
    return sqrt(ss / (double)(n - 1));
}
