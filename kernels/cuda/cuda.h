// cuda.h: the CUDA backend's C entry points. Each op of kernels/backend.h exists here as
// neox_cuda_<op> with kernels.h's signature, taking device pointers; the table that
// neox_backend_cuda() returns points at them. Plus the TF32 switch. What lib/ needs of the GPU
// (device count, properties, selection, the stream) is in kernels/kernels.h, so that nothing
// outside kernels/ includes this header (kernels/op_profile.c reads the timing marks below).
#ifndef NEOX_CUDA_H
#define NEOX_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NEOX_CUDA_DECLARE(ret, name, params, args) ret neox_cuda_##name params;
NEOX_BACKEND_MEMORY(NEOX_CUDA_DECLARE)
NEOX_BACKEND_GRAPH(NEOX_CUDA_DECLARE)
NEOX_BACKEND_OPS(NEOX_CUDA_DECLARE)
#undef NEOX_CUDA_DECLARE

// fp32 GEMMs may use TF32 tensor cores (about 8x faster, 10-bit mantissa products) when allowed;
// off by default so that fp32 runs match the CPU. 16-bit GEMMs always accumulate in fp32.
void neox_cuda_set_tf32(int allow);
// Products run on cuBLASLt with their epilogues fused (the default), or, with 0, on cuBLAS with
// separate epilogue kernels (kernels/cuda/gemm.cuh, neox_cuda_matmul): the harness checks both paths.
void neox_cuda_set_cublaslt(int allow);
// How many products cuBLASLt ran and how many fell back to cuBLAS for want of an algorithm, since the start.
void neox_cuda_matmul_counts(long *lt, long *fallback);

// The fused MLP products of a model whose activation is GELU's tanh approximation (cuBLASLt's
// GELU_AUX_BIAS and DGELU epilogues), fp32: out (N, OC) = gelu_tanh(pre) with pre = inp (N, IC) @
// weight (OC, IC)^T + bias, kept for backward (bias may be NULL); dpre (N, IC) = (dout (N, OC) @
// weight) * gelu_tanh'(pre), overwritten. linear_forward then activation_forward, and linear_backward's
// dinp then activation_backward, up to summation order. The backend's linear_act_forward/backward
// (kernels.h) call them for a matching function.
void neox_cuda_linear_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                                   int N, int IC, int OC);
void neox_cuda_linear_dgelu_backward(float *dpre, const float *dout, const float *weight, const float *pre, int N,
                                     int IC, int OC);
// The same two products as cuDNN graphs on bf16 storage (kernels/cuda/linear_act_cudnn.cu), the
// exact GELU (fn NEOX_FN_GELU) or its tanh approximation: out, pre (N, OC) from inp (N, IC), weight (OC,
// IC) and bias (OC, fp32, or NULL); dpre (N, IC) from dout (N, OC), weight and pre. 0 when cuDNN did not
// run (no library, or no plan for the shape): the caller then runs the separate ops.
int neox_cuda_linear_bias_cudnn_forward(void *out, const void *inp, const void *weight, const float *bias, int N,
                                        int IC, int OC);
int neox_cuda_linear_act_cudnn_forward(void *out, void *pre, const void *inp, const void *weight, const float *bias,
                                       int N, int IC, int OC, neox_act_fn fn);
int neox_cuda_linear_act_cudnn_backward(void *dpre, const void *dout, const void *weight, const void *pre, int N,
                                        int IC, int OC, neox_act_fn fn);

// Which own kernels 16-bit attention runs on where cuDNN does not (kernels/cuda/attention_cudnn.cu
// owns the choice): 1, the pipelined kernels of attention_fa2.cu (the default), or 0, the first
// tensor-core kernels of attention_mma.cu; the environment's NEOX_ATTENTION_KERNELS=first picks 0 at
// start-up, so a GPU host on which the pipelined ones fail can still train.
void neox_cuda_attention_kernels(int pipelined);
// How the pipelined kernels compute the attention backward (attention_cudnn.cu owns the choice): 1,
// one pass over key blocks (dk, dv and dq's contributions, which are added into an fp32 accumulator in
// a fixed order; the default), or 2, the two passes (dq, then dk and dv); the environment's
// NEOX_ATTENTION_BACKWARD=two-pass picks 2 at start-up (0 returns to the environment's choice). Each
// gives the same bits on every run (not the same bits as the other: dq is summed in another order).
void neox_cuda_attention_backward_passes(int passes);
// Attention reading q, k and v through strides from a fused QKV buffer qkv (B, T, (NH + 2 NKV) HS)
// stored as act, in GPT-NeoX's interleaved per-head layout (interleaved != 0, NH == NKV) or Llama's
// [q heads | k heads | v heads] (kernels/cuda/cudnn_attention.h describes both); otherwise as the
// attention_forward/backward ops (16-bit operands only). The backward writes dq, dk and dv into their
// places in dqkv (the same layout), so neither a split before nor a merge after is needed. 1 when the
// call ran; 0 when the GPU has too little shared memory per block for these kernels.
int neox_cuda_attention_fa2_forward_qkv(void *out, float *lse, const void *qkv, int interleaved, int B, int T, int NH,
                                         int NKV, int HS, neox_attention_opts o, neox_elem act);
int neox_cuda_attention_fa2_backward_qkv(void *dqkv, const void *dout, const void *qkv, int interleaved,
                                          const void *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                                          neox_attention_opts o, neox_elem act);

// Timing marks for the per-op profile (kernels/cuda/op_timing.cu): mark records an event on the op
// stream and returns its number; elapsed_ms waits for stop and gives the device time between the two
// marks; reset makes every mark's event free for reuse.
int neox_cuda_timing_mark(void);
double neox_cuda_timing_elapsed_ms(int start, int stop);
void neox_cuda_timing_reset(void);

#ifdef __cplusplus
}
#endif
#endif
