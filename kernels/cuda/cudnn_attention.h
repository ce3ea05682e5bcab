// cudnn_attention.h: cuDNN's fused scaled-dot-product attention (flash attention inside cuDNN 9,
// built through the header-only cudnn-frontend) as a small C interface: forward and backward graphs
// on bf16 q, k, v, out read and written through strides, softmax statistics (the log-sum-exp per
// query row) in fp32, causal masks, sliding windows and GQA; deterministic backward. Plans are cached
// per shape. libcudnn is opened with dlopen on first use, so the tools run (and fall back to the own
// kernels) where it is absent. kernels/cuda/attention_cudnn.cu decides when this path runs.
#ifndef NEOX_CUDNN_ATTENTION_H
#define NEOX_CUDNN_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One attention call's shape and layout. Every tensor is addressed as (B, heads, T, HS) by element
// strides, so q, k and v can be read straight from a fused QKV buffer (B, T, W) (W = (H + 2 Hkv) HS):
// GPT-NeoX's interleaved per-head layout has q strides (T W, 3 HS, W, 1) with k and v at +HS and
// +2 HS; the Llama layout has (T W, HS, W, 1) with k at H HS and v at (H + Hkv) HS.
typedef struct neox_cudnn_sdpa {
    int B, H, Hkv, T, HS;  // batch, query heads, key/value heads (H % Hkv == 0), sequence, head size
    int causal;            // query i sees keys j <= i
    // Tq > 0: the call's Tq queries are the last Tq positions of the T keys' (query r at T - Tq + r:
    // the causal diagonal and the window aligned to the bottom-right corner), e.g. one chunk of a
    // context-parallel rank's queries over the keys up to its end; 0: T queries at the keys' positions.
    int Tq;
    int window;            // > 0: only keys i - window + 1 .. i (with causal); 0: no window
    float scale;           // on q . k
    int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4];  // (B, heads, T, HS) strides in elements;
                                                                  // the gradients use their tensor's strides
} neox_cudnn_sdpa;

// Strides of a dense (B, heads, T, HS) tensor, and of the model's (B, T, heads, HS) output layout.
void neox_cudnn_strides_bhtd(int64_t stride[4], int heads, int T, int HS);
void neox_cudnn_strides_bthd(int64_t stride[4], int heads, int T, int HS);
// q, k, v strides of a fused QKV buffer (B, T, (H + 2 Hkv) HS) in GPT-NeoX's interleaved layout
// (interleaved != 0; needs H == Hkv) or the Llama layout, with each tensor's offset in elements from
// the buffer's start.
void neox_cudnn_strides_qkv(neox_cudnn_sdpa *s, int interleaved, int64_t *q_off, int64_t *k_off, int64_t *v_off);

// 1 when this build has the cuDNN path (compiled with the cudnn-frontend headers), 0 when every entry
// point below only reports that it is missing.
int neox_cudnn_built(void);
// Opens libcudnn (once). 1 when it loaded; 0 with the reason in why. Needs no GPU.
int neox_cudnn_load(char *why, size_t whylen);
// "9.19.0": the loaded library's version, or "" before neox_cudnn_load succeeded.
const char *neox_cudnn_version(void);

// Builds the forward and backward graphs of s and runs cudnn-frontend's validate() on them for the
// given SM version (90 = Hopper), without a handle or a GPU: what the frontend checks before cuDNN
// itself sees the graph (data types, head sizes, mask combinations, GQA, the architecture's rules).
// 1 when both pass; 0 with the frontend's message in why.
int neox_cudnn_sdpa_validate(const neox_cudnn_sdpa *s, int sm_version, char *why, size_t whylen);

// On the current GPU: builds (or finds in the cache) the forward and backward execution plans of s
// (validate, cuDNN's operation graph, heuristics, support check, plan build). 1 when both exist; 0
// with the reason (including no GPU, no library) in why. Failures are cached too, so a shape cuDNN
// refuses costs one attempt. *fwd_ws, *bwd_ws: the workspace bytes each needs.
int neox_cudnn_sdpa_prepare(const neox_cudnn_sdpa *s, size_t *fwd_ws, size_t *bwd_ws, char *why, size_t whylen);

// out, stats (B, H, Tq) fp32, dense = attention(q, k, v), queued on stream (a cudaStream_t). Pointers are
// device pointers to bf16 (uint16_t bit patterns) addressed through s's strides; workspace holds at
// least prepare's *fwd_ws bytes. Requires a successful prepare of s. Returns 0 when cuDNN refused to
// run (the reason in why).
int neox_cudnn_sdpa_forward(const neox_cudnn_sdpa *s, uint16_t *out, float *stats, const uint16_t *q,
                            const uint16_t *k, const uint16_t *v, void *workspace, void *stream, char *why,
                            size_t whylen);
// dq, dk, dv (overwritten; through q's, k's and v's strides) from dout (out's strides), q, k, v, out
// and the forward's stats; deterministic (the same bits every run).
int neox_cudnn_sdpa_backward(const neox_cudnn_sdpa *s, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                             const uint16_t *out, const float *stats, void *workspace, void *stream, char *why,
                             size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
