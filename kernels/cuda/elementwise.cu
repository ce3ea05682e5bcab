// elementwise.cu: residual additions, bias, dropout (the CPU's counter-based mask, bit for bit),
// scaling, jitter, the MLP activations (elementwise and gated) and the fp32 <-> bf16/fp16 casts. One thread per element
// in grid-stride loops; the formulas are kernels/cpu/activation.c's and elementwise.c's. The residual
// additions, bias, dropout, jitter and activations are templates on the activations' storage type (common.cuh).
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

// x: (n) = a + b, all of storage type T.
template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) act_store(out, i, __fadd_rn(act_load(a, i), act_load(b, i)));
}
extern "C" void neox_cuda_add(void *out, const void *a, const void *b, size_t n, neox_elem act) {
    ACT_DISPATCH(act, T, LAUNCH(add_kernel<T>, n, (T *)out, (const T *)a, (const T *)b, n));
}
extern "C" void neox_cuda_add_inplace(float *acc, const float *x, size_t n) { LAUNCH(add_kernel<float>, n, acc, acc, x, n); }

// x: (N, C) += bias: (C), n = N * C.
template <typename T> __global__ void add_bias_kernel(T *x, const float *bias, size_t n, int C) {
    GRID_STRIDE(i, n) act_store(x, i, __fadd_rn(act_load(x, i), bias[i % C]));
}
extern "C" void neox_cuda_add_bias(void *x, const float *bias, int N, int C, neox_elem act) {
    size_t n = (size_t)N * C;
    ACT_DISPATCH(act, T, LAUNCH(add_bias_kernel<T>, n, (T *)x, bias, n, C));
}

// x: (n). row0_at (NULL, or one row on the device) is read by every thread, so a replayed graph takes
// the row its step wrote there.
template <typename T>
__global__ void dropout_kernel(T *out, const T *inp, size_t n, float p, float keep_scale, unsigned long long seed,
                               unsigned long long offset, const unsigned long long *row0_at,
                               unsigned long long row_elems) {
    if (row0_at) offset += *row0_at * row_elems;
    GRID_STRIDE(i, n) act_store(out, i, neox_uniform(seed, offset + i) >= p ? __fmul_rn(act_load(inp, i), keep_scale) : 0.0f);
}
extern "C" void neox_cuda_dropout(void *out, const void *inp, size_t n, float p, unsigned long long seed,
                                  unsigned long long offset, const unsigned long long *row0_at,
                                  unsigned long long row_elems, neox_elem act) {
    float keep_scale = 1.0f / (1.0f - p);  // on the host, as the CPU computes it
    ACT_DISPATCH(act, T, LAUNCH(dropout_kernel<T>, n, (T *)out, (const T *)inp, n, p, keep_scale, seed, offset,
                                row0_at, row_elems));
}

// The CPU's expression, rounded step by step (no fused multiply-add).
template <typename T>
__global__ void jitter_kernel(T *out, const T *inp, size_t n, float low, float span, unsigned long long seed) {
    GRID_STRIDE(i, n) act_store(out, i, __fmul_rn(act_load(inp, i), __fadd_rn(low, __fmul_rn(neox_uniform(seed, i), span))));
}
extern "C" void neox_cuda_jitter(void *out, const void *inp, size_t n, float eps, unsigned long long seed,
                                 neox_elem act) {
    float low = 1.0f - eps, span = (1.0f + eps) - low;  // on the host, as the CPU computes them
    ACT_DISPATCH(act, T, LAUNCH(jitter_kernel<T>, n, (T *)out, (const T *)inp, n, low, span, seed));
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    GRID_STRIDE(i, n) x[i] *= s;
}
extern "C" void neox_cuda_scale(float *x, size_t n, float s) { LAUNCH(scale_kernel, n, x, n, s); }

// neox_clip_by_norm: every thread derives the factor from *sumsq in double, with the host's
// expressions (double sqrt and division are correctly rounded on both), so no value goes to the host.
__global__ void clip_by_norm_kernel(float *x, size_t n, const double *sumsq, double loss_scale,
                                    const double *loss_scale_at, double clip_grad) {
    if (loss_scale_at) loss_scale = *loss_scale_at;
    double norm = sqrt(*sumsq) / loss_scale, coef = 1.0 / loss_scale * neox_clip_coefficient(clip_grad, norm);
    if (!isfinite(norm) || coef == 1.0) return;
    float s = (float)coef;
    GRID_STRIDE(i, n) x[i] *= s;
}
extern "C" void neox_cuda_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale,
                                       const double *loss_scale_at, double clip_grad) {
    LAUNCH(clip_by_norm_kernel, n, x, n, sumsq, loss_scale, loss_scale_at, clip_grad);
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

template <typename T> __global__ void activation_forward_kernel(T *out, const T *inp, size_t n, neox_act_fn fn) {
    GRID_STRIDE(i, n) act_store(out, i, neox_act_value(fn, act_load(inp, i)));
}
template <typename T>
__global__ void activation_backward_kernel(T *dinp, const T *dout, const T *inp, size_t n, neox_act_fn fn) {
    GRID_STRIDE(i, n) act_store(dinp, i, act_load(dout, i) * neox_act_grad(fn, act_load(inp, i)));
}
extern "C" void neox_cuda_activation_forward(void *out, const void *inp, size_t n, neox_act_fn fn, neox_elem act) {
    ACT_DISPATCH(act, T, LAUNCH(activation_forward_kernel<T>, n, (T *)out, (const T *)inp, n, fn));
}
extern "C" void neox_cuda_activation_backward(void *dinp, const void *dout, const void *inp, size_t n, neox_act_fn fn,
                                              neox_elem act) {
    ACT_DISPATCH(act, T, LAUNCH(activation_backward_kernel<T>, n, (T *)dinp, (const T *)dout, (const T *)inp, n, fn));
}

// inp: (N, 2F) = [x | gate]; element i of out (N, F) is row i / F, column i % F.
template <typename T> __global__ void gated_forward_kernel(T *out, const T *inp, size_t n, int F, neox_act_fn fn) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, c = i % F;
        act_store(out, i, neox_act_value(fn, act_load(inp, r * 2 * F + F + c)) * act_load(inp, r * 2 * F + c));
    }
}
template <typename T>
__global__ void gated_backward_kernel(T *dinp, const T *dout, const T *inp, size_t n, int F, neox_act_fn fn) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, c = i % F;
        float x = act_load(inp, r * 2 * F + c), g = act_load(inp, r * 2 * F + F + c), d = act_load(dout, i);
        act_store(dinp, r * 2 * F + c, d * neox_act_value(fn, g));
        act_store(dinp, r * 2 * F + F + c, d * x * neox_act_grad(fn, g));
    }
}
extern "C" void neox_cuda_gated_forward(void *out, const void *inp, int N, int F, neox_act_fn fn, neox_elem act) {
    size_t n = (size_t)N * F;
    ACT_DISPATCH(act, T, LAUNCH(gated_forward_kernel<T>, n, (T *)out, (const T *)inp, n, F, fn));
}
extern "C" void neox_cuda_gated_backward(void *dinp, const void *dout, const void *inp, int N, int F, neox_act_fn fn,
                                         neox_elem act) {
    size_t n = (size_t)N * F;
    ACT_DISPATCH(act, T, LAUNCH(gated_backward_kernel<T>, n, (T *)dinp, (const T *)dout, (const T *)inp, n, F, fn));
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
