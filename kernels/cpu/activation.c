// activation.c: GELU (exact and tanh approximation) and GPT-NeoX's SwiGLU, forward and backward.
// Loops are vectorised (libmvec's erff/tanhf/expf, see vector_math.h; AVX2 builds of the GELU blocks
// where the CPU has it) over fixed blocks, so which elements take the vector path does not depend
// on the thread count.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "vector_math.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

enum { ACT_BLOCK = 4096 };

NEOX_CLONES static void gelu_forward_block(float *out, const float *inp, size_t n, int approximate) {
    if (approximate) {
        #pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float x = inp[i];
            out[i] = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)));
        }
    } else {
        #pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float x = inp[i];
            out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT_2));
        }
    }
}

NEOX_CLONES static void gelu_backward_block(float *dinp, const float *dout, const float *inp, size_t n, int approximate) {
    if (approximate) {
        #pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float x = inp[i];
            float u = SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
            float th = tanhf(u);
            float du = SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
            dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
        }
    } else {
        #pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float x = inp[i];
            dinp[i] = dout[i] * (0.5f * (1.0f + erff(x * INV_SQRT_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x));
        }
    }
}

void neox_gelu_forward(float *out, const float *inp, size_t n, int approximate) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i += ACT_BLOCK)
        gelu_forward_block(out + i, inp + i, n - i < ACT_BLOCK ? n - i : ACT_BLOCK, approximate);
}

void neox_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n, int approximate) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i += ACT_BLOCK)
        gelu_backward_block(dinp + i, dout + i, inp + i, n - i < ACT_BLOCK ? n - i : ACT_BLOCK, approximate);
}

void neox_swiglu_forward(float *out, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * 2 * F, *g = x + F;
        float *o = out + (size_t)r * F;
        #pragma omp simd
        for (int i = 0; i < F; i++) o[i] = x[i] * g[i] / (1.0f + expf(-g[i]));
    }
}

void neox_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * 2 * F, *g = x + F, *d = dout + (size_t)r * F;
        float *dx = dinp + (size_t)r * 2 * F, *dg = dx + F;
        #pragma omp simd
        for (int i = 0; i < F; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i]));
            float silu = g[i] * sig;
            dx[i] = d[i] * silu;
            dg[i] = d[i] * x[i] * sig * (1.0f + g[i] * (1.0f - sig));
        }
    }
}
