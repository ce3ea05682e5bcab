// bootstrap.c: the standard error lm-evaluation-harness 0.4 reports for perplexity, reproduced
// draw for draw. The harness (lm_eval/api/metrics.py, bootstrap_stderr) cuts `iters` resamples
// into chunks of min(1000, iters); chunk i (0 <= i < iters / chunk) uses Python's random.Random(i)
// and draws `chunk` resamples with rnd.choices(xs, k=len(xs)); each resample's statistic is
// exp(-mean); the standard error is the sample standard deviation (n - 1) of all of them. Python's
// generator is MT19937 seeded by init_by_array with the seed's 32-bit words, random() takes
// 53 bits from two outputs, and choices picks xs[floor(random() * n)]; all of it is reimplemented
// here, so the numbers are the harness's (checked against CPython in tests/oracle/test_eval.py).
#include <math.h>
#include <string.h>

#include "eval.h"

#define MT_N 624
#define MT_M 397

typedef struct mt19937 {
    uint32_t mt[MT_N];
    int index;
} mt19937;

static void init_genrand(mt19937 *g, uint32_t s) {
    g->mt[0] = s;
    for (int i = 1; i < MT_N; i++) g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
    g->index = MT_N;
}

static void init_by_array(mt19937 *g, const uint32_t *key, int len) {
    init_genrand(g, 19650218u);
    int i = 1, j = 0;
    for (int k = MT_N > len ? MT_N : len; k; k--) {
        g->mt[i] = (g->mt[i] ^ ((g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        if (++i >= MT_N) g->mt[0] = g->mt[MT_N - 1], i = 1;
        if (++j >= len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        g->mt[i] = (g->mt[i] ^ ((g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        if (++i >= MT_N) g->mt[0] = g->mt[MT_N - 1], i = 1;
    }
    g->mt[0] = 0x80000000u;
}

// random.Random(seed) for a non-negative integer: the key is its 32-bit words, least significant
// first ([0] for 0).
static void seed_python(mt19937 *g, uint64_t seed) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    init_by_array(g, key, key[1] ? 2 : 1);
}

static uint32_t twist(uint32_t upper, uint32_t lower, uint32_t far) {
    uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
    return far ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
}

// The next 624 words, in three runs so that no index wraps.
static void regenerate(mt19937 *g) {
    uint32_t *mt = g->mt;
    int i = 0;
    for (; i < MT_N - MT_M; i++) mt[i] = twist(mt[i], mt[i + 1], mt[i + MT_M]);
    for (; i < MT_N - 1; i++) mt[i] = twist(mt[i], mt[i + 1], mt[i + MT_M - MT_N]);
    mt[MT_N - 1] = twist(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
    g->index = 0;
}

static uint32_t next_u32(mt19937 *g) {
    if (g->index >= MT_N) regenerate(g);
    uint32_t y = g->mt[g->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

// random.random(): 53 random bits in [0, 1).
static double next_double(mt19937 *g) {
    uint32_t a = next_u32(g) >> 5, b = next_u32(g) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

double neox_python_random(uint64_t seed, int64_t k) {
    mt19937 g;
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
    mt19937 g;
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
