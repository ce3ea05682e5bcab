// activation.c: GELU (exact and tanh approximation) and GPT-NeoX's SwiGLU, forward and backward.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

void neox_gelu_forward(float *out, const float *inp, size_t n, int approximate) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = approximate ? 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)))
                             : 0.5f * x * (1.0f + erff(x * INV_SQRT_2));
    }
}

void neox_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n, int approximate) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], grad;
        if (approximate) {
            float u = SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
            float th = tanhf(u);
            float du = SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
            grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        } else {
            grad = 0.5f * (1.0f + erff(x * INV_SQRT_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
        }
        dinp[i] = dout[i] * grad;
    }
}

void neox_swiglu_forward(float *out, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * 2 * F, *g = x + F;
        float *o = out + (size_t)r * F;
        for (int i = 0; i < F; i++) o[i] = x[i] * g[i] / (1.0f + expf(-g[i]));
    }
}

void neox_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * 2 * F, *g = x + F, *d = dout + (size_t)r * F;
        float *dx = dinp + (size_t)r * 2 * F, *dg = dx + F;
        for (int i = 0; i < F; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i]));
            float silu = g[i] * sig;
            dx[i] = d[i] * silu;
            dg[i] = d[i] * x[i] * sig * (1.0f + g[i] * (1.0f - sig));
        }
    }
}
