// cast.c: fp32 <-> bfloat16 / IEEE half conversions of whole tensors on the CPU (the reference for
// the CUDA casts). The roundings themselves are kernels.h's scalar conversions.
#include "kernels/kernels.h"

void neox_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_from_f32(inp[i]);
}

void neox_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_to_f32(inp[i]);
}

void neox_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = neox_f16_from_f32(inp[i]);
}

void neox_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = neox_f16_to_f32(inp[i]);
}
