// mt19937.c: the Mersenne Twister (Matsumoto and Nishimura's MT19937), the generator behind both
// numpy's legacy RandomState (seeded by init_genrand: lib/data/random.c, GPT-NeoX's sample order)
// and Python's random.Random (seeded by init_by_array: lib/eval/bootstrap.c, the harness's
// bootstrap). One engine, so the two reproductions cannot drift apart.
#include "core.h"

enum { MT_N = NEOX_MT19937_N, MT_M = 397 };

void neox_mt19937_seed(neox_mt19937 *g, uint32_t seed) {
    g->key[0] = seed;
    for (int i = 1; i < MT_N; i++) g->key[i] = 1812433253u * (g->key[i - 1] ^ (g->key[i - 1] >> 30)) + (uint32_t)i;
    g->pos = MT_N;
}

void neox_mt19937_seed_by_array(neox_mt19937 *g, const uint32_t *key, int len) {
    neox_mt19937_seed(g, 19650218u);
    uint32_t *mt = g->key;
    int i = 1, j = 0;
    for (int k = MT_N > len ? MT_N : len; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        if (++i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
        if (++j >= len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        if (++i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
    }
    mt[0] = 0x80000000u;
}

static uint32_t twist(uint32_t upper, uint32_t lower, uint32_t far) {
    uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
    return far ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
}

// The next 624 words, in three runs so that no index wraps.
static void regenerate(neox_mt19937 *g) {
    uint32_t *mt = g->key;
    int i = 0;
    for (; i < MT_N - MT_M; i++) mt[i] = twist(mt[i], mt[i + 1], mt[i + MT_M]);
    for (; i < MT_N - 1; i++) mt[i] = twist(mt[i], mt[i + 1], mt[i + MT_M - MT_N]);
    mt[MT_N - 1] = twist(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
    g->pos = 0;
}

uint32_t neox_mt19937_next(neox_mt19937 *g) {
    if (g->pos >= MT_N) regenerate(g);
    uint32_t y = g->key[g->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}
