// attention.cuh: what the CUDA attention kernels share (attention.cu on the CUDA cores in fp32,
// attention_mma.cu and attention_fa2.cu on the tensor cores with 16-bit operands): which keys a query
// sees, the dropout keep factor (the CPU's, bit for bit) and the tensor-core and cuDNN entry points
// attention.cu dispatches to.
#ifndef NEOX_CUDA_ATTENTION_CUH
#define NEOX_CUDA_ATTENTION_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

// Whether query position i sees key position j: causal, within the window when there is one.
__device__ __forceinline__ bool sees(int i, int j, int window) { return j <= i && (window == 0 || j > i - window); }

// A call's query rows: n rows at global positions pos0, pos0 + 1, ..., except that under context
// parallelism the rows from split on (split > 0) start again at pos1 (kernels.h's
// neox_attention_query_pos; generation over a KV cache sets pos0 alone). Positions rise with the rows.
struct att_queries {
    int n, pos0, split, pos1;
};

// The queries of a call over T keys with o's query positions.
static inline att_queries att_queries_of(const neox_attention_opts &o, int T) {
    att_queries q = {neox_attention_query_rows(&o, T), o.q_pos0, o.q_split, o.q_pos1};
    return q;
}

// The global position of query row r.
__device__ __forceinline__ int query_pos(const att_queries &q, int r) {
    return q.split > 0 && r >= q.split ? q.pos1 + (r - q.split) : q.pos0 + r;
}

// How many query rows sit at positions before p: the first row a key at p can be seen by.
__device__ __forceinline__ int rows_before(const att_queries &q, int p) {
    if (q.split <= 0) return min(max(p - q.pos0, 0), q.n);
    return min(max(p - q.pos0, 0), q.split) + min(max(p - q.pos1, 0), q.n - q.split);
}

// Dropout keep factor of probability (row, j), row = the head's first counter row
// (neox_attention_dropout_row) + i: 0 or keep_scale = 1 / (1 - p).
__device__ __forceinline__ float keep_factor(float p, float keep_scale, unsigned long long seed, unsigned long long row,
                                             int T, int j) {
    return neox_uniform(seed, row * T + j) >= p ? keep_scale : 0.0f;
}

// The tensor-core kernels (attention_mma.cu), for operands o.operands (bf16 or fp16) and head sizes
// neox_attention_operands accepts; shapes and semantics as neox_attention_forward/backward's.
void neox_cuda_attention_mma_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                     int T, int NH, int NKV, int HS, neox_attention_opts o);
void neox_cuda_attention_mma_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                      const float *k, const float *v, const float *out, const float *lse, int B, int T,
                                      int NH, int NKV, int HS, neox_attention_opts o);
// The pipelined tensor-core kernels (attention_fa2.cu): the same contract with the tensors stored as
// act (fp32 or bf16), read and written as they are stored. 1 when they ran the call; 0 when this GPU
// has too little shared memory per block for them (the first kernels must run it).
int neox_cuda_attention_fa2_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                                     int NH, int NKV, int HS, neox_attention_opts o, neox_elem act);
int neox_cuda_attention_fa2_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                      const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV,
                                      int HS, neox_attention_opts o, neox_elem act);
// Whether 16-bit attention that cuDNN does not run goes to the pipelined kernels (1) or the first
// tensor-core kernels (0): attention_cudnn.cu's choice (neox_cuda_attention_kernels in cuda.h).
int neox_cuda_attention_pipelined(void);
// Whether the pipelined kernels' backward is the single pass (1) or the two passes (0):
// attention_cudnn.cu's choice (neox_cuda_attention_backward_passes in cuda.h).
int neox_cuda_attention_single_pass(void);
// cuDNN's fused attention (attention_cudnn.cu), which decides per call whether it runs: 1 when it
// ran the call, 0 when the own kernels must (the reasons are in attention_cudnn.cu). Shapes and
// semantics as neox_attention_forward/backward's, the tensors stored as act: bf16 tensors go to
// cuDNN as they are, fp32 ones through bf16 copies.
int neox_cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                      int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act);
int neox_cuda_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                       const void *v, const void *out, const float *lse, int B, int T, int NH,
                                       int NKV, int HS, neox_attention_opts o, neox_elem act);

#endif
