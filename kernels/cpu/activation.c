// activation.c: the MLP activations (kernels/activation_math.h's formulas), elementwise and gated as
// GPT-NeoX's Gated_Activation, forward and backward. Each function gets its own loop, vectorised
// (libmvec's erff/tanhf/expf, see vector_math.h; AVX-512 and AVX2 builds where the CPU has them) over fixed
// blocks, so which elements take the vector path does not depend on the thread count. Activations
// stored as bf16 are widened a block (or a row) at a time into fp32 scratch, run through the same
// loops and rounded back (storage.h).
#include <stddef.h>

#include "scratch.h"
#include "storage.h"

#include "vector_math.h"
#include "kernels/activation_math.h"
#include "parallel.h"

enum { ACT_BLOCK = 4096 };

// One loop per function, the switch outside it, so each loop vectorises.
#define PER_FUNCTION(fn, LOOP)                                                                                    \
    switch (fn) {                                                                                                 \
    case NEOX_FN_GELU: LOOP(neox_gelu_erf); break;                                                                \
    case NEOX_FN_GELU_TANH: LOOP(neox_gelu_tanh); break;                                                          \
    case NEOX_FN_GELU_ONNX: LOOP(neox_gelu_onnx); break;                                                          \
    case NEOX_FN_RELU: LOOP(neox_relu); break;                                                                    \
    case NEOX_FN_SILU: LOOP(neox_silu); break;                                                                    \
    case NEOX_FN_SOFTSIGN: LOOP(neox_softsign); break;                                                            \
    case NEOX_FN_MISH: LOOP(neox_mish); break;                                                                    \
    case NEOX_FN_SIGMOID: LOOP(neox_sigmoid); break;                                                              \
    case NEOX_FN_IDENTITY: LOOP(identity); break;                                                                 \
    }
#define PER_GRADIENT(fn, LOOP)                                                                                    \
    switch (fn) {                                                                                                 \
    case NEOX_FN_GELU: LOOP(neox_gelu_erf_grad); break;                                                           \
    case NEOX_FN_GELU_TANH: LOOP(neox_gelu_tanh_grad); break;                                                     \
    case NEOX_FN_GELU_ONNX: LOOP(neox_gelu_onnx_grad); break;                                                     \
    case NEOX_FN_RELU: LOOP(neox_relu_grad); break;                                                               \
    case NEOX_FN_SILU: LOOP(neox_silu_grad); break;                                                               \
    case NEOX_FN_SOFTSIGN: LOOP(neox_softsign_grad); break;                                                       \
    case NEOX_FN_MISH: LOOP(neox_mish_grad); break;                                                               \
    case NEOX_FN_SIGMOID: LOOP(neox_sigmoid_grad); break;                                                         \
    case NEOX_FN_IDENTITY: LOOP(identity_grad); break;                                                            \
    }

static inline float identity(float x) { return x; }
static inline float identity_grad(float x) { return (void)x, 1.0f; }

NEOX_CLONES static void forward_block(float *out, const float *inp, size_t n, neox_act_fn fn) {
#define LOOP(f) _Pragma("omp simd") for (size_t i = 0; i < n; i++) out[i] = f(inp[i])
    PER_FUNCTION(fn, LOOP)
#undef LOOP
}

NEOX_CLONES static void backward_block(float *dinp, const float *dout, const float *inp, size_t n, neox_act_fn fn) {
#define LOOP(f) _Pragma("omp simd") for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * f(inp[i])
    PER_GRADIENT(fn, LOOP)
#undef LOOP
}

void neox_activation_forward(void *out, const void *inp, size_t n, neox_act_fn fn, neox_elem act) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i += ACT_BLOCK) {
        float in_block[ACT_BLOCK], out_block[ACT_BLOCK];
        size_t len = n - i < ACT_BLOCK ? n - i : ACT_BLOCK;
        float *o = neox_act_dest(out, i, act, out_block);
        forward_block(o, neox_act_load(inp, i, len, act, in_block), len, fn);
        neox_act_store(out, i, o, len, act);
    }
}

void neox_activation_backward(void *dinp, const void *dout, const void *inp, size_t n, neox_act_fn fn,
                              neox_elem act) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i += ACT_BLOCK) {
        float in_block[ACT_BLOCK], dout_block[ACT_BLOCK], dinp_block[ACT_BLOCK];
        size_t len = n - i < ACT_BLOCK ? n - i : ACT_BLOCK;
        float *d = neox_act_dest(dinp, i, act, dinp_block);
        backward_block(d, neox_act_load(dout, i, len, act, dout_block), neox_act_load(inp, i, len, act, in_block), len,
                       fn);
        neox_act_store(dinp, i, d, len, act);
    }
}

// One row: x = inp[0, F), gate = inp[F, 2F); out = fn(gate) * x.
NEOX_CLONES static void gated_forward_row(float *out, const float *x, const float *gate, int F, neox_act_fn fn) {
#define LOOP(f) _Pragma("omp simd") for (int i = 0; i < F; i++) out[i] = f(gate[i]) * x[i]
    PER_FUNCTION(fn, LOOP)
#undef LOOP
}

// dx = dout * fn(gate); dgate = dout * x * fn'(gate).
NEOX_CLONES static void gated_backward_row(float *dx, float *dgate, const float *dout, const float *x,
                                           const float *gate, int F, neox_act_fn fn) {
#define LOOP(f) _Pragma("omp simd") for (int i = 0; i < F; i++) dx[i] = dout[i] * f(gate[i])
    PER_FUNCTION(fn, LOOP)
#undef LOOP
#define LOOP(f) _Pragma("omp simd") for (int i = 0; i < F; i++) dgate[i] = dout[i] * x[i] * f(gate[i])
    PER_GRADIENT(fn, LOOP)
#undef LOOP
}

// Row scratch under bf16 storage: `rows` fp32 rows of F per thread (nothing under fp32).
static float *row_scratch(neox_elem act, int rows, int F) {
    return act == NEOX_ELEM_BF16 ? neox_cpu_scratch((size_t)rows * F * sizeof(float), "bf16 activation rows") : NULL;
}

void neox_gated_forward(void *out, const void *inp, int N, int F, neox_act_fn fn, neox_elem act) {
    #pragma omp parallel if ((size_t)N * F >= NEOX_PARALLEL_MIN_ELEMS)
    {
        float *s = row_scratch(act, 3, F);  // x | gate, out
        #pragma omp for
        for (int r = 0; r < N; r++) {
            const float *x = neox_act_load(inp, (size_t)r * 2 * F, 2 * (size_t)F, act, s);
            float *o = neox_act_dest(out, (size_t)r * F, act, s + 2 * (size_t)F);
            gated_forward_row(o, x, x + F, F, fn);
            neox_act_store(out, (size_t)r * F, o, F, act);
        }
        free(s);
    }
}

void neox_gated_backward(void *dinp, const void *dout, const void *inp, int N, int F, neox_act_fn fn, neox_elem act) {
    #pragma omp parallel
    {
        float *s = row_scratch(act, 5, F);  // x | gate, dx | dgate, dout
        #pragma omp for
        for (int r = 0; r < N; r++) {
            const float *x = neox_act_load(inp, (size_t)r * 2 * F, 2 * (size_t)F, act, s);
            const float *d = neox_act_load(dout, (size_t)r * F, F, act, s + 4 * (size_t)F);
            float *dx = neox_act_dest(dinp, (size_t)r * 2 * F, act, s + 2 * (size_t)F);
            gated_backward_row(dx, dx + F, d, x, x + F, F, fn);
            neox_act_store(dinp, (size_t)r * 2 * F, dx, 2 * (size_t)F, act);
        }
        free(s);
    }
}
