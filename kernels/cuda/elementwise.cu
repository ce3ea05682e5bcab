// elementwise.cu: residual additions, bias, dropout (the CPU's counter-based mask, bit for bit),
// scaling, the MLP activations (elementwise and gated) and the fp32 <-> bf16/fp16 casts. One thread per element
// in grid-stride loops; the formulas are kernels/cpu/activation.c's and elementwise.c's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math_constants.h>

#include "kernels/activation_math.h"

#include "kernels/cuda/common.cuh"

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                                                                              \
    do {                                                                                                    \
        if ((n) > 0) {                                                                                      \
            kernel<<<blocks_for((n), 256), 256, 0, neox_cuda_current_stream()>>>(__VA_ARGS__);              \
            CUDA_LAUNCHED();                                                                                \
        }                                                                                                   \
    } while (0)

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
extern "C" void neox_cuda_add(float *out, const float *a, const float *b, size_t n) { LAUNCH(add_kernel, n, out, a, b, n); }
extern "C" void neox_cuda_add_inplace(float *acc, const float *x, size_t n) { LAUNCH(add_kernel, n, acc, acc, x, n); }

__global__ void add_bias_kernel(float *x, const float *bias, size_t n, int C) {
    GRID_STRIDE(i, n) x[i] += bias[i % C];
}
extern "C" void neox_cuda_add_bias(float *x, const float *bias, int N, int C) {
    size_t n = (size_t)N * C;
    LAUNCH(add_bias_kernel, n, x, bias, n, C);
}

__global__ void dropout_kernel(float *out, const float *inp, size_t n, float p, float keep_scale,
                               unsigned long long seed, unsigned long long offset) {
    GRID_STRIDE(i, n) out[i] = neox_uniform(seed, offset + i) >= p ? __fmul_rn(inp[i], keep_scale) : 0.0f;
}
extern "C" void neox_cuda_dropout(float *out, const float *inp, size_t n, float p, unsigned long long seed,
                                  unsigned long long offset) {
    float keep_scale = 1.0f / (1.0f - p);  // on the host, as the CPU computes it
    LAUNCH(dropout_kernel, n, out, inp, n, p, keep_scale, seed, offset);
}

// The CPU's expression, rounded step by step (no fused multiply-add).
__global__ void jitter_kernel(float *out, const float *inp, size_t n, float low, float span, unsigned long long seed) {
    GRID_STRIDE(i, n) out[i] = __fmul_rn(inp[i], __fadd_rn(low, __fmul_rn(neox_uniform(seed, i), span)));
}
extern "C" void neox_cuda_jitter(float *out, const float *inp, size_t n, float eps, unsigned long long seed) {
    float low = 1.0f - eps, span = (1.0f + eps) - low;  // on the host, as the CPU computes them
    LAUNCH(jitter_kernel, n, out, inp, n, low, span, seed);
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    GRID_STRIDE(i, n) x[i] *= s;
}
extern "C" void neox_cuda_scale(float *x, size_t n, float s) { LAUNCH(scale_kernel, n, x, n, s); }

// neox_clip_by_norm: every thread derives the factor from *sumsq in double, with the host's
// expressions (double sqrt and division are correctly rounded on both), so no value goes to the host.
__global__ void clip_by_norm_kernel(float *x, size_t n, const double *sumsq, double loss_scale, double clip_grad) {
    double norm = sqrt(*sumsq) / loss_scale, coef = 1.0 / loss_scale * neox_clip_coefficient(clip_grad, norm);
    if (!isfinite(norm) || coef == 1.0) return;
    float s = (float)coef;
    GRID_STRIDE(i, n) x[i] *= s;
}
extern "C" void neox_cuda_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale, double clip_grad) {
    LAUNCH(clip_by_norm_kernel, n, x, n, sumsq, loss_scale, clip_grad);
}

// neox_loss_guard: a handful of values, one thread (its only job is to keep the decision on the device).
__global__ void loss_guard_kernel(double *guard, const double *sumsq, const double *loss_sums, int n) {
    double g = *sumsq;
    for (int i = 0; i < n; i++)
        if (!isfinite(neox_mean_loss(loss_sums[2 * i], loss_sums[2 * i + 1]))) g = CUDART_NAN;
    *guard = g;
}
extern "C" void neox_cuda_loss_guard(double *guard, const double *sumsq, const double *loss_sums, int n) {
    loss_guard_kernel<<<1, 1, 0, neox_cuda_current_stream()>>>(guard, sumsq, loss_sums, n);
    CUDA_LAUNCHED();
}

// ---- activations (kernels/activation_math.h's formulas, shared with the CPU) ----------------------

__global__ void activation_forward_kernel(float *out, const float *inp, size_t n, neox_act_fn fn) {
    GRID_STRIDE(i, n) out[i] = neox_act_value(fn, inp[i]);
}
__global__ void activation_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n, neox_act_fn fn) {
    GRID_STRIDE(i, n) dinp[i] = dout[i] * neox_act_grad(fn, inp[i]);
}
extern "C" void neox_cuda_activation_forward(float *out, const float *inp, size_t n, neox_act_fn fn) {
    LAUNCH(activation_forward_kernel, n, out, inp, n, fn);
}
extern "C" void neox_cuda_activation_backward(float *dinp, const float *dout, const float *inp, size_t n,
                                              neox_act_fn fn) {
    LAUNCH(activation_backward_kernel, n, dinp, dout, inp, n, fn);
}

// inp: (N, 2F) = [x | gate]; element i of out (N, F) is row i / F, column i % F.
__global__ void gated_forward_kernel(float *out, const float *inp, size_t n, int F, neox_act_fn fn) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, c = i % F;
        out[i] = neox_act_value(fn, inp[r * 2 * F + F + c]) * inp[r * 2 * F + c];
    }
}
__global__ void gated_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n, int F,
                                      neox_act_fn fn) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, c = i % F;
        float x = inp[r * 2 * F + c], g = inp[r * 2 * F + F + c], d = dout[i];
        dinp[r * 2 * F + c] = d * neox_act_value(fn, g);
        dinp[r * 2 * F + F + c] = d * x * neox_act_grad(fn, g);
    }
}
extern "C" void neox_cuda_gated_forward(float *out, const float *inp, int N, int F, neox_act_fn fn) {
    size_t n = (size_t)N * F;
    LAUNCH(gated_forward_kernel, n, out, inp, n, F, fn);
}
extern "C" void neox_cuda_gated_backward(float *dinp, const float *dout, const float *inp, int N, int F, neox_act_fn fn) {
    size_t n = (size_t)N * F;
    LAUNCH(gated_backward_kernel, n, dinp, dout, inp, n, F, fn);
}

// ---- casts (round to nearest even, as kernels/cpu/cast.c) -----------------------------------------

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(inp[i]);
}
__global__ void bf16_to_f32_kernel(float *out, const __nv_bfloat16 *inp, size_t n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(inp[i]);
}
__global__ void f32_to_f16_kernel(__half *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) out[i] = __float2half_rn(inp[i]);
}
__global__ void f16_to_f32_kernel(float *out, const __half *inp, size_t n) {
    GRID_STRIDE(i, n) out[i] = __half2float(inp[i]);
}
extern "C" void neox_cuda_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
    LAUNCH(f32_to_bf16_kernel, n, (__nv_bfloat16 *)out, inp, n);
}
extern "C" void neox_cuda_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
    LAUNCH(bf16_to_f32_kernel, n, out, (const __nv_bfloat16 *)inp, n);
}
extern "C" void neox_cuda_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    LAUNCH(f32_to_f16_kernel, n, (__half *)out, inp, n);
}
extern "C" void neox_cuda_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    LAUNCH(f16_to_f32_kernel, n, out, (const __half *)inp, n);
}
