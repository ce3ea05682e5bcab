// cast.c: fp32 <-> bfloat16 / IEEE half conversions on the CPU (the reference for the CUDA casts,
// and what mixed-precision checkpoints and collectives use on the host).
#include <string.h>

#include "kernels/kernels.h"

static uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN (quiet)
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

void neox_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(inp[i]);
}

void neox_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)inp[i] << 16;
        memcpy(&out[i], &bits, 4);
    }
}

// fp16 by hand rather than with _Float16, which needs GCC 12 on x86 (the GPU machine's compiler
// may be older): round to nearest even, 65520 and above to infinity, subnormals below 2^-14.
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays (quiet) NaN
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                         // >= 65520: infinity
    if (ax >= 0x38800000u) {  // a normal half (>= 2^-14): rebias the exponent, round 23 -> 10 mantissa bits
        uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (ax < 0x33000000u) return (uint16_t)sign;  // below 2^-25 (2^-25 itself ties to even 0)
    // A subnormal half counts units of 2^-24: the float is m * 2^(e - 150), i.e. m >> (126 - e) units.
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;  // may carry into the smallest normal: still right
    return (uint16_t)(sign | q);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) x = sign | 0x7f800000u | (m << 13);   // infinity, NaN
    else if (e) x = sign | ((e + 112) << 23) | (m << 13);  // normal: rebias 15 -> 127
    else {                                                 // zero, subnormal: m * 2^-24, exact in fp32
        float v = (float)m * 5.9604644775390625e-8f;
        memcpy(&x, &v, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void neox_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = f32_to_f16(inp[i]);
}

void neox_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(inp[i]);
}
