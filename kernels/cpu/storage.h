// storage.h: how the CPU kernels read and write activations stored as fp32 or bfloat16 (kernels.h,
// "Activation storage"). Two forms of the one conversion (kernels.h's neox_bf16_from_f32 and
// neox_bf16_to_f32, the only rounding on the host): element by element (neox_act_get/set) for
// loops that visit a tensor once, and a block at a time (neox_act_load/store) for loops that are
// vectorised over fp32 blocks (the activations' libmvec calls), so those loops stay as they are.
// Under NEOX_ELEM_F32 both forms read and write the tensor itself, so fp32 results are unchanged.
#ifndef NEOX_CPU_STORAGE_H
#define NEOX_CPU_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

// Element i of an activation tensor p, widened to fp32 (exact).
static inline float neox_act_get(const void *p, size_t i, neox_elem e) {
    return e == NEOX_ELEM_BF16 ? neox_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// Stores v as element i of p, rounded to nearest even under bf16.
static inline void neox_act_set(void *p, size_t i, float v, neox_elem e) {
    if (e == NEOX_ELEM_BF16) ((uint16_t *)p)[i] = neox_bf16_from_f32(v);
    else ((float *)p)[i] = v;
}

// v as element type e stores it (rounded to nearest even under bf16), widened back to fp32.
static inline float neox_act_round(float v, neox_elem e) {
    return e == NEOX_ELEM_BF16 ? neox_bf16_to_f32(neox_bf16_from_f32(v)) : v;
}

// n elements of p from element i on, as fp32: p's own memory under fp32, else widened into scratch (n floats).
const float *neox_act_load(const void *p, size_t i, size_t n, neox_elem e, float *scratch);
// Where to compute n fp32 results bound for p from element i on: p itself under fp32, else scratch.
static inline float *neox_act_dest(void *p, size_t i, neox_elem e, float *scratch) {
    return e == NEOX_ELEM_BF16 ? scratch : (float *)p + i;
}
// Stores the n results computed at neox_act_dest's address (nothing to do under fp32).
void neox_act_store(void *p, size_t i, const float *vals, size_t n, neox_elem e);

#endif
