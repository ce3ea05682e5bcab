// cast.c: fp32 <-> bfloat16 / IEEE half conversions of whole tensors on the CPU (the reference for
// the CUDA casts), and the block conversions of activation storage (storage.h). The roundings
// themselves are kernels.h's scalar conversions. A short tensor (a decoding step's one row, cast
// before each bfloat16 product) is converted on the calling thread (parallel.h).
#include "kernels/kernels.h"
#include "parallel.h"
#include "storage.h"
#include "vector_math.h"

void neox_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_from_f32(inp[i]);
}

void neox_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_to_f32(inp[i]);
}

void neox_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) out[i] = neox_f16_from_f32(inp[i]);
}

void neox_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) out[i] = neox_f16_to_f32(inp[i]);
}

// Activation storage's block conversions (storage.h). Plain loops over kernels.h's scalar roundings
// in AVX-512/AVX2 clones: the integer round-to-nearest-even vectorises and gives the scalar bits,
// which AVX512_BF16's vcvtneps2bf16 would not for subnormals (it flushes them to zero), and the
// GPU's __float2bfloat16_rn keeps them.
NEOX_CLONES static void widen_bf16(float *out, const uint16_t *inp, size_t n) {
    #pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_to_f32(inp[i]);
}

NEOX_CLONES static void narrow_bf16(uint16_t *out, const float *inp, size_t n) {
    #pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_from_f32(inp[i]);
}

const float *neox_act_load(const void *p, size_t i, size_t n, neox_elem e, float *scratch) {
    if (e != NEOX_ELEM_BF16) return (const float *)p + i;
    widen_bf16(scratch, (const uint16_t *)p + i, n);
    return scratch;
}

void neox_act_store(void *p, size_t i, const float *vals, size_t n, neox_elem e) {
    if (e == NEOX_ELEM_BF16) narrow_bf16((uint16_t *)p + i, vals, n);
}
