// random.c: numpy's legacy np.random.RandomState(seed) — the MT19937 generator (lib/core) seeded
// with init_genrand, and shuffle as numpy's mtrand implements it — reproduced bit for bit, because
// GPT-NeoX's doc_idx and shuffle_idx are RandomState shuffles and the sample order must match.
#include "data.h"

#include <string.h>

// numpy's legacy seeding of an integer seed is Matsumoto-Nishimura's init_genrand.
void neox_random_seed(neox_random_state *rs, uint32_t seed) { neox_mt19937_seed(rs, seed); }

uint32_t neox_random_uint32(neox_random_state *rs) { return neox_mt19937_next(rs); }

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
