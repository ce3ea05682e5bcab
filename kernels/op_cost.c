// op_cost.c: what each op of the backend table costs, computed from its arguments: the floating-point
// operations of its matrix products and the bytes it reads and writes in backend memory. The one
// owner of these formulas: the per-op profile (kernels/op_profile.c) adds them up beside the measured
// times, and bench/gpu_predict.c turns them into a roofline prediction of a GPU step.
//
// Conventions (docs/metrics.md, "The per-op profile"):
// - FLOPs count the products only, a multiply-add as 2: a GEMM is 2·M·N·K, attention 2·HS per (query,
//   key) pair and product. Everything else (bias adds, norms, softmax, activations, the optimizer) is
//   memory-bound, and its cost is its bytes; its FLOPs are 0, so the GEMM and attention FLOPs are the
//   ones MFU counts.
// - Bytes are each operand read once and each result written once, at its storage precision (fp32
//   activations, 16-bit operands of gemm_ex as given); an operand read and written (in place, or a
//   gradient accumulated) counts twice. Index arrays (ids, targets) count 4 bytes per entry.
// - Attention is causal: a query sees itself and the keys before it (the last `window` of them when
//   window > 0), so its pairs are about T²/2 per head, which is what a causal kernel computes.
#include "kernels/backend.h"

#define F32 4.0  // bytes of a stored activation, weight, gradient or optimizer state
#define IDX 4.0  // bytes of an index (token id, target, slot)

static double elem_bytes(neox_elem e) { return e == NEOX_ELEM_F32 ? 4.0 : 2.0; }

static neox_op_cost bytes_only(double bytes) { return (neox_op_cost){.flops = 0.0, .bytes = bytes, .tensor16 = 0}; }

// (query, key) pairs a causal attention of T queries, offset pos0 into the keys, scores.
static double causal_pairs(int T, int pos0, int window) {
    double pairs = 0.0;
    for (int i = 0; i < T; i++) {
        int seen = pos0 + i + 1;
        pairs += window > 0 && window < seen ? window : seen;
    }
    return pairs;
}

// The (query, key) pairs an attention's queries score, at the positions its opts give them (their
// own 0..T-1, or a context-parallel rank's two chunks).
static double query_pairs(int T, const neox_attention_opts *o) {
    double pairs = 0.0;
    int Tq = neox_attention_query_rows(o, T);
    for (int i = 0; i < Tq; i++) {
        int seen = neox_attention_query_pos(o, i) + 1;
        pairs += o->window > 0 && o->window < seen ? o->window : seen;
    }
    return pairs;
}

static double segments_floats(const neox_segment *segs, int nseg) {
    double n = 0.0;
    for (int i = 0; i < nseg; i++) n += (double)(segs[i].end - segs[i].begin);
    return n;
}

// ---- GEMMs ------------------------------------------------------------------------------------
// out (N, OC) = inp (N, IC) · weight (OC, IC)ᵀ + bias: 2·N·IC·OC; the bias add is bytes only. The
// operands and out are of type act. A 16-bit product with a bias goes through fp32 rows on the device
// (cuBLASLt's bias epilogue takes a bias of the output's type; ours are fp32: kernels/cuda/linear.cu's
// forward16), unless cuDNN's matmul + bias graph runs it (neox_linear_bias_route): the product writes
// them, and a pass of its own reads them and stores out.
neox_op_cost neox_op_cost_linear_forward(void *out, int ldo, const void *inp, const void *weight, const float *bias,
                                         int N, int IC, int OC, neox_elem act) {
    (void)out, (void)inp, (void)weight;
    double n = N, ic = IC, oc = OC, a = elem_bytes(act);
    int rows = bias && act != NEOX_ELEM_F32 && neox_linear_bias_route(act, ldo, OC) != NEOX_EPILOGUE_CUDNN;
    double after = rows ? (F32 + a) * n * oc : 0.0;
    return (neox_op_cost){.flops = 2.0 * n * ic * oc,
                          .bytes = a * (n * ic + oc * ic) + (rows ? F32 : a) * n * oc + F32 * (bias ? oc : 0.0) + after,
                          .tensor16 = act != NEOX_ELEM_F32, .after_bytes = after, .after_calls = rows};
}

// Each gradient asked for (non-NULL) is one product: dinp = dout · weight, dweight = doutᵀ · inp
// (2·N·IC·OC each); dbias sums dout's rows (bytes only). The weight gradients are fp32. With dweight,
// the device makes dbias in the weight product's epilogue (cuBLASLt's BGRADB, kernels/cuda/linear.cu's
// weight_grads), reading dout once; asked alone, with 16-bit operands beside a product, it is a pass of
// its own after it (column sums).
neox_op_cost neox_op_cost_linear_backward(void *dinp, float *dweight, float *dbias, const void *dout, int ldo,
                                          const void *inp, const void *weight, int N, int IC, int OC, int accumulate,
                                          neox_elem act) {
    (void)dout, (void)ldo, (void)inp, (void)weight;
    double n = N, ic = IC, oc = OC, a = elem_bytes(act), flops = 0.0, bytes = 0.0, pass = 0.0;
    if (dinp) flops += 2.0 * n * ic * oc, bytes += a * (n * oc + ic * oc + n * ic * (accumulate ? 2.0 : 1.0));
    if (dweight) flops += 2.0 * n * ic * oc, bytes += a * (n * oc + n * ic) + F32 * 2.0 * ic * oc;
    if (dbias) bytes += (dweight ? 0.0 : a * n * oc) + F32 * 2.0 * oc;  // (with dweight: dout read once)
    if (dbias && !dweight && act != NEOX_ELEM_F32 && flops > 0.0) pass = a * n * oc + F32 * 2.0 * oc;
    return (neox_op_cost){.flops = flops, .bytes = bytes, .tensor16 = act != NEOX_ELEM_F32, .after_bytes = pass,
                          .after_calls = pass > 0.0};
}

// C (M, N) = alpha·op(A)·op(B) + beta·C: 2·M·N·K on operands of type ab; C is read too when beta != 0.
neox_op_cost neox_op_cost_gemm_ex(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                                  const void *B, int ldb, neox_elem ab, float beta, void *C, int ldc, neox_elem c) {
    (void)trans_a, (void)trans_b, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
    double m = M, n = N, k = K;
    return (neox_op_cost){.flops = 2.0 * m * n * k,
                          .bytes = elem_bytes(ab) * (m * k + k * n) + elem_bytes(c) * m * n * (beta != 0.0f ? 2.0 : 1.0),
                          .tensor16 = ab != NEOX_ELEM_F32};
}

// ---- embeddings -------------------------------------------------------------------------------
neox_op_cost neox_op_cost_embedding_forward(void *out, const int *ids, const float *wte, const float *wpe, int B,
                                            int T, int C, neox_elem act) {
    (void)out, (void)ids, (void)wte;
    double rows = (double)B * T, c = C;
    return bytes_only(IDX * rows + F32 * (rows * c + (wpe ? (double)T * c : 0.0)) + elem_bytes(act) * rows * c);
}

neox_op_cost neox_op_cost_embedding_rows(void *out, const int *ids, const float *rows, int v0, int v1, int N, int C,
                                         neox_elem act) {
    (void)out, (void)ids, (void)rows, (void)v0, (void)v1;
    return bytes_only(IDX * N + (F32 + elem_bytes(act)) * (double)N * C);
}

// A scatter-add: each row of dout adds into its token's row of dwte (read and written).
neox_op_cost neox_op_cost_embedding_backward(float *dwte, float *dwpe, const void *dout, const int *ids, int B, int T,
                                             int C, neox_elem act) {
    (void)dwte, (void)dout, (void)ids;
    double rows = (double)B * T, c = C;
    return bytes_only(IDX * rows + elem_bytes(act) * rows * c + F32 * (2.0 * rows * c + (dwpe ? 2.0 * (double)T * c : 0.0)));
}

// ---- norms: the rows read and written, the per-row statistics, the weights ---------------------
neox_op_cost neox_op_cost_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                            const float *weight, const float *bias, int N, int C, float eps,
                                            neox_elem act) {
    (void)out, (void)mean, (void)rstd, (void)inp, (void)eps;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 2.0 * n * c + F32 * (2.0 * n + (weight ? c : 0.0) + (bias ? c : 0.0)));
}

// dsum (the residual gradient's column sums) sums the rows the pass writes: no row bytes of its own.
neox_op_cost neox_op_cost_layernorm_backward(void *dinp, float *dweight, float *dbias, float *dsum, const void *dout,
                                             const void *inp, const float *weight, const float *mean,
                                             const float *rstd, int N, int C, neox_elem act) {
    (void)dinp, (void)dout, (void)inp, (void)weight, (void)mean, (void)rstd;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 3.0 * n * c + F32 * (2.0 * n + c + (dweight ? 2.0 * c : 0.0) +
                                                              (dbias ? 2.0 * c : 0.0) + (dsum ? 2.0 * c : 0.0)));
}

neox_op_cost neox_op_cost_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N, int C,
                                          float eps, neox_elem act) {
    (void)out, (void)rstd, (void)inp, (void)eps;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 2.0 * n * c + F32 * (n + (weight ? c : 0.0)));
}

neox_op_cost neox_op_cost_rmsnorm_backward(void *dinp, float *dweight, float *dsum, const void *dout, const void *inp,
                                           const float *weight, const float *rstd, int N, int C, neox_elem act) {
    (void)dinp, (void)dout, (void)inp, (void)weight, (void)rstd;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 3.0 * n * c +
                      F32 * (n + c + (dweight ? 2.0 * c : 0.0) + (dsum ? 2.0 * c : 0.0)));
}

neox_op_cost neox_op_cost_scalenorm_forward(void *out, float *rnorm, const void *inp, const float *g, int N, int C,
                                            float eps, neox_elem act) {
    (void)out, (void)rnorm, (void)inp, (void)g, (void)eps;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 2.0 * n * c + F32 * (n + 1.0));
}

neox_op_cost neox_op_cost_scalenorm_backward(void *dinp, float *dg, const void *dout, const void *inp,
                                             const float *g, const float *rnorm, int N, int C, float eps,
                                             neox_elem act) {
    (void)dinp, (void)dg, (void)dout, (void)inp, (void)g, (void)rnorm, (void)eps;
    double n = N, c = C;
    return bytes_only(elem_bytes(act) * 3.0 * n * c + F32 * (n + 3.0));
}

// Per-head norms (qk_norm) over (B, H, T, HS) with G groups of weights.
neox_op_cost neox_op_cost_head_norm_forward(void *out, float *mean, float *rstd, const void *inp,
                                            const float *weight, const float *bias, int B, int H, int T, int HS,
                                            int G, float eps, neox_elem act) {
    (void)out, (void)mean, (void)rstd, (void)inp, (void)eps;
    double rows = (double)B * H * T, w = (double)G * HS;
    return bytes_only(elem_bytes(act) * 2.0 * rows * HS + F32 * (2.0 * rows + (weight ? w : 0.0) + (bias ? w : 0.0)));
}

neox_op_cost neox_op_cost_head_norm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                             const void *inp, const float *weight, const float *mean,
                                             const float *rstd, int B, int H, int T, int HS, int G, neox_elem act) {
    (void)dinp, (void)dout, (void)inp, (void)mean, (void)rstd;
    double rows = (double)B * H * T, w = (double)G * HS;
    return bytes_only(elem_bytes(act) * 3.0 * rows * HS +
                      F32 * (2.0 * rows + (weight ? w : 0.0) + (dweight ? 2.0 * w : 0.0) + (dbias ? 2.0 * w : 0.0)));
}

// a and b read, sum written, and (out not NULL) the normed rows written with their statistics; the
// bias of b is one row, read once.
neox_op_cost neox_op_cost_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a,
                                                const void *b, const float *b_bias, const float *weight,
                                                const float *bias, int N, int C, float eps, neox_elem act) {
    (void)sum, (void)mean, (void)rstd, (void)a, (void)b, (void)eps;
    double n = N, c = C, bb = b_bias ? F32 * c : 0.0;
    if (!out) return bytes_only(elem_bytes(act) * 3.0 * n * c + bb);
    return bytes_only(elem_bytes(act) * 4.0 * n * c + bb + F32 * (2.0 * n + (weight ? c : 0.0) + (bias ? c : 0.0)));
}

neox_op_cost neox_op_cost_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b,
                                              const float *b_bias, const float *weight, int N, int C, float eps,
                                              neox_elem act) {
    (void)sum, (void)rstd, (void)a, (void)b, (void)eps;
    double n = N, c = C, bb = b_bias ? F32 * c : 0.0;
    if (!out) return bytes_only(elem_bytes(act) * 3.0 * n * c + bb);
    return bytes_only(elem_bytes(act) * 4.0 * n * c + bb + F32 * (n + (weight ? c : 0.0)));
}

// ---- Mixture of Experts: row gathers and the weighted combination --------------------------------
neox_op_cost neox_op_cost_gather_rows(void *out, const void *inp, const int *idx, int n, int C, neox_elem act) {
    (void)out, (void)inp, (void)idx;
    return bytes_only(IDX * n + elem_bytes(act) * 2.0 * (double)n * C);
}

neox_op_cost neox_op_cost_moe_combine(void *out, const void *rows, const int *slot, const float *weight, int N, int K,
                                      int C, neox_elem act) {
    (void)out, (void)rows, (void)slot, (void)weight;
    double nk = (double)N * K;
    return bytes_only(IDX * nk + F32 * nk + elem_bytes(act) * (nk * C + (double)N * C));
}

neox_op_cost neox_op_cost_moe_combine_backward(void *drows, float *dweight, const void *dout, const void *rows,
                                               const int *slot, const float *weight, int N, int K, int C,
                                               neox_elem act) {
    (void)drows, (void)dweight, (void)dout, (void)rows, (void)slot, (void)weight;
    double nk = (double)N * K;
    return bytes_only(IDX * nk + F32 * 2.0 * nk + elem_bytes(act) * ((double)N * C + 2.0 * nk * C));
}

// ---- attention --------------------------------------------------------------------------------
// Every element of qkv is read once and written once to q, k or v (and back, for the gradients).
neox_op_cost neox_op_cost_qkv_split(void *q, void *k, void *v, const void *qkv, int B, int T, int NH, int NKV,
                                    int HS, int interleaved, neox_elem act) {
    (void)q, (void)k, (void)v, (void)qkv, (void)interleaved;
    return bytes_only(elem_bytes(act) * 2.0 * (double)B * T * (NH + 2.0 * NKV) * HS);
}

neox_op_cost neox_op_cost_qkv_merge(void *dqkv, const void *dq, const void *dk, const void *dv, int B, int T,
                                    int NH, int NKV, int HS, int interleaved, neox_elem act) {
    (void)dqkv, (void)dq, (void)dk, (void)dv, (void)interleaved;
    return bytes_only(elem_bytes(act) * 2.0 * (double)B * T * (NH + 2.0 * NKV) * HS);
}

neox_op_cost neox_op_cost_rotary_tables(float *cos, float *sin, int T, int R, double base,
                                        neox_rope_scaling scaling) {
    (void)cos, (void)sin, (void)base, (void)scaling;
    return bytes_only(F32 * (double)T * R);
}

// The first R dims of each head are read and written, wherever its view puts them; the tables are read.
neox_op_cost neox_op_cost_rotary_apply(void *x, const float *cos, const float *sin, int B, int H, int T, int HS, int R,
                                       int inverse, neox_elem act, neox_head_strides xs) {
    (void)x, (void)cos, (void)sin, (void)HS, (void)inverse, (void)xs;
    return bytes_only(elem_bytes(act) * 2.0 * (double)B * H * T * R + F32 * (double)T * R);
}

// Forward: two products per (query, key) pair (q·k, then p·v), 2·HS FLOPs each; it reads q, k, v
// (split or in the fused buffer: the same bytes) and writes out and the log-sum-exp. The products run
// on 16-bit operands when opts.operands says so.
neox_op_cost neox_op_cost_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                            int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    (void)out, (void)lse, (void)q, (void)k, (void)v;
    double heads = (double)B * NH, pairs = query_pairs(T, &o), Tq = neox_attention_query_rows(&o, T);
    double qo = heads * Tq * HS, kv = (double)B * NKV * T * HS;
    return (neox_op_cost){.flops = 4.0 * heads * pairs * HS,
                          .bytes = elem_bytes(act) * (2.0 * qo + 2.0 * kv) + F32 * heads * Tq,
                          .tensor16 = o.operands != NEOX_ELEM_F32,
                          .cudnn = !neox_attention_own_reason(&o)};
}

// Generation's attention over the cache: S queries at positions pos0.., the two forward products.
neox_op_cost neox_op_cost_attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int S,
                                           int pos0, int NH, int NKV, int HS, int maxT, neox_attention_opts o) {
    (void)out, (void)q, (void)kcache, (void)vcache, (void)maxT;
    double keys = (double)pos0 + S;
    return (neox_op_cost){.flops = 4.0 * NH * causal_pairs(S, pos0, o.window) * HS,
                          .bytes = F32 * (2.0 * (double)NH * S * HS + 2.0 * NKV * keys * HS)};
}

// Backward, flash style: five products per pair (the scores recomputed, dv = pᵀ·dout, dp = dout·vᵀ,
// dq = ds·k, dk = dsᵀ·q), 2·HS FLOPs each; it reads dout, q, k, v, out and lse and writes dq, dk, dv.
neox_op_cost neox_op_cost_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                             const void *k, const void *v, const void *out, const float *lse, int B,
                                             int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
    double heads = (double)B * NH, pairs = query_pairs(T, &o), Tq = neox_attention_query_rows(&o, T);
    double qo = heads * Tq * HS, kv = (double)B * NKV * T * HS;
    return (neox_op_cost){.flops = 10.0 * heads * pairs * HS,
                          .bytes = elem_bytes(act) * (4.0 * qo + 4.0 * kv) + F32 * heads * Tq,
                          .tensor16 = o.operands != NEOX_ELEM_F32,
                          .cudnn = !neox_attention_own_reason(&o)};
}

// A linear layer with its activation: the product's FLOPs on operands stored as act. Where the route
// (kernels/linear_act_route.c) fuses fn into the product's epilogue, pre and out are both written by
// it and nothing is read back; otherwise the activation is its own pass after the product, reading
// pre again and writing out.
neox_op_cost neox_op_cost_linear_act_forward(void *out, void *pre, const void *inp, const void *weight,
                                             const float *bias, int N, int IC, int OC, neox_act_fn fn, neox_elem act) {
    (void)out, (void)pre, (void)inp, (void)weight;
    double n = N, ic = IC, oc = OC, a = elem_bytes(act), product = a * (n * ic + oc * ic + n * oc) + F32 * (bias ? oc : 0.0);
    int fused = neox_linear_act_route(fn, act) != NEOX_EPILOGUE_NONE;
    double after = fused ? 0.0 : a * 2.0 * n * oc;
    return (neox_op_cost){.flops = 2.0 * n * ic * oc, .bytes = product + (fused ? a * n * oc : after),
                          .tensor16 = act != NEOX_ELEM_F32, .after_bytes = after, .after_calls = fused ? 0 : 1};
}

// Its backward: the input gradient's product. Fused (either route), the epilogue reads pre and writes
// dpre once; cuBLASLt's DGELU_BGRAD sums the bias gradient in the same pass (written to a small
// buffer, then added: a pass over IC floats), cuDNN's graph leaves it to a column-sum pass over dpre.
// Otherwise the product writes the activation's gradient, the activation's backward reads it and pre
// and writes dpre, and the column sums read dpre again.
neox_op_cost neox_op_cost_linear_act_backward(void *dpre, float *dbias, const void *dout, const void *weight,
                                              const void *pre, int N, int IC, int OC, neox_act_fn fn, neox_elem act) {
    (void)dpre, (void)dout, (void)weight, (void)pre;
    neox_epilogue_route route = neox_linear_act_route(fn, act);
    double n = N, ic = IC, oc = OC, a = elem_bytes(act);
    double product = a * (n * oc + ic * oc + (route == NEOX_EPILOGUE_NONE ? 1.0 : 2.0) * n * ic);
    double after = 0.0, column_sums = a * n * ic + F32 * 2.0 * ic;
    int calls = 0;
    if (route == NEOX_EPILOGUE_NONE) after += a * 3.0 * n * ic, calls++;
    if (dbias && route == NEOX_EPILOGUE_CUBLASLT) product += F32 * ic, after += F32 * 3.0 * ic, calls++;
    else if (dbias) after += column_sums, calls++;
    return (neox_op_cost){.flops = 2.0 * n * ic * oc, .bytes = product + after, .tensor16 = act != NEOX_ELEM_F32,
                          .after_bytes = after, .after_calls = calls};
}

// ---- elementwise ------------------------------------------------------------------------------
neox_op_cost neox_op_cost_activation_forward(void *out, const void *inp, size_t n, neox_act_fn fn, neox_elem act) {
    (void)out, (void)inp, (void)fn;
    return bytes_only(elem_bytes(act) * 2.0 * (double)n);
}

neox_op_cost neox_op_cost_activation_backward(void *dinp, const void *dout, const void *inp, size_t n,
                                              neox_act_fn fn, neox_elem act) {
    (void)dinp, (void)dout, (void)inp, (void)fn;
    return bytes_only(elem_bytes(act) * 3.0 * (double)n);
}

// Gated: inp (N, 2F) -> out (N, F).
neox_op_cost neox_op_cost_gated_forward(void *out, const void *inp, int N, int F, neox_act_fn fn, neox_elem act) {
    (void)out, (void)inp, (void)fn;
    return bytes_only(elem_bytes(act) * 3.0 * (double)N * F);
}

neox_op_cost neox_op_cost_gated_backward(void *dinp, const void *dout, const void *inp, int N, int F,
                                         neox_act_fn fn, neox_elem act) {
    (void)dinp, (void)dout, (void)inp, (void)fn;
    return bytes_only(elem_bytes(act) * 5.0 * (double)N * F);
}

neox_op_cost neox_op_cost_add(void *out, const void *a, const void *b, size_t n, neox_elem act) {
    (void)out, (void)a, (void)b;
    return bytes_only(elem_bytes(act) * 3.0 * (double)n);
}

neox_op_cost neox_op_cost_add_inplace(float *acc, const float *x, size_t n) {
    (void)acc, (void)x;
    return bytes_only(F32 * 3.0 * (double)n);
}

neox_op_cost neox_op_cost_add_bias(void *x, const float *bias, int N, int C, neox_elem act) {
    (void)x, (void)bias;
    return bytes_only(elem_bytes(act) * 2.0 * (double)N * C + F32 * C);
}

neox_op_cost neox_op_cost_dropout(void *out, const void *inp, size_t n, float p, unsigned long long seed,
                                  unsigned long long offset, const unsigned long long *row0_at,
                                  unsigned long long row_elems, neox_elem act) {
    (void)out, (void)inp, (void)p, (void)seed, (void)offset, (void)row0_at, (void)row_elems;
    return bytes_only(elem_bytes(act) * 2.0 * (double)n);
}

neox_op_cost neox_op_cost_jitter(void *out, const void *inp, size_t n, float eps, unsigned long long seed,
                                 neox_elem act) {
    (void)out, (void)inp, (void)eps, (void)seed;
    return bytes_only(elem_bytes(act) * 2.0 * (double)n);
}

neox_op_cost neox_op_cost_scale(float *x, size_t n, float s) {
    (void)x, (void)s;
    return bytes_only(F32 * 2.0 * (double)n);
}

// ---- the loss: passes over the logits (N, V) -----------------------------------------------------
neox_op_cost neox_op_cost_cross_entropy_forward(float *losses, float *lse, const void *logits, const int *targets,
                                                int N, int V, neox_elem act) {
    (void)losses, (void)lse, (void)logits, (void)targets;
    return bytes_only(elem_bytes(act) * (double)N * V + F32 * 2.0 * N + IDX * N);
}

neox_op_cost neox_op_cost_cross_entropy_row_max(float *mx, const void *logits, int N, int V, neox_elem act) {
    (void)mx, (void)logits;
    return bytes_only(elem_bytes(act) * (double)N * V + F32 * N);
}

neox_op_cost neox_op_cost_cross_entropy_row_sumexp(double *sum, const void *logits, const float *mx, int N, int V,
                                                   neox_elem act) {
    (void)sum, (void)logits, (void)mx;
    return bytes_only(elem_bytes(act) * (double)N * V + F32 * N + 8.0 * N);
}

neox_op_cost neox_op_cost_cross_entropy_target_logit(double *out, const void *logits, const int *targets, int N,
                                                     int V, neox_elem act) {
    (void)out, (void)logits, (void)targets, (void)V;
    return bytes_only(IDX * N + elem_bytes(act) * N + 8.0 * N);
}

neox_op_cost neox_op_cost_cross_entropy_loss(float *lse, double *loss, const float *mx, const double *stats,
                                             const float *mask, int N) {
    (void)lse, (void)loss, (void)stats;
    return bytes_only(F32 * (2.0 * N + (mask ? N : 0)) + (mx ? 8.0 * 2.0 * N : 0.0) + 8.0);
}

neox_op_cost neox_op_cost_cross_entropy_backward(void *dlogits, const void *logits, const float *lse,
                                                 const int *targets, const float *weight, float scale,
                                                 const float *scale_at, int N, int V, neox_elem act) {
    (void)dlogits, (void)logits, (void)lse, (void)targets, (void)scale, (void)scale_at;
    return bytes_only(elem_bytes(act) * 2.0 * N * V + F32 * (N + (weight ? N : 0)) + IDX * N);
}

// One read and one write of the logits at their storage precision; the whole-vocabulary form also
// writes the three statistics, the vocab-parallel second phase reads two.
neox_op_cost neox_op_cost_cross_entropy_fused(void *logits, neox_elem logits_elem, float *mx, double *sum,
                                              double *target_logit, const int *targets, const float *weight,
                                              float scale, const float *scale_at, int N, int V, int stats_given) {
    (void)logits, (void)mx, (void)sum, (void)target_logit, (void)targets, (void)scale, (void)scale_at;
    double n = N, stats = stats_given ? F32 * n + 8.0 * n : F32 * n + 2.0 * 8.0 * n;
    return bytes_only(elem_bytes(logits_elem) * 2.0 * n * V + stats + (weight ? F32 * n : 0.0) + IDX * n);
}

// ---- the optimizer: passes over parameters, gradients and their state ---------------------------
neox_op_cost neox_op_cost_sum_squares(const float *x, size_t n) {
    (void)x;
    return bytes_only(F32 * (double)n);
}

neox_op_cost neox_op_cost_sum_squares_segments(const float *x, const neox_segment *segs, int nseg) {
    (void)x;
    return bytes_only(F32 * segments_floats(segs, nseg));
}

neox_op_cost neox_op_cost_sum_squares_segments_into(double *sumsq, const float *x, const neox_segment *segs, int nseg) {
    (void)sumsq, (void)x;
    return bytes_only(F32 * segments_floats(segs, nseg) + 8.0);
}

neox_op_cost neox_op_cost_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale,
                                       const double *loss_scale_at, double clip_grad) {
    (void)x, (void)sumsq, (void)loss_scale, (void)loss_scale_at, (void)clip_grad;
    return bytes_only(F32 * 2.0 * (double)n + 8.0);
}

neox_op_cost neox_op_cost_loss_guard(double *guard, const double *sumsq, const double *loss_sums, int n) {
    (void)guard, (void)sumsq, (void)loss_sums;
    return bytes_only(8.0 * (2.0 * n + 2.0));
}

// AdamW reads param, grad, m, v and writes param, m, v: 7 floats per parameter.
neox_op_cost neox_op_cost_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, long step) {
    (void)param, (void)grad, (void)m, (void)v, (void)lr, (void)beta1, (void)beta2, (void)eps, (void)weight_decay,
        (void)step;
    return bytes_only(F32 * 7.0 * (double)n);
}

neox_op_cost neox_op_cost_adamw_segments(float *param, const float *grad, float *m, float *v, const neox_segment *segs,
                                         int nseg, const neox_step_scalars *sc, float beta1, float beta2, float eps,
                                         float grad_scale, const double *guard) {
    (void)param, (void)grad, (void)m, (void)v, (void)sc, (void)beta1, (void)beta2, (void)eps, (void)grad_scale;
    return bytes_only(F32 * 7.0 * segments_floats(segs, nseg) + (guard ? 8.0 : 0.0));
}

// SGD with momentum reads param, grad, buf and writes param, buf.
neox_op_cost neox_op_cost_sgd_segments(float *param, const float *grad, float *buf, const neox_segment *segs, int nseg,
                                       const neox_step_scalars *sc, float momentum, const double *guard) {
    (void)param, (void)grad, (void)buf, (void)sc, (void)momentum;
    return bytes_only(F32 * 5.0 * segments_floats(segs, nseg) + (guard ? 8.0 : 0.0));
}

// Lion reads param, grad, m and writes param, m.
neox_op_cost neox_op_cost_lion_segments(float *param, const float *grad, float *m, const neox_segment *segs, int nseg,
                                        const neox_step_scalars *sc, float beta1, float beta2, const double *guard) {
    (void)param, (void)grad, (void)m, (void)sc, (void)beta1, (void)beta2;
    return bytes_only(F32 * 5.0 * segments_floats(segs, nseg) + (guard ? 8.0 : 0.0));
}

// MADGRAD reads param, grad, sum_sq, s (and x0 with momentum) and writes param, sum_sq, s.
neox_op_cost neox_op_cost_madgrad_segments(float *param, const float *grad, float *sum_sq, float *s, float *x0,
                                           const neox_segment *segs, int nseg, float lr_eps, float lamb,
                                           float momentum, float eps, int first) {
    (void)param, (void)grad, (void)sum_sq, (void)s, (void)x0, (void)lr_eps, (void)lamb, (void)eps;
    double per = 7.0 + (momentum != 0.0f ? 1.0 + first : 0.0);
    return bytes_only(F32 * per * segments_floats(segs, nseg));
}

// SM3 reads param, grad (twice for a matrix: its column maxima) and m, writes param and m (with
// momentum), and reads the accumulators (cached: counted once per segment's share, not per element).
neox_op_cost neox_op_cost_sm3_segments(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                                       const neox_sm3_segment *segs, int nseg, float lr, float momentum, float beta,
                                       float eps) {
    (void)param, (void)grad, (void)m, (void)acc, (void)acc_next, (void)lr, (void)beta, (void)eps;
    double floats = 0.0;
    for (int s = 0; s < nseg; s++)
        floats += (double)(segs[s].end - segs[s].begin) * (3.0 + (momentum > 0.0f ? 2.0 : 0.0) +
                                                           (segs[s].col_acc != NEOX_SM3_NO_COLS ? 1.0 : 0.0));
    return bytes_only(F32 * floats);
}

neox_op_cost neox_op_cost_adam_moments(float *m, float *v, const float *grad, size_t n, float beta1, float beta2) {
    (void)m, (void)grad, (void)beta1, (void)beta2;
    return bytes_only(F32 * (v ? 5.0 : 3.0) * (double)n);
}

neox_op_cost neox_op_cost_onebit_adam_apply(float *param, const float *m, const float *v, size_t n, float lr, float eps,
                                            float weight_decay) {
    (void)param, (void)m, (void)v, (void)lr, (void)eps, (void)weight_decay;
    return bytes_only(F32 * 4.0 * (double)n);
}

// ---- casts: 4 bytes read and 2 written per element, or the reverse ------------------------------
neox_op_cost neox_op_cost_cast_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
    (void)out, (void)inp;
    return bytes_only(6.0 * (double)n);
}

neox_op_cost neox_op_cost_cast_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
    (void)out, (void)inp;
    return bytes_only(6.0 * (double)n);
}

neox_op_cost neox_op_cost_cast_f32_to_f16(uint16_t *out, const float *inp, size_t n) {
    (void)out, (void)inp;
    return bytes_only(6.0 * (double)n);
}

neox_op_cost neox_op_cost_cast_f16_to_f32(float *out, const uint16_t *inp, size_t n) {
    (void)out, (void)inp;
    return bytes_only(6.0 * (double)n);
}

// ---- FP8: the cast reads 4 bytes and writes 1 per element; the product's operands are 1 byte each
// (counted with the 16-bit products' tensor-core peak: the FP8 peak is twice that, so an estimate errs
// on the slow side); the scale update reads and writes each tensor's history ----------------------
neox_op_cost neox_op_cost_fp8_cast(uint8_t *out, float *amax, const float *inp, size_t n, const float *scale,
                                   neox_fp8_format fmt) {
    (void)out, (void)amax, (void)inp, (void)scale, (void)fmt;
    return bytes_only(5.0 * (double)n);
}

neox_op_cost neox_op_cost_gemm_fp8(int trans_a, int trans_b, int M, int N, int K, const uint8_t *A, int lda,
                                   neox_fp8_format fa, const float *a_scale_inv, const uint8_t *B, int ldb,
                                   neox_fp8_format fb, const float *b_scale_inv, float beta, float *C, int ldc) {
    (void)trans_a, (void)trans_b, (void)A, (void)lda, (void)fa, (void)a_scale_inv, (void)B, (void)ldb, (void)fb;
    (void)b_scale_inv, (void)C, (void)ldc;
    double m = M, n = N, k = K;
    return (neox_op_cost){.flops = 2.0 * m * n * k, .bytes = m * k + k * n + F32 * m * n * (beta != 0.0f ? 2.0 : 1.0),
                          .tensor16 = 1};
}

neox_op_cost neox_op_cost_fp8_update_scales(float *history, float *scale, float *scale_inv, int len, int ld, int n,
                                            neox_fp8_format fmt, int margin, int algo_max) {
    (void)history, (void)scale, (void)scale_inv, (void)ld, (void)fmt, (void)margin, (void)algo_max;
    return bytes_only(F32 * (2.0 * len + 3.0) * n);
}

// ---- compressed and sparse gradient exchanges: bytes only ----------------------------------------
// 1-bit compression: error read and written, x read, error read again for the norm, signs (1 bit) and
// the scales written.
neox_op_cost neox_op_cost_onebit_compress(uint8_t *signs, size_t sign_stride, uint8_t *scale, size_t scale_stride,
                                          float *error, const float *x, size_t n, size_t padded, int chunks) {
    (void)signs, (void)sign_stride, (void)scale, (void)scale_stride, (void)error, (void)x;
    return bytes_only(F32 * (3.0 * (double)padded + (double)n) + (double)padded / 8.0 + 4.0 * chunks);
}

// p chunks' signs and scales read, n floats written.
neox_op_cost neox_op_cost_onebit_average(float *out, const uint8_t *blocks, size_t block, size_t signs_at,
                                         size_t scale_at, size_t n, int p) {
    (void)out, (void)blocks, (void)block, (void)signs_at, (void)scale_at;
    return bytes_only(F32 * (double)n + (double)p * ((double)n / 8.0 + 4.0));
}

neox_op_cost neox_op_cost_onebit_decompress(float *out, const uint8_t *blocks, size_t block, size_t signs_at,
                                            size_t scale_at, size_t chunk, size_t n) {
    (void)out, (void)blocks, (void)block, (void)signs_at, (void)scale_at;
    return bytes_only(F32 * (double)n + (double)n / 8.0 + 4.0 * (double)((n + chunk - 1) / (chunk ? chunk : 1)));
}

neox_op_cost neox_op_cost_add_scaled(float *acc, const float *x, size_t n, float s) {
    (void)acc, (void)x, (void)s;
    return bytes_only(F32 * 3.0 * (double)n);
}

// Column i is read i + 2 times (its projections, its norm) and written i + 1 times.
neox_op_cost neox_op_cost_orthonormalise_columns(float *P, int n, int r) {
    (void)P;
    return bytes_only(F32 * (double)n * (double)r * ((double)r + 1.0) * 1.5);
}

neox_op_cost neox_op_cost_copy_matrix(float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    (void)dst, (void)ldd, (void)src, (void)lds;
    return bytes_only(F32 * 2.0 * (double)rows * cols);
}

// The named rows zeroed, then each of the n rows read and its destination read and written.
neox_op_cost neox_op_cost_rows_sum_by_id(float *grad, const float *rows, const int *ids, int n, int C) {
    (void)grad, (void)rows, (void)ids;
    return bytes_only(F32 * 4.0 * (double)n * C + IDX * 2.0 * n);
}

neox_op_cost neox_op_cost_scale_rows(float *x, const int *ids, int n, int C, float s) {
    (void)x, (void)ids, (void)s;
    return bytes_only(F32 * 2.0 * (double)n * C + IDX * n);
}

// ---- names and classes ------------------------------------------------------------------------
#define OP_NAME(ret, name, params, args) #name,
static const char *const op_names[NEOX_OP_COUNT] = {NEOX_BACKEND_OPS(OP_NAME)};

const char *neox_op_name(neox_op_id op) { return op >= 0 && op < NEOX_OP_COUNT ? op_names[op] : "?"; }

static const char *const class_names[NEOX_CLASS_COUNT] = {"gemm", "attention", "norm", "elementwise",
                                                          "embedding", "loss", "optimizer", "cast"};

const char *neox_op_class_name(neox_op_class c) { return c >= 0 && c < NEOX_CLASS_COUNT ? class_names[c] : "?"; }

neox_op_class neox_op_class_of(neox_op_id op) {
    switch (op) {
    case NEOX_OP_linear_forward: case NEOX_OP_linear_backward: case NEOX_OP_gemm_ex: case NEOX_OP_gemm_fp8:
    case NEOX_OP_linear_act_forward: case NEOX_OP_linear_act_backward:
        return NEOX_CLASS_GEMM;
    case NEOX_OP_attention_forward: case NEOX_OP_attention_cached: case NEOX_OP_attention_backward:
        return NEOX_CLASS_ATTENTION;
    case NEOX_OP_layernorm_forward: case NEOX_OP_layernorm_backward: case NEOX_OP_rmsnorm_forward:
    case NEOX_OP_rmsnorm_backward: case NEOX_OP_scalenorm_forward: case NEOX_OP_scalenorm_backward:
    case NEOX_OP_head_norm_forward: case NEOX_OP_head_norm_backward: case NEOX_OP_add_layernorm_forward:
    case NEOX_OP_add_rmsnorm_forward:
        return NEOX_CLASS_NORM;
    case NEOX_OP_embedding_forward: case NEOX_OP_embedding_rows: case NEOX_OP_embedding_backward:
        return NEOX_CLASS_EMBEDDING;
    case NEOX_OP_cross_entropy_forward: case NEOX_OP_cross_entropy_row_max: case NEOX_OP_cross_entropy_row_sumexp:
    case NEOX_OP_cross_entropy_target_logit: case NEOX_OP_cross_entropy_loss: case NEOX_OP_cross_entropy_backward:
    case NEOX_OP_cross_entropy_fused:
        return NEOX_CLASS_LOSS;
    case NEOX_OP_sum_squares: case NEOX_OP_sum_squares_segments: case NEOX_OP_sum_squares_segments_into:
    case NEOX_OP_clip_by_norm: case NEOX_OP_loss_guard: case NEOX_OP_adamw: case NEOX_OP_adamw_segments: case NEOX_OP_sgd_segments:
    case NEOX_OP_adam_moments: case NEOX_OP_onebit_adam_apply: case NEOX_OP_lion_segments:
    case NEOX_OP_madgrad_segments: case NEOX_OP_sm3_segments:
        return NEOX_CLASS_OPTIMIZER;
    case NEOX_OP_cast_f32_to_bf16: case NEOX_OP_cast_bf16_to_f32: case NEOX_OP_cast_f32_to_f16:
    case NEOX_OP_cast_f16_to_f32: case NEOX_OP_fp8_cast:
        return NEOX_CLASS_CAST;
    default:
        return NEOX_CLASS_ELEMENTWISE;
    }
}
