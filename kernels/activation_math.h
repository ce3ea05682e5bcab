// activation_math.h: the scalar formulas of the MLP activations, one definition compiled for the CPU
// kernels (kernels/cpu/activation.c) and the CUDA ones (kernels/cuda/elementwise.cu), so both
// backends compute each activation and its derivative the same way. The formulas are GPT-NeoX's
// (megatron/model/activations.py) and torch's: where GPT-NeoX's own code differs from torch's
// function (onnx_safe's erf_gelu, bias_gelu_fusion's tanh constants) its constants are kept.
#ifndef NEOX_ACTIVATION_MATH_H
#define NEOX_ACTIVATION_MATH_H

#include <math.h>

#include "kernels/kernels.h"

#define NEOX_SQRT_2_OVER_PI 0.7978845608028654f
#define NEOX_INV_SQRT_2 0.7071067811865476f
#define NEOX_INV_SQRT_2PI 0.3989422804014327f
#define NEOX_ONNX_SQRT_2 1.41421f          // erf_gelu divides by this literal, not by sqrt(2)
#define NEOX_TWO_OVER_SQRT_PI 1.1283791670955126f

// GELU, exact: torch.nn.functional.gelu.
static inline NEOX_HOST_DEVICE float neox_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * NEOX_INV_SQRT_2)); }
static inline NEOX_HOST_DEVICE float neox_gelu_erf_grad(float x) {
    return 0.5f * (1.0f + erff(x * NEOX_INV_SQRT_2)) + x * NEOX_INV_SQRT_2PI * expf(-0.5f * x * x);
}
// GELU, tanh approximation (bias_gelu_fusion; HF gelu_new).
static inline NEOX_HOST_DEVICE float neox_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(NEOX_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)));
}
static inline NEOX_HOST_DEVICE float neox_gelu_tanh_grad(float x) {
    float th = tanhf(NEOX_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x));
    float du = NEOX_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}
// onnx_safe: x * 0.5 * (erf(x / 1.41421) + 1).
static inline NEOX_HOST_DEVICE float neox_gelu_onnx(float x) { return x * 0.5f * (erff(x / NEOX_ONNX_SQRT_2) + 1.0f); }
static inline NEOX_HOST_DEVICE float neox_gelu_onnx_grad(float x) {
    float u = x / NEOX_ONNX_SQRT_2;
    return 0.5f * (erff(u) + 1.0f) + x * 0.5f * NEOX_TWO_OVER_SQRT_PI * expf(-u * u) / NEOX_ONNX_SQRT_2;
}
// relu: torch's derivative is 0 at 0.
static inline NEOX_HOST_DEVICE float neox_relu(float x) { return x > 0.0f ? x : 0.0f; }
static inline NEOX_HOST_DEVICE float neox_relu_grad(float x) { return x > 0.0f ? 1.0f : 0.0f; }
static inline NEOX_HOST_DEVICE float neox_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline NEOX_HOST_DEVICE float neox_sigmoid_grad(float x) {
    float s = neox_sigmoid(x);
    return s * (1.0f - s);
}
// silu = swish with beta 1: x * sigmoid(x).
static inline NEOX_HOST_DEVICE float neox_silu(float x) { return x / (1.0f + expf(-x)); }
static inline NEOX_HOST_DEVICE float neox_silu_grad(float x) {
    float s = neox_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
static inline NEOX_HOST_DEVICE float neox_softsign(float x) { return x / (1.0f + fabsf(x)); }
static inline NEOX_HOST_DEVICE float neox_softsign_grad(float x) {
    float d = 1.0f + fabsf(x);
    return 1.0f / (d * d);
}
// mish = x * tanh(softplus(x)), softplus as torch's (linear above 20).
static inline NEOX_HOST_DEVICE float neox_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static inline NEOX_HOST_DEVICE float neox_mish(float x) { return x * tanhf(neox_softplus(x)); }
static inline NEOX_HOST_DEVICE float neox_mish_grad(float x) {
    float t = tanhf(neox_softplus(x));
    return t + x * (1.0f - t * t) * neox_sigmoid(x);
}

static inline NEOX_HOST_DEVICE float neox_act_value(neox_act_fn fn, float x) {
    switch (fn) {
    case NEOX_FN_GELU: return neox_gelu_erf(x);
    case NEOX_FN_GELU_TANH: return neox_gelu_tanh(x);
    case NEOX_FN_GELU_ONNX: return neox_gelu_onnx(x);
    case NEOX_FN_RELU: return neox_relu(x);
    case NEOX_FN_SILU: return neox_silu(x);
    case NEOX_FN_SOFTSIGN: return neox_softsign(x);
    case NEOX_FN_MISH: return neox_mish(x);
    case NEOX_FN_SIGMOID: return neox_sigmoid(x);
    case NEOX_FN_IDENTITY: break;
    }
    return x;
}

static inline NEOX_HOST_DEVICE float neox_act_grad(neox_act_fn fn, float x) {
    switch (fn) {
    case NEOX_FN_GELU: return neox_gelu_erf_grad(x);
    case NEOX_FN_GELU_TANH: return neox_gelu_tanh_grad(x);
    case NEOX_FN_GELU_ONNX: return neox_gelu_onnx_grad(x);
    case NEOX_FN_RELU: return neox_relu_grad(x);
    case NEOX_FN_SILU: return neox_silu_grad(x);
    case NEOX_FN_SOFTSIGN: return neox_softsign_grad(x);
    case NEOX_FN_MISH: return neox_mish_grad(x);
    case NEOX_FN_SIGMOID: return neox_sigmoid_grad(x);
    case NEOX_FN_IDENTITY: break;
    }
    return 1.0f;
}

#endif
