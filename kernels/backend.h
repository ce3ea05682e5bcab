// backend.h: the compute backend as a table of entry points, so that the same model code runs on the
// CPU or a GPU, chosen at run time (config key `backend: cpu | cuda | auto` in a CUDA=1 build).
//
// Every op of kernels.h is one member with the same name and signature (without the neox_ prefix);
// on the CUDA table all tensor pointers are device pointers, and memory for them comes from the
// table's alloc/free/copy entries (host memory on the CPU table). Ops run in order on the backend's
// stream and return without waiting, except those that return a host value (sum_squares*), which
// wait for their result. The list of ops is written once (NEOX_BACKEND_OPS) and expands into the
// table's members, the CUDA declarations (kernels/cuda/cuda.h) and the CPU table (kernels/cpu/
// backend.c), so the compiler checks that every backend implements every op with kernels.h's types.
#ifndef NEOX_BACKEND_H
#define NEOX_BACKEND_H

#include <stdio.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// X(return type, name, (parameters), (argument names)): one line per op of kernels.h (the names let
// a table wrap each op generically: kernels/cpu/emulated.c).
#define NEOX_BACKEND_OPS(X)                                                                                            \
    X(void, linear_forward, (void *out, int ldo, const void *inp, const void *weight, const float *bias, int N, int IC, \
      int OC, neox_elem act), (out, ldo, inp, weight, bias, N, IC, OC, act))                                           \
    X(void, linear_backward, (void *dinp, float *dweight, float *dbias, const void *dout, int ldo, const void *inp,    \
      const void *weight, int N, int IC, int OC, int accumulate, neox_elem act), (dinp, dweight, dbias, dout, ldo,      \
      inp, weight, N, IC, OC, accumulate, act))                                                                        \
    X(void, linear_act_forward, (void *out, void *pre, const void *inp, const void *weight, const float *bias, int N,  \
      int IC, int OC, neox_act_fn fn, neox_elem act), (out, pre, inp, weight, bias, N, IC, OC, fn, act))               \
    X(void, linear_act_backward, (void *dpre, float *dbias, const void *dout, const void *weight, const void *pre,     \
      int N, int IC, int OC, neox_act_fn fn, neox_elem act), (dpre, dbias, dout, weight, pre, N, IC, OC, fn, act))     \
    X(void, gemm_ex, (int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,              \
      const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c), (trans_a, trans_b, M, N, K,    \
      alpha, A, lda, B, ldb, ab, beta, C, ldc, c))                                                                     \
    X(void, embedding_forward, (void *out, const int *ids, const float *wte, const float *wpe, int B, int T, int C,    \
      neox_elem act), (out, ids, wte, wpe, B, T, C, act))                                                              \
    X(void, embedding_rows, (void *out, const int *ids, const float *rows, int v0, int v1, int N, int C,               \
      neox_elem act), (out, ids, rows, v0, v1, N, C, act))                                                             \
    X(void, embedding_backward, (float *dwte, float *dwpe, const void *dout, const int *ids, int B, int T, int C,      \
      neox_elem act), (dwte, dwpe, dout, ids, B, T, C, act))                                                           \
    X(void, layernorm_forward, (void *out, float *mean, float *rstd, const void *inp, const float *weight,             \
      const float *bias, int N, int C, float eps, neox_elem act), (out, mean, rstd, inp, weight, bias, N, C, eps, act)) \
    X(void, layernorm_backward, (void *dinp, float *dweight, float *dbias, float *dsum, const void *dout,              \
      const void *inp, const float *weight, const float *mean, const float *rstd, int N, int C, neox_elem act),         \
      (dinp, dweight, dbias, dsum, dout, inp, weight, mean, rstd, N, C, act))                                           \
    X(void, rmsnorm_forward, (void *out, float *rstd, const void *inp, const float *weight, int N, int C, float eps,   \
      neox_elem act), (out, rstd, inp, weight, N, C, eps, act))                                                         \
    X(void, rmsnorm_backward, (void *dinp, float *dweight, float *dsum, const void *dout, const void *inp,             \
      const float *weight, const float *rstd, int N, int C, neox_elem act), (dinp, dweight, dsum, dout, inp, weight,    \
      rstd, N, C, act))                                                                                                 \
    X(void, scalenorm_forward, (void *out, float *rnorm, const void *inp, const float *g, int N, int C, float eps,     \
      neox_elem act), (out, rnorm, inp, g, N, C, eps, act))                                                            \
    X(void, scalenorm_backward, (void *dinp, float *dg, const void *dout, const void *inp, const float *g,             \
      const float *rnorm, int N, int C, float eps, neox_elem act), (dinp, dg, dout, inp, g, rnorm, N, C, eps, act))    \
    X(void, head_norm_forward, (void *out, float *mean, float *rstd, const void *inp, const float *weight,             \
      const float *bias, int B, int H, int T, int HS, int G, float eps, neox_elem act), (out, mean, rstd, inp, weight, \
      bias, B, H, T, HS, G, eps, act))                                                                                 \
    X(void, head_norm_backward, (void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,         \
      const float *weight, const float *mean, const float *rstd, int B, int H, int T, int HS, int G, neox_elem act),   \
      (dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, H, T, HS, G, act))                                      \
    X(void, gather_rows, (void *out, const void *inp, const int *idx, int n, int C, neox_elem act), (out, inp, idx, n, \
      C, act))                                                                                                         \
    X(void, moe_combine, (void *out, const void *rows, const int *slot, const float *weight, int N, int K, int C,     \
      neox_elem act), (out, rows, slot, weight, N, K, C, act))                                                         \
    X(void, moe_combine_backward, (void *drows, float *dweight, const void *dout, const void *rows, const int *slot,  \
      const float *weight, int N, int K, int C, neox_elem act), (drows, dweight, dout, rows, slot, weight, N, K, C,    \
      act))                                                                                                            \
    X(void, add_layernorm_forward, (void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,     \
      const float *b_bias, const float *weight, const float *bias, int N, int C, float eps, neox_elem act),             \
      (sum, out, mean, rstd, a, b, b_bias, weight, bias, N, C, eps, act))                                               \
    X(void, add_rmsnorm_forward, (void *sum, void *out, float *rstd, const void *a, const void *b,                    \
      const float *b_bias, const float *weight, int N, int C, float eps, neox_elem act), (sum, out, rstd, a, b, b_bias, \
      weight, N, C, eps, act))                                                                                          \
    X(void, qkv_split, (void *q, void *k, void *v, const void *qkv, int B, int T, int NH, int NKV, int HS,             \
      int interleaved, neox_elem act), (q, k, v, qkv, B, T, NH, NKV, HS, interleaved, act))                             \
    X(void, qkv_merge, (void *dqkv, const void *dq, const void *dk, const void *dv, int B, int T, int NH, int NKV,     \
      int HS, int interleaved, neox_elem act), (dqkv, dq, dk, dv, B, T, NH, NKV, HS, interleaved, act))                 \
    X(void, rotary_tables, (float *cos, float *sin, int T, int R, double base, neox_rope_scaling scaling), (cos, sin, \
      T, R, base, scaling))                                                                                            \
    X(void, rotary_apply, (void *x, const float *cos, const float *sin, int B, int H, int T, int HS, int R,            \
      int inverse, neox_elem act, neox_head_strides xs), (x, cos, sin, B, H, T, HS, R, inverse, act, xs))             \
    X(void, attention_forward, (void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,     \
      int NH, int NKV, int HS, neox_attention_opts o, neox_elem act), (out, lse, q, k, v, B, T, NH, NKV, HS, o, act))  \
    X(void, attention_cached, (float *out, const float *q, const float *kcache, const float *vcache, int S, int pos0,  \
      int NH, int NKV, int HS, int maxT, neox_attention_opts o), (out, q, kcache, vcache, S, pos0, NH, NKV, HS, maxT,  \
      o))                                                                                                              \
    X(void, attention_backward, (void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,         \
      const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV, int HS, neox_attention_opts o,   \
      neox_elem act), (dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, o, act))                                \
    X(void, activation_forward, (void *out, const void *inp, size_t n, neox_act_fn fn, neox_elem act), (out, inp, n,  \
      fn, act))                                                                                                        \
    X(void, activation_backward, (void *dinp, const void *dout, const void *inp, size_t n, neox_act_fn fn,            \
      neox_elem act), (dinp, dout, inp, n, fn, act))                                                                    \
    X(void, gated_forward, (void *out, const void *inp, int N, int F, neox_act_fn fn, neox_elem act), (out, inp, N, F, \
      fn, act))                                                                                                        \
    X(void, gated_backward, (void *dinp, const void *dout, const void *inp, int N, int F, neox_act_fn fn,             \
      neox_elem act), (dinp, dout, inp, N, F, fn, act))                                                                 \
    X(void, add, (void *out, const void *a, const void *b, size_t n, neox_elem act), (out, a, b, n, act))             \
    X(void, add_inplace, (float *acc, const float *x, size_t n), (acc, x, n))                                          \
    X(void, add_bias, (void *x, const float *bias, int N, int C, neox_elem act), (x, bias, N, C, act))                \
    X(void, dropout, (void *out, const void *inp, size_t n, float p, unsigned long long seed,                         \
      unsigned long long offset, const unsigned long long *row0_at, unsigned long long row_elems, neox_elem act),      \
      (out, inp, n, p, seed, offset, row0_at, row_elems, act))                                                         \
    X(void, jitter, (void *out, const void *inp, size_t n, float eps, unsigned long long seed, neox_elem act),       \
      (out, inp, n, eps, seed, act))                                                                                   \
    X(void, cross_entropy_forward, (float *losses, float *lse, const void *logits, const int *targets, int N, int V,  \
      neox_elem act), (losses, lse, logits, targets, N, V, act))                                                       \
    X(void, cross_entropy_row_max, (float *mx, const void *logits, int N, int V, neox_elem act), (mx, logits, N, V,    \
      act))                                                                                                            \
    X(void, cross_entropy_row_sumexp, (double *sum, const void *logits, const float *mx, int N, int V, neox_elem act), \
      (sum, logits, mx, N, V, act))                                                                                    \
    X(void, cross_entropy_target_logit, (double *out, const void *logits, const int *targets, int N, int V,            \
      neox_elem act), (out, logits, targets, N, V, act))                                                               \
    X(void, cross_entropy_loss, (float *lse, double *loss, const float *mx, const double *stats, const float *mask,     \
      int N), (lse, loss, mx, stats, mask, N))                                                                         \
    X(void, cross_entropy_backward, (void *dlogits, const void *logits, const float *lse, const int *targets,          \
      const float *weight, float scale, const float *scale_at, int N, int V, neox_elem act), (dlogits, logits, lse,    \
      targets, weight, scale, scale_at, N, V, act))                                                                    \
    X(void, cross_entropy_fused, (void *logits, neox_elem logits_elem, float *mx, double *sum, double *target_logit,   \
      const int *targets, const float *weight, float scale, const float *scale_at, int N, int V, int stats_given),     \
      (logits, logits_elem, mx, sum, target_logit, targets, weight, scale, scale_at, N, V, stats_given))               \
    X(double, sum_squares, (const float *x, size_t n), (x, n))                                                         \
    X(double, sum_squares_segments, (const float *x, const neox_segment *segs, int nseg), (x, segs, nseg))             \
    X(void, scale, (float *x, size_t n, float s), (x, n, s))                                                           \
    X(void, adamw, (float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2, \
      float eps, float weight_decay, long step), (param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step))    \
    X(void, sum_squares_segments_into, (double *sumsq, const float *x, const neox_segment *segs, int nseg), (sumsq, x,  \
      segs, nseg))                                                                                                     \
    X(void, clip_by_norm, (float *x, size_t n, const double *sumsq, double loss_scale, const double *loss_scale_at,    \
      double clip_grad), (x, n, sumsq, loss_scale, loss_scale_at, clip_grad))                                          \
    X(void, loss_guard, (double *guard, const double *sumsq, const double *loss_sums, int n), (guard, sumsq, loss_sums, \
      n))                                                                                                              \
    X(void, adamw_segments, (float *param, const float *grad, float *m, float *v, const neox_segment *segs, int nseg,  \
      const neox_step_scalars *sc, float beta1, float beta2, float eps, float grad_scale, const double *guard),       \
      (param, grad, m, v, segs, nseg, sc, beta1, beta2, eps, grad_scale, guard))                                       \
    X(void, sgd_segments, (float *param, const float *grad, float *buf, const neox_segment *segs, int nseg,           \
      const neox_step_scalars *sc, float momentum, const double *guard), (param, grad, buf, segs, nseg, sc, momentum,  \
      guard))                                                                                                          \
    X(void, lion_segments, (float *param, const float *grad, float *m, const neox_segment *segs, int nseg,            \
      const neox_step_scalars *sc, float beta1, float beta2, const double *guard), (param, grad, m, segs, nseg, sc,     \
      beta1, beta2, guard))                                                                                            \
    X(void, madgrad_segments, (float *param, const float *grad, float *sum_sq, float *s, float *x0,                    \
      const neox_segment *segs, int nseg, float lr_eps, float lamb, float momentum, float eps, int first), (param,     \
      grad, sum_sq, s, x0, segs, nseg, lr_eps, lamb, momentum, eps, first))                                            \
    X(void, sm3_segments, (float *param, const float *grad, float *m, const float *acc, float *acc_next,                \
      const neox_sm3_segment *segs, int nseg, float lr, float momentum, float beta, float eps), (param, grad, m, acc,   \
      acc_next, segs, nseg, lr, momentum, beta, eps))                                                                  \
    X(void, adam_moments, (float *m, float *v, const float *grad, size_t n, float beta1, float beta2), (m, v, grad, n, \
      beta1, beta2))                                                                                                   \
    X(void, onebit_adam_apply, (float *param, const float *m, const float *v, size_t n, float lr, float eps,           \
      float weight_decay), (param, m, v, n, lr, eps, weight_decay))                                                    \
    X(void, cast_f32_to_bf16, (uint16_t *out, const float *inp, size_t n), (out, inp, n))                              \
    X(void, cast_bf16_to_f32, (float *out, const uint16_t *inp, size_t n), (out, inp, n))                              \
    X(void, cast_f32_to_f16, (uint16_t *out, const float *inp, size_t n), (out, inp, n))                               \
    X(void, cast_f16_to_f32, (float *out, const uint16_t *inp, size_t n), (out, inp, n))                               \
    X(void, fp8_cast, (uint8_t *out, float *amax, const float *inp, size_t n, const float *scale,                     \
      neox_fp8_format fmt), (out, amax, inp, n, scale, fmt))                                                          \
    X(void, gemm_fp8, (int trans_a, int trans_b, int M, int N, int K, const uint8_t *A, int lda, neox_fp8_format fa,  \
      const float *a_scale_inv, const uint8_t *B, int ldb, neox_fp8_format fb, const float *b_scale_inv, float beta,    \
      float *C, int ldc), (trans_a, trans_b, M, N, K, A, lda, fa, a_scale_inv, B, ldb, fb, b_scale_inv, beta, C, ldc))  \
    X(void, fp8_update_scales, (float *history, float *scale, float *scale_inv, int len, int ld, int n,               \
      neox_fp8_format fmt, int margin, int algo_max), (history, scale, scale_inv, len, ld, n, fmt, margin, algo_max))   \
    X(void, onebit_compress, (uint8_t *signs, size_t sign_stride, uint8_t *scale, size_t scale_stride, float *error,  \
      const float *x, size_t n, size_t padded, int chunks), (signs, sign_stride, scale, scale_stride, error, x, n,    \
      padded, chunks))                                                                                                 \
    X(void, onebit_average, (float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,       \
      size_t n, int p), (out, blocks, block, signs_at, scale_at, n, p))                                                \
    X(void, onebit_decompress, (float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,    \
      size_t chunk, size_t n), (out, blocks, block, signs_at, scale_at, chunk, n))                                     \
    X(void, add_scaled, (float *acc, const float *x, size_t n, float s), (acc, x, n, s))                               \
    X(void, orthonormalise_columns, (float *P, int n, int r), (P, n, r))                                               \
    X(void, copy_matrix, (float *dst, int ldd, const float *src, int lds, int rows, int cols), (dst, ldd, src, lds,    \
      rows, cols))                                                                                                     \
    X(void, rows_sum_by_id, (float *grad, const float *rows, const int *ids, int n, int C), (grad, rows, ids, n, C))   \
    X(void, scale_rows, (float *x, const int *ids, int n, int C, float s), (x, ids, n, C, s))

// Memory entry points: X(return type, name, (parameters), (argument names)) likewise. to_device/to_host copy between
// host memory and the backend's and wait for the copy; copy within the backend's; synchronize waits for
// queued work (copies included); peak_bytes is the most device memory the backend's allocations (and its
// own scratch) held at once, 0 on the CPU table, whose memory is the process's own (its peak is the
// resident set's).
//
// release(p, bytes) gives back the memory of the whole pages inside [p, p + bytes) and returns how
// many bytes it gave back (a device's pages are its mapping granules, 2 MiB on CUDA; 0 where the
// backend cannot give back part of an allocation: a cudaMalloc block, the dry table). The range's
// contents are undefined from then on: the CPU table and the emulated device zero it (MADV_DONTNEED on
// the pages inside, a memset of the partial pages at its ends), other backends may not. It is
// stream-ordered: work queued before it that reads the range runs first.
//
// commit(p, bytes) takes back the pages of [p, p + bytes) that a release gave back, before anything
// writes them again, and returns the bytes it took. A device cannot fault a page in when a kernel
// writes it, so on a device a released page is unmapped until committed: an op, copy or collective
// that touches it first is an illegal address on CUDA, and stops the emulated device naming the
// buffer. On the CPU table a page comes back when written, and commit does nothing. The emulated
// device's peak_bytes stops counting a released page until it is committed. release_granularity is the
// size of those pages (the host's page; a CUDA mapping granule), 0 where release gives nothing back.
//
// Asynchronous copies, on one copy queue beside the ops (a second CUDA stream), in the order queued:
// to_host_async / to_device_async start after every op queued so far and return a ticket at once;
// host_wait(ticket) returns when that copy (and every one queued before it) is done, after which the
// host may read its destination or reuse its source; device_wait(ticket) makes the ops queued after it
// wait for the copy, without the host waiting. Until then the destination holds nothing defined and
// the source must not change. host_alloc memory is page-locked where the backend has a device (its
// copies then run beside the ops, not through a staging buffer); ticket 0 is done already.
#define NEOX_BACKEND_MEMORY(X)                                                                                         \
    X(void *, alloc, (size_t bytes), (bytes))                                                                          \
    X(void, free, (void *p), (p))                                                                                      \
    X(void, memset_zero, (void *p, size_t bytes), (p, bytes))                                                          \
    X(void, to_device, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                                  \
    X(void, to_host, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                                    \
    X(void, copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                                       \
    X(void, synchronize, (void), ())                                                                               \
    X(size_t, peak_bytes, (void), ())                                                                                  \
    X(size_t, release, (void *p, size_t bytes), (p, bytes))                                                            \
    X(size_t, commit, (void *p, size_t bytes), (p, bytes))                                                             \
    X(size_t, release_granularity, (void), ())                                                                         \
    X(void *, host_alloc, (size_t bytes), (bytes))                                                                     \
    X(void, host_free, (void *p), (p))                                                                                 \
    X(int64_t, to_host_async, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                           \
    X(int64_t, to_device_async, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                         \
    X(void, host_wait, (int64_t ticket), (ticket))                                                                     \
    X(void, device_wait, (int64_t ticket), (ticket))

// ---- captured work (a training step as a CUDA graph) ----
// graph_begin starts recording the work the host queues: until graph_end, every op and stream-ordered
// memory entry (memset_zero, copy, to_host_async, to_device_async, device_wait) is recorded with its
// arguments instead of run, pointers and by-value values alike, so a value passed by value is frozen
// into the recording (per-step values go in memory: neox_step_scalars). An entry that would make the
// host wait or change the memory map inside a recording (alloc, free, to_host, to_device, synchronize,
// host_alloc, host_free, release, commit, an op returning a host value, a host_wait of a copy not yet
// done) stops the process naming it, as it fails a CUDA capture. graph_end makes the recording
// launchable (replacing the last one); graph_launch queues all of it again, reading its host sources
// (page-locked) afresh, and returns a ticket that host_wait takes, done when all of it is. A ticket a
// copy returned inside the recording stands for that copy in every launch: waiting for it waits for the
// last launch. NULL entries where a backend cannot capture (the CPU and dry tables, the per-op profile).
#define NEOX_BACKEND_GRAPH(X)                                                                                          \
    X(void, graph_begin, (void), ())                                                                                   \
    X(void, graph_end, (void), ())                                                                                     \
    X(int64_t, graph_launch, (void), ())

// ---- a decoding step in one parallel region (the CPU's thread team) ----
// Each entry point a product of a decoding step meets costs a wake-up and a join of the threads when
// it opens a parallel region of its own (121 per token on a 30-layer model). A team runs the whole
// step in one region instead: team_run calls body(ctx, thread, threads) once on each of the
// backend's threads at once and returns when every one has returned; team_threads is how many it
// will start at most. Inside, every thread calls the same sequence of entry points with the same
// arguments (a thread's own copy of an input may stand for another's: the same values): team_linear
// splits its output rows among the threads and returns when all are written (the team's barrier);
// every other op and copy runs on the calling thread alone (so each thread computes the small ops
// itself, into buffers of its own); team_barrier waits for the whole team. team_linear: out (N,
// OC; shared by the team) = inp (N, IC) @ weight^T (OC, IC) (+ bias (OC)), N at most
// NEOX_DECODE_MAX_ROWS, each row's sum the one a product of that row alone computes (kernels.h,
// NEOX_DECODE_MAX_ROWS); operands fp32 (the bias starts the sums, as linear_forward adds it) or
// bfloat16 (inp and weight bfloat16, the bias added to each fp32 result afterwards, as gemm_ex then
// add_bias compute it). NULL entries on tables without a thread team (CUDA, the emulated device,
// the dry table, the per-op profile, whose timers are per op): their callers run op by op.
#define NEOX_BACKEND_TEAM(X)                                                                                           \
    X(int, team_threads, (void), ())                                                                                   \
    X(void, team_run, (void (*body)(void *ctx, int thread, int threads), void *ctx), (body, ctx))                      \
    X(void, team_barrier, (void), ())                                                                                  \
    X(void, team_linear, (float *out, const void *inp, const void *weight, const float *bias, int N, int IC, int OC,   \
      neox_elem operands), (out, inp, weight, bias, N, IC, OC, operands))

#define NEOX_BACKEND_MEMBER(ret, name, params, args) ret(*name) params;

typedef struct neox_backend {
    const char *name;  // "cpu" or "cuda"
    int on_device;     // tensors live in device memory (pointers are not host-dereferenceable)
    int releases;      // release gives memory back (the CPU table, the emulated device, CUDA with virtual memory
                       // management), so plans may count it
    NEOX_BACKEND_MEMORY(NEOX_BACKEND_MEMBER)
    NEOX_BACKEND_GRAPH(NEOX_BACKEND_MEMBER)
    NEOX_BACKEND_TEAM(NEOX_BACKEND_MEMBER)
    NEOX_BACKEND_OPS(NEOX_BACKEND_MEMBER)
} neox_backend;

// The CPU backend (always present).
const neox_backend *neox_backend_cpu(void);
// The CPU's ops on memory the host may touch only through to_host/to_device (kernels/cpu/emulated.c:
// any other host access faults with a message): checks device code paths without a GPU.
const neox_backend *neox_backend_emulated(void);
// What the emulated device offers the communication layer's twin of NCCL (lib/parallel/
// emulated_comm.c), which kernels/ may not call: whether p lies in its memory; opening its memory
// (nested) for the twin's own reads and writes; and the hook the device calls before it runs any op
// or stream-ordered memory entry point (everything 0), or synchronizes (everything 1), so that
// collectives queued on its stream run first, as a device would have run them by then.
int neox_emulated_owns(const void *p);
void neox_emulated_open(void);
void neox_emulated_close(void);
void neox_emulated_set_stream_hook(void (*reach)(int everything));
// The CUDA backend on the current device, initialised on first use (cuBLAS handle, stream); NULL
// in a CPU-only build or when no GPU is visible.
const neox_backend *neox_backend_cuda(void);
// Marks for a device profiler (kernels/cuda/profiler_marks.cu): a named NVTX range pushed and popped
// on the calling thread, and the profiler's capture started or stopped (cudaProfilerStart/Stop, which
// `nsys profile --capture-range=cudaProfilerApi` waits for). They do nothing in a build without CUDA.
void neox_device_range_push(const char *name);
void neox_device_range_pop(void);
void neox_device_profiler_capture(int on);
// The backend a configuration names: "cpu", "cuda" (NULL with a message in err when unavailable),
// "auto" (cuda when a GPU is visible, else cpu) or "emulated". NULL with a message for any other name.
const neox_backend *neox_backend_select(const char *choice, char *err, size_t errlen);


// ---- op costs, the per-op profile and the dry backend ---------------------------------------------
// Every op has an id (NEOX_OP_<name>) and a class; kernels/op_cost.c owns what each call costs:
// neox_op_cost_<name> takes the op's own arguments and returns the FLOPs of its matrix products and
// the bytes it reads and writes (the formulas and conventions are commented there).
typedef enum neox_op_id {
#define NEOX_OP_ID(ret, name, params, args) NEOX_OP_##name,
    NEOX_BACKEND_OPS(NEOX_OP_ID)
#undef NEOX_OP_ID
    NEOX_OP_COUNT
} neox_op_id;

typedef enum neox_op_class {
    NEOX_CLASS_GEMM, NEOX_CLASS_ATTENTION, NEOX_CLASS_NORM, NEOX_CLASS_ELEMENTWISE, NEOX_CLASS_EMBEDDING,
    NEOX_CLASS_LOSS, NEOX_CLASS_OPTIMIZER, NEOX_CLASS_CAST, NEOX_CLASS_COUNT
} neox_op_class;

typedef struct neox_op_cost {
    double flops;  // of the matrix products (a multiply-add is 2); 0 for memory-bound ops
    double bytes;  // read + written in backend memory, at the storage precision
    int tensor16;  // the products take 16-bit operands (a GPU's tensor cores)
    int cudnn;     // attention a CUDA device runs on cuDNN by the route's rule (kernels/attention_route.c)
    // Of bytes, those of memory-bound passes a device runs after the op's product as kernels of their
    // own (an activation not fused into the product, a bias gradient's column sums), and how many
    // kernels: a roofline prices them after the product rather than under it.
    double after_bytes;
    int after_calls;
} neox_op_cost;

#define NEOX_OP_COST_DECLARE(ret, name, params, args) neox_op_cost neox_op_cost_##name params;
NEOX_BACKEND_OPS(NEOX_OP_COST_DECLARE)
#undef NEOX_OP_COST_DECLARE
const char *neox_op_name(neox_op_id op);
neox_op_class neox_op_class_of(neox_op_id op);
const char *neox_op_class_name(neox_op_class c);

// The per-op profile (kernels/op_profile.c): a table that wraps another, calling each op through
// and recording its cost and time under the scope the model last set, per op, phase and layer. One
// per process; installed only when asked for (`wall_clock_breakdown: true`), so an unprofiled run
// pays nothing. Times are the wall clock around each call on the CPU and the emulated device, and
// CUDA events around each op on the cuda backend (read in batches, which waits for the device).
typedef enum neox_phase {
    NEOX_PHASE_FORWARD, NEOX_PHASE_BACKWARD, NEOX_PHASE_OPTIMIZER,  // of a training step
    NEOX_PHASE_OTHER,  // outside a step: set-up, evaluation, generation
    NEOX_PHASE_COUNT
} neox_phase;
const char *neox_phase_name(neox_phase p);
// The scope of the ops that follow: layer is the transformer layer's index, or -1 outside the
// layers (embedding, final norm, output layer, loss, optimizer). The model sets it; a store of two
// ints, whether or not a profile is installed.
void neox_profile_scope(neox_phase phase, int layer);

typedef struct neox_op_stat {
    int64_t calls;
    double seconds, flops, bytes;
} neox_op_stat;

// One recorded call (keep_trace): the op, its scope and its cost.
typedef struct neox_op_call {
    neox_op_id op;
    neox_phase phase;
    int layer;
    neox_op_cost cost;
} neox_op_call;

// Wraps inner (its name, on_device and memory entries are inner's, so callers see no difference) and
// starts recording from nothing; keep_trace also keeps every call in order (neox_profile_trace).
const neox_backend *neox_profile_install(const neox_backend *inner, int keep_trace);
// What the table wraps (NULL before neox_profile_install) and how it times ("wall clock", "CUDA events").
const neox_backend *neox_profile_inner(void);
const char *neox_profile_timing(void);
// Waits for the times not yet read (the device's events) and adds them in.
void neox_profile_flush(void);
// The sum for one op in one scope (layer -1: outside the layers); layers: 1 + the highest layer seen.
neox_op_stat neox_profile_stat(neox_phase phase, int layer, neox_op_id op);
int neox_profile_layers(void);
// The calls recorded with keep_trace, in order.
const neox_op_call *neox_profile_trace(size_t *ncalls);
// Forgets every sum and the trace.
void neox_profile_reset(void);

// Blocking host waits: a backend with a device notes each place the host waits for it — a synchronous
// copy (to_host, to_device), a host_wait whose copy had not finished, synchronize with work queued, an
// op that returns a host value (sum_squares*). The CPU table never waits. A count per process, kept
// whether or not a profile is installed (a store of one integer); the trainer reads it around each
// training step (op_profile.json's "host_waits", docs/cuda.md "Host waits in a step").
void neox_note_host_wait(void);
int64_t neox_host_waits(void);

// A table whose ops do nothing (kernels/dry.c): it answers allocations with addresses in an
// untouched reservation (PROT_NONE: nothing can read them), so a large model's step is issued in
// seconds, and its peak_bytes is what the step's allocations would hold on a device (counted afresh
// whenever every allocation has been freed, so one process can size several models). Host values it
// returns (sum_squares, to_host) are zeros. For tracing a step's ops: bench/gpu_predict.c.
const neox_backend *neox_backend_dry(void);

// The profile's reports (lib/op_profile.c; formats in docs/metrics.md). print_table: a compact table
// by op class (calls, ms, GFLOP, GB, achieved GFLOP/s and GB/s) of the calls since its last print,
// per iteration over the given number of iterations (which the JSON's "iterations" adds up).
// write_json: everything recorded so far (by op class, op, phase and layer) as JSON, written
// atomically to path; -1 with a message in err on failure.
void neox_profile_print_table(FILE *out, int64_t iterations);
int neox_profile_write_json(const char *path, char *err, size_t errlen);
// Records the blocking host waits (neox_host_waits) inside one training step, for op_profile.json's
// "host_waits" (the trainer calls it after each step while a profile is installed).
void neox_profile_note_step_host_waits(int64_t waits);

#ifdef __cplusplus
}
#endif
#endif
