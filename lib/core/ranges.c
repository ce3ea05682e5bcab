// ranges.c: the index arithmetic of half-open ranges [lo, hi) that the flat layouts share (a rank's
// share of a flat buffer, the part of a tensor or bucket inside it), in one place so every layer
// cuts the same elements.
#include "core.h"

int neox_overlap(size_t a_lo, size_t a_hi, size_t b_lo, size_t b_hi, size_t *lo, size_t *hi) {
    *lo = a_lo > b_lo ? a_lo : b_lo;
    *hi = a_hi < b_hi ? a_hi : b_hi;
    if (*hi < *lo) *hi = *lo;
    return *hi > *lo;
}

void neox_even_share(size_t n, int part, int parts, size_t *lo, size_t *hi) {
    *lo = n * (size_t)part / (size_t)parts;
    *hi = n * ((size_t)part + 1) / (size_t)parts;
}
