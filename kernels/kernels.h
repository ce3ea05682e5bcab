// kernels.h: the compute backends. Each op is declared once here with its shapes; kernels/cpu/
// holds the readable reference implementation (C + OpenMP + CBLAS) and kernels/cuda/ the CUDA one,
// checked against it. Model code calls these and never branches on the backend.
#ifndef NEOX_KERNELS_H
#define NEOX_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// The random-number helpers below are compiled for the GPU too (kernels/cuda), so that dropout
// masks there are the CPU's bit for bit.
#ifdef __CUDACC__
#define NEOX_HOST_DEVICE __host__ __device__
#else
#define NEOX_HOST_DEVICE
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---- backends -------------------------------------------------------------------------------
// A one-line description of the compiled backends and what they found: "cpu (2 threads, OpenBLAS
// 0.3.21 ...)", plus ", cuda (1 device: NVIDIA H200, 139.8 GiB)" in a CUDA build.
const char *neox_backends_description(void);

typedef struct neox_cuda_device_info {
    char name[256];
    size_t total_memory;   // bytes
    int major, minor;      // compute capability
    int multiprocessors;
} neox_cuda_device_info;

// CUDA builds only: number of visible devices (0 when no driver or GPU; never an error), and the
// properties of one of them (returns -1 when index is out of range).
int neox_cuda_device_count(void);
int neox_cuda_device_info_get(int index, neox_cuda_device_info *info);
// CUDA builds only: makes `device` current for this process and creates the stream and library
// handles (once; later calls with the same device do nothing). Returns 0, or -1 with a message on
// stderr. The CUDA table's first use calls it with device 0 unless the caller chose one first (one
// rank per GPU: local rank % device count).
int neox_cuda_init(int device);
// CUDA builds only: the cudaStream_t every op runs on (as void *, so C code needs no CUDA headers).
void *neox_cuda_stream(void);
// CUDA builds only: whether attention with bf16 operands may run on cuDNN's fused attention (1, the
// default) or always on the own kernels (0; config key cudnn_attention): neox_attention_allow_cudnn.
// kernels/cuda/attention_cudnn.cu applies the route's rule and asks cuDNN for plans (docs/cuda.md,
// "cuDNN fused attention").
void neox_cuda_attention_cudnn(int allow);

// ---- conventions ----------------------------------------------------------------------------
// All tensors are fp32, row-major and contiguous unless a stride is given. B micro-batch, T sequence,
// C hidden size, NH query heads, NKV key/value heads, HS head size, F MLP width, V (padded) vocab,
// N = B*T rows. Backward ops ADD into parameter gradients (so tied weights and gradient accumulation
// need no extra pass); whether they add into or overwrite input gradients is said on each op.

// Element types of the operands of mixed-precision products (GEMMs, attention's tensor-core tiles),
// and the storage type of activations.
typedef enum neox_elem { NEOX_ELEM_F32, NEOX_ELEM_BF16, NEOX_ELEM_F16 } neox_elem;
static inline size_t neox_elem_size(neox_elem e) { return e == NEOX_ELEM_F32 ? 4 : 2; }

// Activation storage. An op whose last parameter is `neox_elem act` takes its activation tensors
// (and their gradients) as `void *` holding elements of type act: NEOX_ELEM_F32 or NEOX_ELEM_BF16
// (16-bit storage of activations is bfloat16 only). Whatever act is, the op loads its elements,
// computes and accumulates in fp32 and rounds once to nearest even when it stores a bf16 result
// (kernels.h's neox_bf16_from_f32 on the host); parameters, their gradients and the saved
// statistics (a norm's mean and rstd) stay fp32. Under NEOX_ELEM_F32 the op gives the same bits
// as before it had the parameter. docs/cuda.md, "Activation storage", says why this is one
// argument and not a typed variant per op.

// ---- deterministic random numbers -------------------------------------------------------------
// Counter-based: the value for (seed, index) does not depend on threads, order or backend, so
// dropout masks can be regenerated in backward instead of stored, and initialisation does not
// depend on the parallel layout.
NEOX_HOST_DEVICE static inline unsigned long long neox_hash64(unsigned long long seed, unsigned long long index) {
    unsigned long long z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
// Uniform in [0, 1) with 24 random bits.
NEOX_HOST_DEVICE static inline float neox_uniform(unsigned long long seed, unsigned long long index) {
    return (float)(neox_hash64(seed, index) >> 40) * (1.0f / 16777216.0f);
}
// Standard normal (Box-Muller on two 32-bit halves of one hash; computed in double).
double neox_normal(unsigned long long seed, unsigned long long index);

// ---- linear layers ----------------------------------------------------------------------------
// out = inp @ weight^T (+ bias): the torch.nn.Linear convention, weight as Hugging Face stores it.
// inp: (N, IC) with row stride IC; weight: (OC, IC); bias: (OC) or NULL; out: (N, OC) with row
// stride ldo (>= OC; lets several projections write side by side). act is the element type of inp,
// out and the weight operand (fp32, or under bf16 storage the weights' bf16 copy, as gemm_ex's
// operands); the products and the bias are summed in fp32 and each result rounded once; bias and
// the weight gradients below stay fp32.
void neox_linear_forward(void *out, int ldo, const void *inp, const void *weight, const float *bias, int N, int IC,
                         int OC, neox_elem act);
// dout: (N, OC) with row stride ldo. dinp: (N, IC), overwritten (accumulate = 0) or added to
// (accumulate = 1); may be NULL. dweight: (OC, IC) and dbias: (OC) are added to; either may be
// NULL (backward computes a layer's weight gradients first, then its input gradient, so the
// weights' data-parallel reduction can start while the input gradient is computed); inp is read
// only for dweight. dout, inp, dinp and the weight operand are of type act (as in forward); dinp's
// sum (with its old value when accumulating) is rounded once.
void neox_linear_backward(void *dinp, float *dweight, float *dbias, const void *dout, int ldo, const void *inp,
                          const void *weight, int N, int IC, int OC, int accumulate, neox_elem act);

// ---- embeddings -------------------------------------------------------------------------------
// out[b,t,:] = wte[ids[b,t],:] (+ wpe[t,:] when wpe is not NULL). ids: (B, T); wte: (V, C);
// wpe: (maxT, C); out: (B, T, C). Ids are checked by the caller (model) against V. An id < 0 means
// "not in this table" (vocab-parallel embedding: the row lives on another tensor-parallel rank)
// and contributes a zero row. out is stored as act (the sum wte + wpe taken in fp32, rounded once).
void neox_embedding_forward(void *out, const int *ids, const float *wte, const float *wpe, int B, int T, int C,
                            neox_elem act);
// The lookup of a table held a piece at a time (ZeRO-3's embedding in pieces): out[i,:] =
// rows[ids[i] - v0,:] for the tokens whose id is in [v0, v1), where rows holds the table's rows
// [v0, v1); the other rows of out are left as they are. ids: (N); rows: (v1 - v0, C); out: (N, C)
// stored as act.
void neox_embedding_rows(void *out, const int *ids, const float *rows, int v0, int v1, int N, int C, neox_elem act);
// dwte, dwpe (or NULL) are added to, in fp32. dout: (B, T, C) stored as act. Ids < 0 add nothing to dwte.
// The order of dwte's sums is part of the contract, so that every backend gives the same bits:
// the tokens are stably sorted by id (ids < 0 last), the sorted sequence is cut into spans of
// NEOX_EMBEDDING_SPAN tokens, and each id's row receives its tokens in token order, except that
// the tokens of a later span are first summed from zero and that sum is added to the row. An id
// whose tokens lie in one span is therefore summed exactly as row += d0, row += d1, ...; cutting
// long runs (one token repeated) lets a GPU sum every span at once, in the same time whatever the
// ids are. dwpe[t] receives the batch's rows b = 0, 1, ... in order.
#define NEOX_EMBEDDING_SPAN 256
void neox_embedding_backward(float *dwte, float *dwpe, const void *dout, const int *ids, int B, int T, int C,
                             neox_elem act);

// ---- normalisation ----------------------------------------------------------------------------
// LayerNorm over the last dim. inp, out: (N, C); weight, bias: (C) (bias may be NULL);
// mean, rstd: (N) saved for backward.
void neox_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                            const float *bias, int N, int C, float eps, neox_elem act);
// dinp: (N, C) is ADDED to (it is the residual stream's gradient); dweight, dbias (or NULL) added to.
// dsum (C, or NULL) += the column sums of dinp after the add, as stored: the bias gradient of the
// row-parallel linear whose output joined this stream (its output gradient is this sum), made in the
// pass that writes dinp instead of a pass of its own; summed in neox_linear_backward's dbias order.
void neox_layernorm_backward(void *dinp, float *dweight, float *dbias, float *dsum, const void *dout, const void *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C, neox_elem act);
// RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight (Llama's). rstd: (N).
void neox_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N, int C, float eps,
                          neox_elem act);
// dinp ADDED to, dweight added to; dsum as layernorm_backward's.
void neox_rmsnorm_backward(void *dinp, float *dweight, float *dsum, const void *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, neox_elem act);

// ScaleNorm (GPT-NeoX's `norm: scalenorm`): out = inp / max(||inp||, eps) * g, ||.|| the row's L2
// norm, g one scalar. inp, out: (N, C) stored as act; rnorm: (N), 1 / max(||inp||, eps), saved for
// backward (fp32).
void neox_scalenorm_forward(void *out, float *rnorm, const void *inp, const float *g, int N, int C, float eps,
                            neox_elem act);
// dinp ADDED to (its sum rounded once under bf16); dg (one float) added to. A row whose norm was
// clamped to eps passes no gradient through its norm (torch's clamp: the norm's gradient flows where
// norm >= eps). dinp, dout, inp stored as act.
void neox_scalenorm_backward(void *dinp, float *dg, const void *dout, const void *inp, const float *g,
                             const float *rnorm, int N, int C, float eps, neox_elem act);

// Query/key normalisation (use_qk_layernorm) of per-head tensors x: (B, H, T, HS). For each (b, t)
// the G * HS values of each group of G consecutive heads are normalised together: G = H is a
// LayerNorm over all the token's heads (GPT-NeoX's LayerNorm([heads, head_size])), G = 1 one per
// head (GPT-NeoX's RMSNorm, which reduces over the last dim). mean == NULL: RMS (no centring).
// weight, bias: (H, HS) (bias may be NULL); mean, rstd: (B, T, H / G) saved for backward (fp32).
// out may be inp. x and out are stored as act.
void neox_head_norm_forward(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                            const float *bias, int B, int H, int T, int HS, int G, float eps, neox_elem act);
// dinp OVERWRITTEN (it may be dout); dweight, dbias (or NULL) added to. mean NULL as in forward.
// dinp, dout, inp stored as act.
void neox_head_norm_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                             const float *weight, const float *mean, const float *rstd, int B, int H, int T, int HS,
                             int G, neox_elem act);

// ---- Mixture of Experts -------------------------------------------------------------------------
// The rows are activations stored as act; the router's weights and their gradient stay fp32.
// out (n, C): row j = inp row idx[j] (the token rows of each expert slot, grouped by expert), the
// stored elements moved as they are.
void neox_gather_rows(void *out, const void *inp, const int *idx, int n, int C, neox_elem act);
// out (N, C) OVERWRITTEN: out[t] = sum over k < K of weight[t*K + k] * rows[slot[t*K + k]] (in k
// order, in fp32, rounded once; weight NULL: 1). rows: (N*K, C) expert outputs, slot: each token
// slot's row.
void neox_moe_combine(void *out, const void *rows, const int *slot, const float *weight, int N, int K, int C,
                      neox_elem act);
// Its backward: drows[slot[t*K + k]] = weight[t*K + k] * dout[t] (overwritten; every row is some
// token's slot), dweight[t*K + k] = dout[t] . rows[slot[t*K + k]] (summed in double, fp32).
void neox_moe_combine_backward(void *drows, float *dweight, const void *dout, const void *rows, const int *slot,
                               const float *weight, int N, int K, int C, neox_elem act);
// The residual add followed by the norm (a branch's output joining the residual stream, then the
// next norm: the MLP's, the next layer's first, the final one): sum = a + (b + b_bias), then out,
// mean, rstd as the norm's forward of sum. a, b, sum, out: (N, C) stored as act (sum may alias a);
// b_bias: (C) or NULL, the row-parallel linear's bias, added to b's rows first and rounded to act
// (neox_add_bias's value), then the sum rounded (neox_add's). out NULL: the sum alone (mean, rstd
// unused). The same bits as neox_add_bias, neox_add, then the norm; one pass over the rows on a GPU.
void neox_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,
                                const float *b_bias, const float *weight, const float *bias, int N, int C, float eps,
                                neox_elem act);
void neox_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b, const float *b_bias,
                              const float *weight, int N, int C, float eps, neox_elem act);

// ---- attention --------------------------------------------------------------------------------
// Where the rows of a per-head tensor (B, H, T, HS) sit: the element distances between consecutive
// batch rows, heads and positions (a row's HS values are always adjacent). All zero stands for the
// contiguous layout (neox_head_strides_contiguous), so an opts or call that names no strides means it.
typedef struct neox_head_strides {
    size_t batch, head, row;
} neox_head_strides;
// The strides of q, k and v (in backward also of dq, dk and dv: the gradients are laid out as their inputs).
typedef struct neox_qkv_strides {
    neox_head_strides q, k, v;
} neox_qkv_strides;
// The fused QKV projection output (B, T, W) seen as q, k, v: each one's head 0 starts `offset`
// elements into the buffer and steps by its strides.
typedef struct neox_qkv_layout {
    size_t q_offset, k_offset, v_offset;
    neox_qkv_strides strides;
} neox_qkv_layout;

NEOX_HOST_DEVICE static inline neox_head_strides neox_head_strides_contiguous(int H, int T, int HS) {
    neox_head_strides s = {(size_t)H * T * HS, (size_t)T * HS, (size_t)HS};
    return s;
}
// s itself, or the contiguous strides of (B, H, T, HS) when s is all zero.
NEOX_HOST_DEVICE static inline neox_head_strides neox_head_strides_of(neox_head_strides s, int H, int T, int HS) {
    return s.batch == 0 && s.head == 0 && s.row == 0 ? neox_head_strides_contiguous(H, T, HS) : s;
}
NEOX_HOST_DEVICE static inline int neox_head_strides_is_contiguous(neox_head_strides s, int H, int T, int HS) {
    neox_head_strides c = neox_head_strides_contiguous(H, T, HS), r = neox_head_strides_of(s, H, T, HS);
    return r.batch == c.batch && r.head == c.head && r.row == c.row;
}
// The one owner of the fused layouts' addressing (qkv_split and qkv_merge copy by it, attention and
// rotary read it in place): qkv (B, T, W), W = (NH + 2*NKV) * HS, either interleaved per head as
// GPT-NeoX and its Hugging Face port store it ([q0 k0 v0 | q1 k1 v1 | ...], needs NKV == NH), or
// grouped ([q all heads | k all heads | v all heads], Llama's separate q/k/v projections side by side).
NEOX_HOST_DEVICE static inline neox_qkv_layout neox_qkv_fused_layout(int T, int NH, int NKV, int HS, int interleaved) {
    size_t W = (size_t)(NH + 2 * NKV) * HS;
    neox_head_strides s = {(size_t)T * W, interleaved ? 3 * (size_t)HS : (size_t)HS, W};
    neox_qkv_layout l;
    l.q_offset = 0;
    l.k_offset = interleaved ? (size_t)HS : (size_t)NH * HS;
    l.v_offset = interleaved ? 2 * (size_t)HS : (size_t)(NH + NKV) * HS;
    l.strides.q = l.strides.k = l.strides.v = s;
    return l;
}

// Splits the output of the fused QKV projection into per-head q: (B, NH, T, HS), k, v: (B, NKV, T, HS).
// qkv: (B, T, W) in either layout of neox_qkv_fused_layout. The model runs attention on the fused
// buffer in place where it can (docs/model.md, "Attention's data flow"); these copies serve the rest.
void neox_qkv_split(void *q, void *k, void *v, const void *qkv, int B, int T, int NH, int NKV, int HS,
                    int interleaved, neox_elem act);
// The inverse, for the gradients: dqkv (B, T, W) is overwritten.
void neox_qkv_merge(void *dqkv, const void *dq, const void *dk, const void *dv, int B, int T, int NH, int NKV,
                    int HS, int interleaved, neox_elem act);

// Hugging Face's rope_scaling of the rotary frequencies (transformers' modeling_rope_utils): none;
// linear (every frequency / factor); llama3 (Llama 3.1's: wavelengths above original_max_positions /
// low_freq_factor divided by factor, below original_max_positions / high_freq_factor kept, a
// smooth blend between). Its attention factor is 1 in all three.
typedef enum neox_rope_kind { NEOX_ROPE_DEFAULT, NEOX_ROPE_LINEAR, NEOX_ROPE_LLAMA3 } neox_rope_kind;
typedef struct neox_rope_scaling {
    neox_rope_kind kind;
    double factor, low_freq_factor, high_freq_factor;
    int original_max_positions;
} neox_rope_scaling;
// Rotary tables for positions 0..T-1: cos, sin: (T, R/2), R the rotary dims (even), frequencies
// base^(-2i/R) as GPT-NeoX and Hugging Face compute them, then scaled.
void neox_rotary_tables(float *cos, float *sin, int T, int R, double base, neox_rope_scaling scaling);
// In place on x: (B, H, T, HS) laid out by xs (all zero: contiguous; a view of the fused QKV buffer
// rotates it where it is), rotating the first R dims of each head with GPT-NeoX's rotate-half
// convention (pairs i and i + R/2). The backward (inverse rotation) is the same call with inverse = 1.
void neox_rotary_apply(void *x, const float *cos, const float *sin, int B, int H, int T, int HS, int R, int inverse,
                       neox_elem act, neox_head_strides xs);

// How attention scores its keys: the same for the forward, its backward and the cached form.
typedef struct neox_attention_opts {
    float scale;              // on q . k, usually 1/sqrt(HS)
    int window;               // > 0: each query sees the window most recent keys, itself included
                              // (query i sees keys i - window + 1 .. i); 0: every earlier key
    float dropout;            // attention-probability dropout p (0 = off; not in the cached form)
    unsigned long long seed;  // dropout masks: neox_uniform(seed, ...) per (b, h, i, j), see below
    neox_elem operands;       // the products' operand type (fp32 only in the cached form)
    const float *alibi;       // NULL, or (NH) slopes in backend memory: score(i, j) += slope_h * (j - i)
    // Where the masks sit in the run (neox_attention_dropout_row): row b of the micro-batch is row
    // dropout_row0 + b of all rows that drew masks, and local head h is head dropout_head0 + h of the
    // model's dropout_heads (0: NH, i.e. these heads are all of them).
    unsigned long long dropout_row0;
    int dropout_head0, dropout_heads;
    // Context parallelism (docs/parallel.md, "Context parallel"): the queries are q_rows rows (0:
    // T, at the keys' own positions 0..T-1) whose global positions run from q_pos0 for the first
    // q_split rows and from q_pos1 for the rest (q_split 0: all from q_pos0); the causal mask, the
    // window and ALiBi's j - i take these positions. The keys are always positions 0..T-1.
    int q_rows, q_split, q_pos0, q_pos1;
    // NULL, or one row index in backend memory that the kernels add to dropout_row0 when they run: a
    // captured step's micro-batch, whose row changes at every replay (lib/train/step_scalars.c).
    const unsigned long long *dropout_row0_at;
    // Where q, k, v (and dq, dk, dv) sit: all zero, the contiguous per-head tensors the shapes below
    // give; neox_qkv_fused_layout's strides, views into the fused QKV buffer (not in the cached form).
    neox_qkv_strides views;
} neox_attention_opts;

// The query rows of an attention over T keys, and the global position of query row r (kernels.h's opts).
NEOX_HOST_DEVICE static inline int neox_attention_query_rows(const neox_attention_opts *o, int T) {
    return o->q_rows > 0 ? o->q_rows : T;
}
NEOX_HOST_DEVICE static inline int neox_attention_query_pos(const neox_attention_opts *o, int r) {
    return o->q_split > 0 && r >= o->q_split ? o->q_pos1 + (r - o->q_split) : o->q_pos0 + r;
}

// The route of an attention call on a CUDA device (kernels/attention_route.c, the one owner of the
// rule): whether cuDNN may take it (config key cudnn_attention, default 1), and why a call stays on
// the own tensor-core kernels (NULL: cuDNN may take it, if it builds plans for the shape).
void neox_attention_allow_cudnn(int allow);
const char *neox_attention_own_reason(const neox_attention_opts *o);

// The first row of the masks' counter (dropout_row0, plus the value at dropout_row0_at if any), read
// where the kernel runs.
NEOX_HOST_DEVICE static inline unsigned long long neox_attention_dropout_first_row(unsigned long long row0,
                                                                                   const unsigned long long *row0_at) {
    return row0 + (row0_at ? *row0_at : 0ULL);
}

// Attention dropout keeps probability (i, j) of local head h of micro-batch row b when
// neox_uniform(seed, (neox_attention_dropout_row(..., b, h, T) + i) * T + j) >= p. The counter is
// made of the row's and the head's global indices, so data-parallel ranks draw what one rank draws
// for the same sample and tensor-parallel ranks what one rank draws for the same head.
NEOX_HOST_DEVICE static inline unsigned long long neox_attention_dropout_row(unsigned long long row0, int head0,
                                                                             int heads, int NH, int b, int h, int T) {
    unsigned long long H = (unsigned long long)(heads > 0 ? heads : NH);
    return ((row0 + (unsigned long long)b) * H + (unsigned long long)(head0 + h)) * (unsigned long long)T;
}

// Exact causal attention, flash style: no (T, T) matrix is stored; each query row keeps a running
// max and sum (online softmax) and its log-sum-exp is saved for backward. Query head h uses key/value
// head h / (NH / NKV) (GQA/MQA). q: (B, NH, Tq, HS); k, v: (B, NKV, T, HS), each laid out by
// o.views (contiguous, or views into the fused QKV buffer); out: (B, Tq, NH, HS), i.e.
// (B, Tq, NH*HS) ready for the output projection; lse: (B, NH, Tq); Tq = T unless o.q_rows says
// otherwise (context parallelism: a rank's queries over the whole sequence's keys). A score is
// q . k * scale + slope * (j - i) (ALiBi's linear bias, after the scale as GPT-NeoX adds it).
// Dropout masks are regenerated identically in backward.
// operands: the element type of every matrix product's operands (the tensor cores' inputs on a GPU),
// products accumulated in fp32 and softmax statistics kept in fp32 either way. In 16-bit, q, k, v are
// rounded to it, and so are the probabilities of each key tile (after the dropout factor, under the
// running max of the tiles so far: tiles of 64 keys from the first the query block needs) before they
// weight v; the row sums are of the unrounded probabilities. Inputs and outputs stay fp32. (On a GPU,
// bf16 attention may run on cuDNN instead, which rounds its probability tiles at its own boundaries
// and returns out in bf16 precision: the same up to a few bf16 units, not bit for bit.) act: the
// storage of q, k, v, out (and in backward dout, dq, dk, dv); under bf16 they are read widened, the
// attention is the fp32-stored one's on those values, and each result is rounded once when stored;
// lse stays fp32.
void neox_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                            int NKV, int HS, neox_attention_opts o, neox_elem act);
// Attention of S new positions pos0..pos0+S-1 over a key/value cache holding positions
// 0..pos0+S-1 (generation; kernels/cpu/attention_cache.c), in fp32 without dropout (o.dropout must
// be 0 and o.operands fp32). q: (NH, S, HS); kcache, vcache: (NKV, maxT, HS); out: (S, NH, HS).
// Query i sees keys 0..pos0+i (the last window of them when window > 0).
void neox_attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int S, int pos0,
                           int NH, int NKV, int HS, int maxT, neox_attention_opts o);
// dq: (B, NH, Tq, HS), dk, dv: (B, NKV, T, HS), all overwritten (every element of their views,
// once: a GQA group's dk and dv are summed before they are stored), laid out by o.views as q, k, v
// are (views into a fused dqkv buffer: nothing else of it is touched). dout: (B, Tq, NH, HS). In 16-bit
// operands, q, k, v and dout are rounded, and so are the dropped probabilities before dv's product and
// the score gradients dS before dq's and dk's; D = dout . out is taken from the unrounded fp32 values.
void neox_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                             neox_attention_opts o, neox_elem act);
// GPT-NeoX's ALiBi slopes for heads head0 .. head0 + n - 1 of a model with num_heads heads (its
// AliBi._get_slopes, in double as Python computes it, then fp32): the geometric sequence from
// 2^(-8/m) for the largest power of two m <= num_heads, then every other slope of the sequence for
// 2m. A tensor-parallel rank holds its partition's slice.
void neox_alibi_slopes(float *slopes, int num_heads, int head0, int n);
// The operands attention uses when the model's products take `half` (NEOX_ELEM_F32 in fp32
// precision): 16-bit for head sizes the tensor-core kernel tiles (multiples of 16 up to 128), fp32
// otherwise. The one place that decides, so every backend rounds at the same points.
static inline neox_elem neox_attention_operands(neox_elem half, int HS) {
    return half != NEOX_ELEM_F32 && HS % 16 == 0 && HS <= 128 ? half : NEOX_ELEM_F32;
}

// ---- activations ------------------------------------------------------------------------------
// The elementwise functions of GPT-NeoX's `activation` values (formulas: kernels/activation_math.h):
// GELU exact (erf), its tanh approximation (bias_gelu_fusion; HF "gelu_new"), onnx_safe's erf GELU,
// relu, silu (= swish), softsign, mish, sigmoid (glu's gate) and identity (bilinear's gate).
typedef enum neox_act_fn {
    NEOX_FN_GELU, NEOX_FN_GELU_TANH, NEOX_FN_GELU_ONNX, NEOX_FN_RELU, NEOX_FN_SILU, NEOX_FN_SOFTSIGN,
    NEOX_FN_MISH, NEOX_FN_SIGMOID, NEOX_FN_IDENTITY
} neox_act_fn;
// out = fn(inp): inp, out (n). dinp = dout * fn'(inp), overwritten.
void neox_activation_forward(void *out, const void *inp, size_t n, neox_act_fn fn, neox_elem act);
void neox_activation_backward(void *dinp, const void *dout, const void *inp, size_t n, neox_act_fn fn, neox_elem act);
// A linear layer with its activation fused (the MLP's first projection): pre (N, OC) = inp (N, IC)
// @ weight (OC, IC)^T (+ bias (OC), or NULL), kept for backward, and out (N, OC) = fn(pre). inp, pre,
// out and the weight operand are stored as act (fp32, or bf16 with the weights' bf16 copy, as
// neox_linear_forward's); bias stays fp32. Exactly neox_linear_forward then neox_activation_forward
// (pre rounded once, fn of the rounded pre rounded once); a device may fuse the activation into the
// product's epilogue where the route (neox_linear_act_route) says so, up to rounding.
void neox_linear_act_forward(void *out, void *pre, const void *inp, const void *weight, const float *bias, int N,
                             int IC, int OC, neox_act_fn fn, neox_elem act);
// Its backward through the next linear (the MLP's second projection, whose input was fn(pre)):
// dpre (N, IC) = fn'(pre (N, IC)) * (dout (N, OC) @ weight (OC, IC)), overwritten, and dbias (IC, or
// NULL, fp32) += dpre's column sums (the first projection's bias gradient); dpre, dout, pre and the
// weight operand stored as act. Exactly neox_linear_backward's input gradient (rounded once),
// neox_activation_backward and neox_linear_backward's bias gradient of the rounded dpre; a device may
// fuse them into one product where the route says so, up to rounding.
void neox_linear_act_backward(void *dpre, float *dbias, const void *dout, const void *weight, const void *pre, int N,
                              int IC, int OC, neox_act_fn fn, neox_elem act);
// Where a CUDA device runs a linear_act call (kernels/linear_act_route.c, the one owner of the rule;
// bench/gpu_predict prices each call by it through kernels/op_cost.c):
// - NEOX_EPILOGUE_CUBLASLT: cuBLASLt's GELU epilogues (GELU_AUX_BIAS, DGELU_BGRAD), fp32 storage and
//   GELU's tanh approximation (cuBLASLt's GELU is that approximation: GPT-NeoX's bias_gelu_fusion);
// - NEOX_EPILOGUE_CUDNN: one cuDNN graph per direction, bf16 storage and the exact (erf) GELU or its
//   tanh approximation (cuDNN's GELU_FWD/GELU_BWD and their tanh forms), when cuDNN loads and builds
//   plans for the shape (else the separate passes below);
// - NEOX_EPILOGUE_NONE: the product, then the activation as its own pass.
typedef enum neox_epilogue_route { NEOX_EPILOGUE_NONE, NEOX_EPILOGUE_CUBLASLT, NEOX_EPILOGUE_CUDNN } neox_epilogue_route;
neox_epilogue_route neox_linear_act_route(neox_act_fn fn, neox_elem act);
// Where a 16-bit linear_forward with a bias runs on a CUDA device: cuDNN's matmul + bias graph, or
// (NONE) the product into fp32 rows rounded by a pass of its own (kernels/linear_act_route.c).
neox_epilogue_route neox_linear_bias_route(neox_elem act, int ldo, int OC);
// Whether the rule may pick cuDNN (default 1; bench/gpu_predict's cudnn_mlp=0 prices a host without it).
void neox_linear_act_allow_cudnn(int allow);
// A gated activation as GPT-NeoX's Gated_Activation computes it (geglu, reglu, swiglu, bilinear,
// glu): inp: (N, 2F) = [x | gate] (the gate is the second half); out: (N, F) = fn(gate) * x.
// dinp: (N, 2F) overwritten.
void neox_gated_forward(void *out, const void *inp, int N, int F, neox_act_fn fn, neox_elem act);
void neox_gated_backward(void *dinp, const void *dout, const void *inp, int N, int F, neox_act_fn fn, neox_elem act);

// ---- elementwise ------------------------------------------------------------------------------
void neox_add(void *out, const void *a, const void *b, size_t n, neox_elem act);  // out = a + b (out may alias)
// acc += x, on fp32 buffers only (gradients, error feedback): a sum of activations is neox_add, and a
// parameter row added to activations (the position table) neox_add_bias.
void neox_add_inplace(float *acc, const float *x, size_t n);
// x: (N, C) += bias: (C) on every row (row-parallel layers add their bias after the reduction).
void neox_add_bias(void *x, const float *bias, int N, int C, neox_elem act);
// Inverted dropout: out = keep ? inp / (1 - p) : 0 with keep = neox_uniform(seed, offset + i) >= p.
// row0_at: NULL, or one row index in backend memory read when the op runs, which adds
// *row0_at * row_elems to the offset (a captured step's micro-batch, whose first row among all that
// drew masks changes at every replay: lib/train/step_scalars.c). The backward is the same call on the
// gradient. out may alias inp.
void neox_dropout(void *out, const void *inp, size_t n, float p, unsigned long long seed, unsigned long long offset,
                  const unsigned long long *row0_at, unsigned long long row_elems, neox_elem act);
// Multiplicative jitter (GPT-NeoX's MoE router noise): out = inp * (low + u * (high - low)), low = 1 - eps,
// high = 1 + eps, u = neox_uniform(seed, i). out may be inp; applied to a gradient it is its backward.
// inp and out are stored as act (the product in fp32, rounded once).
void neox_jitter(void *out, const void *inp, size_t n, float eps, unsigned long long seed, neox_elem act);

// ---- loss -------------------------------------------------------------------------------------
// Fused softmax + cross-entropy over the vocabulary. logits: (N, V); targets: (N), each in [0, V)
// or outside it for a position that is not scored (then its loss is 0 and backward leaves out the
// -1 of the target); losses: (N) = logsumexp(logits) - logits[target]; lse: (N) saved for backward.
// The logits (and below their gradient) are stored as act (kernels.h, "Activation storage"): read
// widened to fp32; the losses and every statistic stay fp32 (the sums of exponentials double).
void neox_cross_entropy_forward(float *losses, float *lse, const void *logits, const int *targets, int N, int V,
                                neox_elem act);
// The two halves of the log-sum-exp, for a vocabulary cut over tensor-parallel ranks (each rank
// holds V of the columns): the row maximum mx: (N) of logits: (N, V), and sum: (N) of
// exp(logit - mx[i]) accumulated in double, mx being the maximum over all ranks. Then
// lse = mx + log(sum over ranks), exactly what neox_cross_entropy_forward computes on one rank.
void neox_cross_entropy_row_max(float *mx, const void *logits, int N, int V, neox_elem act);
void neox_cross_entropy_row_sumexp(double *sum, const void *logits, const float *mx, int N, int V, neox_elem act);
// The target's logit of each row, in double (the vocab-parallel loss sums it over ranks with the
// row sums): out[i] = logits[i, targets[i]], or 0 when targets[i] is outside [0, V) (another
// rank's column). logits: (N, V); targets, out: (N).
void neox_cross_entropy_target_logit(double *out, const void *logits, const int *targets, int N, int V,
                                     neox_elem act);
// The loss assembled from those halves (after their sums over ranks), on the backend: lse[i] = mx[i]
// + (float)log(stats[i]) (saved for backward), each row's loss lse[i] - (float)stats[N + i] (fp32), and
// loss[0] = the sum over rows of mask[i] * that loss, loss[1] = the sum of mask[i], both in double (the
// CPU in row order, a GPU in its own fixed order). stats: (2, N) = the sums of exponentials, then the
// target logits; lse, mask: (N); loss: 2 doubles in the backend's memory.
void neox_cross_entropy_loss(float *lse, double *loss, const float *mx, const double *stats, const float *mask, int N);
// dlogits = (softmax(logits) - onehot(target)) * weight[i] * scale, where weight is the loss mask
// (NULL = all ones) and scale usually 1/sum(weight). dlogits may alias logits (saves N*V floats).
// A target outside [0, V) (on another rank's part of the vocabulary) subtracts no one-hot. Under bf16
// each element is rounded once, after the one-hot's subtraction.
// scale_at: NULL, or the scale in backend memory, read when the op runs in place of scale (a captured
// step's micro-batch, whose loss scale and mask sum may change at every replay; so for the fused form).
void neox_cross_entropy_backward(void *dlogits, const void *logits, const float *lse, const int *targets,
                                 const float *weight, float scale, const float *scale_at, int N, int V, neox_elem act);
// The training loss of a chunk of rows and its gradient in one pass, for when the gradient is known
// at forward time (the fused classifier: the output layer's backward follows each chunk at once, so
// no logits are held for every row or made twice). logits: (N, V) of element type logits_elem (fp32,
// bf16 or fp16: the activations' storage), overwritten in place with dlogits = (softmax(logits) -
// onehot(target)) * weight[i] * scale in the same type (weight NULL = all ones; a target outside
// [0, V) subtracts no one-hot), with lse = mx + (float)log(sum) as neox_cross_entropy_loss forms it.
// stats_given 0 (a whole vocabulary): one pass per row that also writes the row maximum mx: (N), the
// sum of exp(logit - mx) in double sum: (N) and the target's logit target_logit: (N) (0 off the
// vocabulary), the halves neox_cross_entropy_loss assembles the loss from; in fp32 every value equals
// the separate ops' (row_max, row_sumexp, target_logit, backward) bit for bit. stats_given 1 (the
// second phase of a vocab-parallel loss): mx and sum are inputs, already reduced over the ranks'
// columns (row_max, row_sumexp and target_logit made them), target_logit is not used (may be NULL),
// and only dlogits is written.
void neox_cross_entropy_fused(void *logits, neox_elem logits_elem, float *mx, double *sum, double *target_logit,
                              const int *targets, const float *weight, float scale, const float *scale_at, int N, int V,
                              int stats_given);

// ---- optimizer --------------------------------------------------------------------------------
// Sum of squares of x (n), accumulated in double: global gradient norm = sqrt of the sum over buffers.
double neox_sum_squares(const float *x, size_t n);
// x *= s
void neox_scale(float *x, size_t n, float s);
// One AdamW step (decoupled weight decay, as torch.optim.AdamW): step is 1-based for the bias
// corrections. param, grad, m, v: (n).
void neox_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, long step);
// The values of one update that change from step to step, read by the optimizer's ops from the
// backend's memory rather than passed as arguments, so that a captured step (a CUDA graph, replayed
// with the same arguments) still takes each step's own: lib/train/step_scalars.c fills them.
typedef struct neox_step_scalars {
    float lr;       // the learning rate of this update
    int32_t unused; // (keeps step aligned the same on every compiler)
    int64_t step;   // the 1-based update count (AdamW's bias corrections)
} neox_step_scalars;
// A run [begin, end) of a flat buffer with its own weight decay: the optimizer's view of one
// parameter's part of the local state, so that one call (one GPU launch) covers every parameter.
typedef struct neox_segment {
    size_t begin, end;
    float weight_decay;
} neox_segment;
// neox_adamw over each segment of param, grad, m, v (all indexed from the same origin); segs is a
// host array of nseg segments, which must not overlap. sc: the learning rate and the step (as
// neox_adamw's) in the backend's memory. grad_scale multiplies each gradient as it is
// read (gradient clipping and loss-scale unscaling folded into the update: the same bits as scaling
// grad beforehand, without that pass over it; grad is left as it was). guard: NULL, or one double in the backend's
// memory (the gradients' sum of squares, neox_sum_squares_segments_into): the update is skipped,
// touching nothing, when it is not finite (an fp16 overflow), without the host reading it.
void neox_adamw_segments(float *param, const float *grad, float *m, float *v, const neox_segment *segs, int nseg,
                         const neox_step_scalars *sc, float beta1, float beta2, float eps, float grad_scale,
                         const double *guard);
// torch.optim.SGD over each segment (no dampening, no Nesterov, as GPT-NeoX configures it):
// d = g + wd * p; with momentum, buf = d on the first step (sc->step 1), else momentum * buf + d;
// p -= lr * buf (or lr * d without momentum; buf unused then). sc (lr, step) and guard as
// neox_adamw_segments's: in the backend's memory, the update skipped when *guard is not finite.
void neox_sgd_segments(float *param, const float *grad, float *buf, const neox_segment *segs, int nseg,
                       const neox_step_scalars *sc, float momentum, const double *guard);
// Lion (lion-pytorch's update, DeepSpeed's FusedLion's) over each segment: p *= 1 - lr * wd;
// p -= lr * sign(beta1 * m + (1 - beta1) * g) (sign 0 for 0); then m = beta2 * m + (1 - beta2) * g.
// param, grad, m: (n) indexed from the segments' origin. sc (its lr) and guard as neox_adamw_segments's.
void neox_lion_segments(float *param, const float *grad, float *m, const neox_segment *segs, int nseg,
                        const neox_step_scalars *sc, float beta1, float beta2, const double *guard);
// GPT-NeoX's madgrad_wd (MADGRAD, dual averaging with a cube-root denominator, and AdamW-style
// decoupled weight decay) over each segment; lr_eps: the step's lr + eps (madgrad_wd adds them),
// lamb = lr_eps * sqrt(step). p *= 1 - lr_eps * wd; then with momentum (x0: the parameters as they
// were before the first step, stored by it when first = 1)
//   sum_sq += lamb * g * g; s += lamb * g; z = x0 - s / (cbrt(sum_sq) + eps); p = momentum * p + (1 - momentum) * z
// and without (x0 unused): p = (p + s / (cbrt(sum_sq) + eps)) - s' / (cbrt(sum_sq') + eps) with the
// updated sums s', sum_sq'. param, grad, sum_sq, s, x0: (n).
void neox_madgrad_segments(float *param, const float *grad, float *sum_sq, float *s, float *x0,
                           const neox_segment *segs, int nseg, float lr_eps, float lamb, float momentum, float eps,
                           int first);
// One run of one parameter tensor for SM3: elements [begin, end) of param, grad, m (relative to the
// range updated), which are elements [first, first + end - begin) of the tensor in row-major order;
// the tensor has `cols` columns (a vector: 1) and its accumulators are acc[row_acc + r] for row r
// (a vector: for element r) and, for a matrix, acc[col_acc + c] for column c (NEOX_SM3_NO_COLS for a vector).
typedef struct neox_sm3_segment {
    size_t begin, end, first, cols, row_acc, col_acc;
} neox_sm3_segment;
#define NEOX_SM3_NO_COLS ((size_t)-1)
// SM3 (torch_optimizer.SM3's dense step, which GPT-NeoX's sm3 builds) over each segment, for the
// element at row r, column c of its tensor with gradient g:
//   nu = min(acc[row r], acc[col c]) (a vector: its own accumulator); nu = beta * nu + (1 - beta) * g * g
//   (beta 0: nu + g * g); u = g / sqrt(nu + eps); with momentum u = (1 - momentum) * u + momentum * m, m = u;
//   p -= lr * u
// and the new accumulators are maxima of nu: acc_next[row r] = max(acc_next[row r], nu), the same for
// column c (acc_next holds zeros, or with beta > 0 the old acc, before the first segment; a range
// that holds part of a tensor leaves partial maxima, which the caller combines over the ranks
// holding its other parts). acc, acc_next: the accumulators of all the tensors; m unused
// without momentum.
// SM3's nu for one element from the smaller of its accumulators and its gradient, as torch_optimizer
// forms it (beta 0: the accumulator plus g * g, no scaling): the one expression for host and device.
NEOX_HOST_DEVICE static inline float neox_sm3_nu(float acc_min, float g, float beta) {
    return beta > 0.0f ? acc_min * beta + (1.0f - beta) * g * g : acc_min + g * g;
}
// The step's update from nu, before momentum: g / sqrt(nu + eps), as torch's rsqrt-then-multiply.
NEOX_HOST_DEVICE static inline float neox_sm3_update(float nu, float g, float eps) {
    return 1.0f / sqrtf(nu + eps) * g;
}
void neox_sm3_segments(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                       const neox_sm3_segment *segs, int nseg, float lr, float momentum, float beta, float eps);
// neox_sum_squares over the union of the segments (weight_decay unused), in double.
double neox_sum_squares_segments(const float *x, const neox_segment *segs, int nseg);
// The same sum written to *sumsq, one double in the backend's memory: no wait for the host.
void neox_sum_squares_segments_into(double *sumsq, const float *x, const neox_segment *segs, int nseg);
// DeepSpeed's gradient clipping: the factor clip_grad / (norm + 1e-6) when that is below 1, else 1
// (and 1 when clip_grad is 0: no clipping). The one definition, for the host and the device.
NEOX_HOST_DEVICE static inline double neox_clip_coefficient(double clip_grad, double norm) {
    return clip_grad > 0 && clip_grad / (norm + 1e-6) < 1.0 ? clip_grad / (norm + 1e-6) : 1.0;
}
// Unscaling and clipping from a sum of squares in the backend's memory: with norm = sqrt(*sumsq) /
// loss_scale (the unscaled gradients' norm), x (n) *= (float)(1 / loss_scale * neox_clip_coefficient
// (clip_grad, norm)) when the norm is finite and that factor is not 1; else x is left as it is.
// loss_scale_at: NULL, or the loss scale in backend memory, read when the op runs in place of loss_scale
// (a captured step's: the fp16 scale moves between replays).
void neox_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale, const double *loss_scale_at,
                       double clip_grad);
// A micro-batch's mean token loss from its cross_entropy_loss pair (masked sum, sum of the mask): the
// one expression for the model's loss on the host and the device's guard below.
NEOX_HOST_DEVICE static inline float neox_mean_loss(double sum, double mask_sum) {
    return mask_sum > 0 ? (float)(sum / mask_sum) : 0.0f;
}
// The update's guard from the step's values in the backend's memory, so that no host decision sits
// between the loss and the update: *guard = *sumsq, or NaN when some micro-batch's mean loss is not
// finite. loss_sums (2 n): each micro-batch's cross_entropy_loss pair, whose loss is neox_mean_loss.
void neox_loss_guard(double *guard, const double *sumsq, const double *loss_sums, int n);

// ---- mixed-precision matrix product -------------------------------------------------------------
// On the CPU a product of at most NEOX_DECODE_MAX_ROWS rows against a weight stored (N, K) (a
// linear layer's forward) computes each row exactly as a product of that row alone: a decoding
// step over several sequences gives each the logits it would get alone (kernels/cpu/gemm.c).
#define NEOX_DECODE_MAX_ROWS 16
// C (M, N; row stride ldc) = alpha * op(A) op(B) + beta * C, row-major as cblas_sgemm, with A and B
// both of element type ab and C of type c, products accumulated in fp32 (16-bit results rounded
// once at the end). The CPU computes it in fp32 on widened copies; CUDA on the tensor cores.
void neox_gemm_ex(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
                  int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c);

// ---- casts ------------------------------------------------------------------------------------
// fp32 <-> bfloat16 / IEEE half, elements as raw 16-bit patterns: to 16 bits rounds to nearest
// even (NaN stays NaN; fp16 overflows to infinity as torch's .half() does); back is exact.
void neox_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n);
void neox_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n);
void neox_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n);
void neox_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n);

// The same conversions one value at a time: the only definition of these roundings on the host
// (the casts above, the 16-bit collectives' sums, Hugging Face export and import all use them).
static inline uint16_t neox_bf16_from_f32(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  // NaN stays (quiet) NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);                                            // round to nearest even
    return (uint16_t)(bits >> 16);
}
static inline float neox_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
// fp16 by hand rather than with _Float16, which needs GCC 12 on x86 (a GPU host's compiler may be
// older): round to nearest even, 65520 and above to infinity, subnormals below 2^-14.
static inline uint16_t neox_f16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays (quiet) NaN
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                         // >= 65520: infinity
    if (ax >= 0x38800000u) {  // a normal half (>= 2^-14): rebias the exponent, round 23 -> 10 mantissa bits
        uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (ax < 0x33000000u) return (uint16_t)sign;  // below 2^-25 (2^-25 itself ties to even 0)
    // A subnormal half counts units of 2^-24: the float is m * 2^(e - 150), i.e. m >> (126 - e) units.
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;  // may carry into the smallest normal: still right
    return (uint16_t)(sign | q);
}
static inline float neox_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) x = sign | 0x7f800000u | (m << 13);   // infinity, NaN
    else if (e) x = sign | ((e + 112) << 23) | (m << 13);  // normal: rebias 15 -> 127
    else {                                                 // zero, subnormal: m * 2^-24, exact in fp32
        float v = (float)m * 5.9604644775390625e-8f;
        memcpy(&x, &v, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}
// x rounded to element type e and widened back (exact in fp32): what a 16-bit operand holds.
static inline float neox_round_to_elem(float x, neox_elem e) {
    if (e == NEOX_ELEM_BF16) return neox_bf16_to_f32(neox_bf16_from_f32(x));
    if (e == NEOX_ELEM_F16) return neox_f16_to_f32(neox_f16_from_f32(x));
    return x;
}

// ---- FP8 (precision: fp8; docs/model.md, "FP8 training") ---------------------------------------
// The two 8-bit formats of Transformer Engine's recipes, elements as raw bytes: E4M3 ("fn": 4
// exponent bits, bias 7, 3 mantissa bits, no infinities, largest 448, NaN only S.1111.111) for
// forward tensors, E5M2 (5 exponent bits, bias 15, 2 mantissa bits, IEEE-like, largest 57344) for
// gradients under the HYBRID format.
typedef enum neox_fp8_format { NEOX_FP8_E4M3, NEOX_FP8_E5M2 } neox_fp8_format;
#define NEOX_FP8_E4M3_MAX 448.0f
#define NEOX_FP8_E5M2_MAX 57344.0f
NEOX_HOST_DEVICE static inline float neox_fp8_max(neox_fp8_format f) {
    return f == NEOX_FP8_E4M3 ? NEOX_FP8_E4M3_MAX : NEOX_FP8_E5M2_MAX;
}
// fp32 -> FP8, rounding to nearest even and saturating as Transformer Engine's casts do (SATFINITE):
// whatever would round above the largest value, infinities included, becomes the largest value of
// its sign; NaN stays NaN (E4M3: S.1111.111; E5M2: its quiet NaN keeping the top mantissa bits);
// values below half the smallest subnormal become zero of their sign. The one definition on the host
// and the device (kernels/cuda uses it too), so every backend casts to the same bytes.
NEOX_HOST_DEVICE static inline uint8_t neox_fp8_from_f32(float f, neox_fp8_format fmt) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const int man = fmt == NEOX_FP8_E4M3 ? 3 : 2, bias = fmt == NEOX_FP8_E4M3 ? 7 : 15;
    const uint32_t max_code = fmt == NEOX_FP8_E4M3 ? 0x7eu : 0x7bu;
    uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(fmt == NEOX_FP8_E4M3 ? sign | 0x7fu : sign | 0x7eu | ((ax >> 21) & 3u));
    if (ax < 0x00800000u) return (uint8_t)sign;  // zero and fp32 subnormals: far below FP8's range
    int e = (int)(ax >> 23) - 127, emin = 1 - bias;
    if (e >= emin) {  // a normal FP8 value (or above): round 23 -> man mantissa bits, then rebias
        int shift = 23 - man;
        uint32_t r = (ax + ((1u << (shift - 1)) - 1u) + ((ax >> shift) & 1u)) >> shift;
        uint32_t code = r - ((uint32_t)(127 - bias) << man);
        return (uint8_t)(sign | (code > max_code ? max_code : code));  // saturate (infinity too)
    }
    // A subnormal counts units of 2^(emin - man): the float is m * 2^(e - 23), so m >> shift units.
    int shift = 23 + emin - man - e;
    if (shift > 25) return (uint8_t)sign;  // below half a unit
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;  // may carry into the smallest normal: still right
    return (uint8_t)(sign | q);
}
// FP8 -> fp32, exact (every FP8 value is also a bfloat16 value).
NEOX_HOST_DEVICE static inline float neox_fp8_to_f32(uint8_t h, neox_fp8_format fmt) {
    const int man = fmt == NEOX_FP8_E4M3 ? 3 : 2, bias = fmt == NEOX_FP8_E4M3 ? 7 : 15;
    const uint32_t emax = fmt == NEOX_FP8_E4M3 ? 15u : 31u;
    uint32_t sign = (uint32_t)(h & 0x80u) << 24, e = (h & 0x7fu) >> man, m = h & ((1u << man) - 1u), x;
    if (fmt == NEOX_FP8_E4M3 && e == emax && m == 7u) x = sign | 0x7fc00000u;                    // NaN
    else if (fmt == NEOX_FP8_E5M2 && e == emax) x = sign | 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u);  // inf, NaN
    else if (e) x = sign | ((e + 127u - (uint32_t)bias) << 23) | (m << (23 - man));
    else {  // zero, subnormal: m units of 2^(1 - bias - man), exact in fp32
        float v = (float)m * (fmt == NEOX_FP8_E4M3 ? 0.001953125f : 1.52587890625e-05f);
        memcpy(&x, &v, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

// The scaled cast of delayed scaling: out[i] = fp8(inp[i] * *scale) in format fmt (the product in
// fp32, then neox_fp8_from_f32), and, when amax is not NULL, *amax = max(*amax, max |inp[i]|) (NaN
// ignored): one pass that records the tensor's amax for later steps' scales while casting it with
// the scale earlier steps chose. scale and amax are one float each in the backend's memory.
// out, inp: (n)
void neox_fp8_cast(uint8_t *out, float *amax, const float *inp, size_t n, const float *scale, neox_fp8_format fmt);
// C (M, N; row stride ldc) = (*a_scale_inv * *b_scale_inv) * op(A) op(B) + beta * C, row-major as
// neox_gemm_ex: A of FP8 format fa, B of format fb (bytes), products accumulated in fp32, C fp32.
// The scale inverses (one float each, backend memory) undo the casts' scales. The CPU widens the
// operands to bfloat16 (exact) and multiplies as neox_gemm_ex; CUDA runs cuBLASLt's FP8 GEMM (sm_89+).
void neox_gemm_fp8(int trans_a, int trans_b, int M, int N, int K, const uint8_t *A, int lda, neox_fp8_format fa,
                   const float *a_scale_inv, const uint8_t *B, int ldb, neox_fp8_format fb, const float *b_scale_inv,
                   float beta, float *C, int ldc);
// Transformer Engine's delayed-scaling update (its amax_and_scale_update) of n scaled tensors whose
// amax history is history: (len, ld), row 0 the amaxes recorded since the last update, column j
// tensor j: the amax it scales by is row 0's (algo_max 0: most_recent) or the largest of the history
// (algo_max 1: max); the history rolls one row up (row i takes row i + 1, the last row row 0's
// amaxes) and row 0 restarts at zero; then scale[j] = fp8_max(fmt) * 2^-margin / amax where that amax
// is finite and positive (else the scale stays), and scale_inv[j] = 1 / scale[j].
void neox_fp8_update_scales(float *history, float *scale, float *scale_inv, int len, int ld, int n, neox_fp8_format fmt,
                            int margin, int algo_max);
// That update for one tensor: h its history column (len rows ld apart), scaled_max = fp8_max(fmt) *
// 2^-margin. The one definition on the host and the device.
NEOX_HOST_DEVICE static inline void neox_fp8_update_one(float *h, int len, int ld, float *scale, float *scale_inv,
                                                        float scaled_max, int algo_max) {
    float newest = h[0], largest = 0.0f;
    for (int i = 0; i < len; i++) {  // row i takes row i + 1, the last row row 0's amax; row 0 restarts
        float a = i < len - 1 ? h[(size_t)(i + 1) * ld] : newest;
        largest = a > largest ? a : largest;  // (fmaxf: a NaN amax is passed over)
        h[(size_t)i * ld] = i > 0 ? a : 0.0f;
    }
    float amax = algo_max ? largest : newest;
    if (amax > 0.0f && amax <= 3.40282347e38f) *scale = scaled_max / amax;  // finite and positive, else kept
    *scale_inv = 1.0f / *scale;
}

// 1-bit Adam (DeepSpeed's OnebitAdam): the moments from a gradient, v untouched when NULL (the
// frozen variance of the compression phase); then p -= lr * (m / (sqrt(v) + eps) + wd * p),
// without bias correction.
void neox_adam_moments(float *m, float *v, const float *grad, size_t n, float beta1, float beta2);
void neox_onebit_adam_apply(float *param, const float *m, const float *v, size_t n, float lr, float eps,
                            float weight_decay);


// ---- compressed and sparse gradient exchanges (lib/gradient's compute; kernels/cpu/compression.c) ---
// 1-bit compression with error feedback (DeepSpeed's compressed_allreduce). error (padded) gains x
// (its first n elements; padded - n zeros follow), then is compressed: scale = ||error|| /
// sqrt(padded) (the sum of squares in double, the scale rounded to fp32), the signs of error (>= 0
// -> 1, most significant bit first) cut into `chunks` equal chunks, chunk c's padded / chunks / 8
// bytes to signs + c * sign_stride, the scale's 4 bytes (unaligned: a float's bytes) to
// scale + c * scale_stride; error keeps error - scale * sign(error).
// error: (padded,)  x: (n,)  padded a multiple of 8 * chunks
void neox_onebit_compress(uint8_t *signs, size_t sign_stride, uint8_t *scale, size_t scale_stride, float *error,
                          const float *x, size_t n, size_t padded, int chunks);
// The server's average of p compressed chunks: block q (blocks + q * block) holds a chunk's signs at
// signs_at and its scale's bytes at scale_at; out[j] = sum over q, in order, of +-(scale_q * (1/p)).
// out: (n,)  blocks: (p, block) bytes
void neox_onebit_average(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at, size_t n,
                         int p);
// The servers' chunks decompressed back to back: out[i] = +-scale_r of chunk r = i / chunk, element
// i % chunk (block r laid out as in neox_onebit_average), for i < n (the padding dropped).
// out: (n,)  blocks: (ceil(n / chunk), block) bytes
void neox_onebit_decompress(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,
                            size_t chunk, size_t n);
// acc[i] += s * x[i] (rounded twice: no fused multiply-add). acc, x: (n,)
void neox_add_scaled(float *acc, const float *x, size_t n, float s);
// PowerSGD's orthonormalisation: Gram-Schmidt over the r columns of P in order, each column less its
// projections on the earlier ones (dot products in double), then divided by its norm + 1e-8.
// P: (n, r) row-major
void neox_orthonormalise_columns(float *P, int n, int r);
// dst[i * ldd + j] = src[i * lds + j] for i < rows, j < cols (a block between row strides).
// dst: (rows, ldd)  src: (rows, lds)
void neox_copy_matrix(float *dst, int ldd, const float *src, int lds, int rows, int cols);
// Sparse rows by id: every row of grad an id names becomes the sum of the rows carrying that id,
// added in the order of the list ((0 + rows[i0]) + rows[i1] + ...); rows no id names are left.
// grad: (V, C)  rows: (n, C)  ids: (n,)
void neox_rows_sum_by_id(float *grad, const float *rows, const int *ids, int n, int C);
// x[ids[i]] *= s for each of the n distinct ids. x: (V, C)  ids: (n,)
void neox_scale_rows(float *x, const int *ids, int n, int C, float s);
#ifdef __cplusplus
}
#endif
#endif
