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

// _Float16 conversions are IEEE round-to-nearest-even (GCC, x86-64 SSE2 and later).
void neox_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        _Float16 h = (_Float16)inp[i];
        memcpy(&out[i], &h, 2);
    }
}

void neox_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        _Float16 h;
        memcpy(&h, &inp[i], 2);
        out[i] = (float)h;
    }
}
