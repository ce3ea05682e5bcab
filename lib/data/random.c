// random.c: numpy's legacy np.random.RandomState(seed) — the MT19937 generator seeded with
// init_genrand, and shuffle as numpy's mtrand implements it — reproduced bit for bit, because
// GPT-NeoX's doc_idx and shuffle_idx are RandomState shuffles and the sample order must match.
#include "data.h"

#include <string.h>

enum { MT_N = 624, MT_M = 397 };
#define MT_MATRIX_A 0x9908b0dfU
#define MT_UPPER 0x80000000U
#define MT_LOWER 0x7fffffffU

// numpy's legacy seeding of an integer seed is Matsumoto-Nishimura's init_genrand.
void neox_random_seed(neox_random_state *rs, uint32_t seed) {
    rs->key[0] = seed;
    for (int i = 1; i < MT_N; i++) rs->key[i] = 1812433253U * (rs->key[i - 1] ^ (rs->key[i - 1] >> 30)) + (uint32_t)i;
    rs->pos = MT_N;
}

static void regenerate(neox_random_state *rs) {
    uint32_t *k = rs->key;
    int i;
    for (i = 0; i < MT_N - MT_M; i++) {
        uint32_t y = (k[i] & MT_UPPER) | (k[i + 1] & MT_LOWER);
        k[i] = k[i + MT_M] ^ (y >> 1) ^ (-(y & 1) & MT_MATRIX_A);
    }
    for (; i < MT_N - 1; i++) {
        uint32_t y = (k[i] & MT_UPPER) | (k[i + 1] & MT_LOWER);
        k[i] = k[i + (MT_M - MT_N)] ^ (y >> 1) ^ (-(y & 1) & MT_MATRIX_A);
    }
    uint32_t y = (k[MT_N - 1] & MT_UPPER) | (k[0] & MT_LOWER);
    k[MT_N - 1] = k[MT_M - 1] ^ (y >> 1) ^ (-(y & 1) & MT_MATRIX_A);
    rs->pos = 0;
}

uint32_t neox_random_uint32(neox_random_state *rs) {
    if (rs->pos >= MT_N) regenerate(rs);
    uint32_t y = rs->key[rs->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
}

// numpy builds a 64-bit draw from two 32-bit ones, the first as the high half.
uint64_t neox_random_uint64(neox_random_state *rs) {
    uint64_t hi = neox_random_uint32(rs);
    return hi << 32 | neox_random_uint32(rs);
}

// Rejection sampling under the smallest all-ones mask covering max (numpy's random_interval).
uint64_t neox_random_interval(neox_random_state *rs, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1; mask |= mask >> 2; mask |= mask >> 4;
    mask |= mask >> 8; mask |= mask >> 16; mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
        while ((value = (neox_random_uint32(rs) & mask)) > max) {}
    } else {
        while ((value = (neox_random_uint64(rs) & mask)) > max) {}
    }
    return value;
}

#define SHUFFLE_TYPED(T)                                          \
    do {                                                          \
        T *x = data;                                              \
        for (int64_t i = n - 1; i > 0; i--) {                     \
            uint64_t j = neox_random_interval(rs, (uint64_t)i);   \
            T t = x[i]; x[i] = x[j]; x[j] = t;                    \
        }                                                         \
    } while (0)

void neox_random_shuffle(neox_random_state *rs, void *data, int64_t n, size_t elem_size) {
    switch (elem_size) {
    case 1: SHUFFLE_TYPED(uint8_t); break;
    case 2: SHUFFLE_TYPED(uint16_t); break;
    case 4: SHUFFLE_TYPED(uint32_t); break;
    default: SHUFFLE_TYPED(uint64_t); break;
    }
}
