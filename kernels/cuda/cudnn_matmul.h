// cudnn_matmul.h: the MLP's products with GELU fused, as cuDNN graphs (through the header-only
// cudnn-frontend, cudnn_matmul.cpp), in a small C interface: bf16 operands and results, fp32
// accumulation and epilogue.
//   forward:  pre (N, OC) = inp (N, IC) @ w (OC, IC)^T (+ bias (OC), fp32), out (N, OC) = gelu(pre);
//             pre and out both written (bf16), gelu taken of the fp32 pre in the epilogue
//   plain:    out (N, OC) = inp @ w^T + bias (fp32), no activation: a biased product stored in bf16
//             straight from its fp32 epilogue (cuBLASLt's bias epilogue takes a bias of the output's type)
//   backward: dpre (N, IC) = (dout (N, OC) @ w (OC, IC)) * gelu'(pre (N, IC)): the product's result is
//             never written, only dpre (bf16)
// gelu is the exact (erf) GELU (cuDNN's GELU_FWD / GELU_BWD) or its tanh approximation
// (GELU_APPROX_TANH_FWD / _BWD). All tensors dense, row-major. Plans are cached per shape, refusals
// too. kernels/cuda/linear_act_cudnn.cu decides when this path runs.
#ifndef NEOX_CUDNN_MATMUL_H
#define NEOX_CUDNN_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct neox_cudnn_gelu_mm {
    int backward;    // 0: the forward graph; 1: the backward one
    int N, IC, OC;   // rows, the first projection's input and output widths (backward: dpre is (N, IC))
    int bias;        // forward: a bias is added before the GELU
    int tanh;        // GELU's tanh approximation (else the exact erf GELU)
    int plain;       // forward: no activation; out = the product + bias, pre not written
} neox_cudnn_gelu_mm;

// Builds the graph of s and runs cudnn-frontend's validate() on it for the given SM version (90 =
// Hopper), without a handle or a GPU. 1 when it passes; 0 with the frontend's message in why.
int neox_cudnn_gelu_mm_validate(const neox_cudnn_gelu_mm *s, int sm_version, char *why, size_t whylen);
// On the current GPU: the execution plan of s (built once, cached with a refusal's reason). 1 when
// it exists, *ws its workspace bytes; 0 with the reason (including no GPU, no library) in why.
int neox_cudnn_gelu_mm_prepare(const neox_cudnn_gelu_mm *s, size_t *ws, char *why, size_t whylen);
// Queued on stream (a cudaStream_t); device pointers, bf16 as uint16_t bit patterns. Requires a
// successful prepare of s. 0 when cuDNN refused to run (the reason in why).
int neox_cudnn_gelu_mm_forward(const neox_cudnn_gelu_mm *s, uint16_t *out, uint16_t *pre, const uint16_t *inp,
                               const uint16_t *w, const float *bias, void *workspace, void *stream, char *why,
                               size_t whylen);
int neox_cudnn_gelu_mm_backward(const neox_cudnn_gelu_mm *s, uint16_t *dpre, const uint16_t *dout, const uint16_t *w,
                                const uint16_t *pre, void *workspace, void *stream, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
