// model_internal.h: the activation plan shared by lib/model/forward.c and lib/model/backward.c,
// and this rank's sizes under tensor and pipeline parallelism.
#ifndef NEOX_MODEL_INTERNAL_H
#define NEOX_MODEL_INTERNAL_H

#include "kernels/backend.h"
#include "model.h"
#include "parallel.h"

// Element `elems` of an activation tensor p (or of its gradient) stored as the model's act_elem:
// the one way to offset into them, since `float *` there means "pointer to storage", not to floats.
// The statistics beside them (norm mean/rstd, lse, ce_max, ce_stats, the loss mask) stay fp32 and
// are offset as floats.
static inline float *neox_act_at(const neox_model *m, const void *p, size_t elems) {
    return (float *)((char *)(uintptr_t)p + neox_model_act_bytes(m, elems));
}

// The sizes of this rank's shard: local heads, kv heads, MLP width and vocabulary columns
// (starting at global id v0), and the stage's layers [l0, l0 + L).
typedef struct neox_shard {
    int NH, NKV, F, V, v0, L, l0;
} neox_shard;

static inline neox_shard neox_model_shard(const neox_model_desc *d) {
    int tp = d->tp_size > 0 ? d->tp_size : 1;
    neox_shard s = {d->num_heads / tp, d->num_kv_heads / tp, d->ffn_size / tp, d->vocab_size / tp, 0,
                    d->layer_end - d->layer_begin, d->layer_begin};
    s.v0 = s.V * d->tp_rank;
    return s;
}

// The output layer's width on this rank: the vocabulary shard, or 1 for a value head.
static inline int neox_model_head_cols(const neox_model_desc *d) { return d->value_head ? 1 : neox_model_shard(d).V; }
// neox_model.loss_ranks, 0 counting as 1.
static inline int neox_model_loss_ranks(const neox_model *m) { return m->loss_ranks > 1 ? m->loss_ranks : 1; }

// What one layer's backward needs from its forward. With activation checkpointing every layer
// points at the same single set and its forward is recomputed from the layer input in backward.
// Sizes are the shard's: NH, NKV local heads, F the local MLP width.
typedef struct neox_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd;  // (N, C), (N), (N)
    float *qkv;                        // (N, W), W = (NH + 2*NKV) * HS
    float *q, *k, *v;                  // (B, NH, T, HS), (B, NKV, T, HS) x 2, after rotary; NULL on the
                                       // fused route (neox_model_qkv_fused: attention reads them in qkv)
    float *qraw, *kraw;                // use_qk_layernorm: q and k before their norm (else NULL)
    float *qk_mean, *qk_rstd;          // (2, B, T, NH / G): the norm's statistics, q's then k's (mean NULL: RMS)
    float *att, *lse;                  // (N, NH*HS) attention output before the projection; (B, NH, T)
    float *mid;                        // (N, C) sequential residual after attention (NULL when parallel)
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc;                         // (N, F) or (N, 2F) before the activation
    float *act;                        // (N, F)
    struct neox_moe_bufs {             // a Mixture-of-Experts layer's (logits NULL: none)
        // NK = N * top_k token slots, rows grouped by expert: the router's logits (N, E); the slots'
        // inputs (NR, C), first projections (NR, Fe), activations (NR, Fe) and outputs (NK, C); each
        // slot's weight and row (token-major) and each row's token; the routing on the host. NR = NK,
        // or under expert parallelism the most rows this rank's experts can receive (the inputs,
        // projections and activations are then the received rows).
        float *logits, *x, *h, *act, *y, *weight;
        float *jx;                     // (N, C) the router's jittered input (moe_jitter_eps), else NULL
        int *slot, *perm;
        struct neox_moe_route *route;
    } moe;
} neox_layer_acts;
typedef struct neox_moe_bufs neox_moe_bufs;

// A Mixture-of-Experts layer's routing of one micro-batch, on the host: token t's k-th expert and
// weight at t*K + k, the scores they came from, the rows of each expert, and backward's scratch.
typedef struct neox_moe_route {
    int *expert, *slot, *perm;         // (NK): expert, row of each token slot; token of each row
    int *count;                        // (E) rows of each expert
    float *weight, *dweight;           // (NK)
    float *scores, *dlogits;           // (N, E): sigmoid or softmax of the logits (logits on arrival)
    double *balanced;                  // (N, E) Sinkhorn's scratch
    neox_moe_exchange *x;              // expert parallelism: the all-to-all's plan; NULL without
    int *from;                         // (E) its count exchange's receive buffer
    // On a device: x's row permutations (to_expert, then to_source: 2 x cap) in the backend's memory
    // for gather_rows, uploaded with each plan; allocated at the first, freed on index_be.
    int *device_index;
    const struct neox_backend *index_be;
} neox_moe_route;

// One slot: what a micro-batch keeps from its forward to its backward, plus pointers to the
// scratch every slot shares.
typedef struct neox_acts {
    float *x;                          // (L + 1, n, C) (n: neox_model_stream_rows): the residual stream entering each local layer, then the last;
                                       // with a checkpoint store (N, C): the last only (the stage's output)
    float *kept;                       // with a checkpoint store: (L, N * C / P) this rank's piece of each local
                                       // layer's input, in backend memory or (recompute_inputs_on_host) host memory
    neox_layer_acts *layers;           // L entries (local layer index)
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                     // (head_rows, V) of this rank's vocabulary (value head: (N)); dlogits after backward
    float *ce_lse, *mask;              // (N)
    int *ids, *targets;                // (N) ids and targets within this rank's vocabulary, -1 elsewhere
    float mask_sum;                    // the loss gradient's denominator: the mask's sum x loss_ranks
    // Set by a forward that ran the fused loss (forward.c): the output layer's backward is done, for
    // d(head_loss_scale * loss); the slot's backward starts from the final norm.
    int head_done;
    // The layer whose first norm the previous layer's last add has made (forward.c, next_norm), or
    // the stage's layer_end for the final norm; -1 when none.
    int norm_made;
    float head_loss_scale;
    const float *head_scale_at;  // (neox_model.head_scale_at as the forward found it)
    unsigned long long dropout_seed, dropout_row0;
    const unsigned long long *dropout_row0_at;
    // shared
    float *cos, *sin;                  // (T, R/2)
    float *alibi;                      // (NH) this rank's ALiBi slopes (pos_emb alibi), else NULL
    float *branch;                     // (n, C) output of the attention or MLP branch (n: neox_model_stream_rows)
    // Sequence parallel only (else NULL): (N, C) a norm's output all-gathered for a column-parallel
    // linear, a row-parallel linear's partial sums before their reduce-scatter, and in backward the
    // gathered output gradient and the reduce-scattered input gradients of the norms; (2C) a norm's
    // weight and bias gradients from this rank's rows, before their all-reduce over the group.
    float *seq_whole, *seq_dnorm;
    float *gather;                     // with a checkpoint store: (N, C) the input of the layer at work, whole
    float *tp_sum;                     // bf16 storage under tensor parallelism: (2 N C + n C) fp32 sums, else NULL
    int *gather_counts;                // (P) the pieces' sizes for the all-gather (host memory)
    float *ce_max;                     // (N) row maxima of the logits
    double *ce_stats;                  // (2, N) sums of exponentials, target logits
    double *ce_loss;                   // (2) the masked sum of the rows' losses, the sum of the mask
    float *dx, *dln, *dbranch;         // (n, C), (2, N, C), (n, C): dln1 then dln2, adjacent for one reduction
                                       // (dln1 holds the head's input gradient from a fused forward to its backward)
    float *dqkv, *dq, *dk, *dv, *datt, *dfc, *dact;  // (dq, dk, dv NULL on the fused route: views of dqkv)
    float *moe_dx, *moe_dh, *moe_dact, *moe_dy, *moe_dweight, *moe_dlogits;  // (NR, C), (NR, Fe) x 2, (max(NK, NR), C), (NK), (N, E)
    float *moe_swap;                   // (NR, C) expert parallelism's exchange buffer, else NULL
    // Context parallel only (else NULL), each (B, NKV, cp_T, HS) in the model's storage: the whole
    // sequence's keys and values, and in backward their gradients, in the room of dfc and dact
    // (cp_dk's room is the all-gather's rank-major stage until the attention's backward writes it,
    // cp_k's the reduce-scatter's after it: context_parallel.c); under bf16 storage also the fp32
    // room their reduce-scatter sums in (the whole and the rank's piece: cp_T + T rows).
    float *cp_k, *cp_v, *cp_dk, *cp_dv, *cp_sum;
} neox_acts;

// Dropout streams: one per (run's dropout seed, global layer, site), indexed by global coordinates
// (the row among all rows that drew masks, the position, the channel or the global head), so masks
// are regenerated in backward and are the same under every data, tensor and pipeline layout.
enum { NEOX_SITE_ATTN_PROBS, NEOX_SITE_ATTN_OUT, NEOX_SITE_MLP_OUT, NEOX_SITES_PER_LAYER };
unsigned long long neox_model_dropout_seed(const neox_model *m, int layer, int site);
// Hidden dropout of an (N, C) activation of the current slot at (layer, site): element (b, t, c)
// draws counter ((dropout_row0 + b) * T + t) * C + c. out may alias inp; backward is the same call.
void neox_model_hidden_dropout(const neox_model *m, float *out, const float *inp, int layer, int site);

// The recompute store (lib/model/recompute.c; docs/memory.md, "Activation checkpoints"): with
// checkpoint_activations and partitioned or host-kept layer inputs, each layer's input is kept as this
// rank's piece of it, P pieces of the flattened (N, C) tensor (P = tp_size when partitioned, else 1),
// and made whole again in the shared gather buffer just before the layer is recomputed. Without the
// store the inputs stay in place in x.
static inline int neox_model_recompute_store(const neox_model_desc *d) {
    return d->checkpoint_activations &&
           ((d->partition_recompute_inputs && d->tp_size > 1) || d->recompute_inputs_on_host);
}
static inline int neox_model_recompute_ways(const neox_model_desc *d) {
    return d->partition_recompute_inputs && d->tp_size > 1 ? d->tp_size : 1;
}
// Context parallelism (context_parallel.c): its ways (1 without); the attention options' query
// positions for this rank's rows; the input rows of this rank picked from whole sequences (host,
// elem bytes each, (B, cp_T) -> (B, T)); the rotary tables at this rank's positions (cos, sin
// hold T rows of R/2, made at plan time); the layer's keys and values all-gathered whole (into
// cp_k, cp_v) from this rank's, laid out by views (the fused QKV buffer's, or contiguous) and, in
// backward, the whole gradients in cp_dk, cp_dv reduce-scattered into this rank's dk, dv (laid out
// by views); the loss pair summed over the group; a plan's checks.
static inline int neox_model_cp_ways(const neox_model_desc *d) { return d->cp_size > 1 ? d->cp_size : 1; }
void neox_model_cp_query_positions(const neox_model *m, neox_attention_opts *o);
void neox_model_cp_pick_rows(const neox_model *m, void *dst, const void *src, size_t elem);
void neox_model_cp_rotary_tables(neox_model *m, float *cos, float *sin);
void neox_model_cp_gather_kv(neox_model *m, const float *k, const float *v, neox_qkv_strides views);
void neox_model_cp_scatter_dkv(neox_model *m, float *dk, float *dv, neox_qkv_strides views);
void neox_model_cp_reduce_loss(neox_model *m);
int neox_model_cp_check(const neox_model_desc *d, int T, neox_error *err);
// The keys and values a layer's attention reads (in: this rank's, laid out by *views; under context
// parallelism they become the whole sequence's, gathered, and views' k and v contiguous) and their
// count of positions; where its backward writes their gradients (the whole sequence's under context
// parallelism, for neox_model_cp_scatter_dkv).
int neox_model_attention_keys(neox_model *m, const float **k, const float **v, neox_qkv_strides *views);
void neox_model_attention_key_grads(neox_model *m, float **dk, float **dv);

// Sequence parallelism's ways: tp_size when desc.sequence_parallel, else 1.
static inline int neox_model_seq_ways(const neox_model_desc *d) {
    return d->sequence_parallel && d->tp_size > 1 ? d->tp_size : 1;
}
// The rows of the residual stream this rank holds (n = B T / ways) and the first of them among B T.
static inline int neox_model_stream_rows(const neox_model *m) { return m->B * m->T / neox_model_seq_ways(&m->desc); }
static inline int neox_model_stream_row0(const neox_model *m) {
    return neox_model_seq_ways(&m->desc) > 1 ? m->desc.tp_rank * neox_model_stream_rows(m) : 0;
}
// Sequence parallel: the whole (N, C) rows of a local (n, C) tensor in seq_whole (an all-gather over
// the tensor-parallel group), or the tensor itself without sequence parallelism.
const float *neox_model_seq_gather(neox_model *m, const float *local);
// Local layer i's input (the gather buffer under a store) and the stage's output, of the current slot.
float *neox_model_layer_input(const neox_model *m, int i);
float *neox_model_stage_out(const neox_model *m);
// Keeps this rank's piece of the gather buffer as local layer i's kept input; makes layer i's input
// whole in the gather buffer again from the pieces (an all-gather over the tensor-parallel group).
void neox_model_keep_recompute_input(neox_model *m, int i);
void neox_model_fetch_recompute_input(neox_model *m, int i);

// The elementwise function of the activation (of its gate when gated).
neox_act_fn neox_activation_function(neox_activation a);

// GPT-NeoX's Transformer Engine keys (lib/model/transformer_engine.c): LayerNormMLP's width F
// (te_layernorm_mlp), and what te_layernorm_mlp and te_mha change in or refuse of a description
// otherwise complete.
int neox_te_mlp_width(const neox_config *cfg, int hidden, int *width, neox_error *err);
int neox_te_apply(const neox_config *cfg, neox_model_desc *d, neox_error *err);

// One layer's forward (global layer index l) from x (N, C) into y (N, C), saving into the current
// slot's layer activations. y must not alias x.
void neox_model_layer_forward(neox_model *m, int l, const float *x, float *y);
// Whether the row-parallel linears' biases are added by the residual add (forward.c): not under
// hidden dropout; backward then makes their gradients in the norms' passes.
int neox_model_bias_folds(const neox_model *m);
// Mixture-of-Experts layers (lib/model/moe.c). Forward: from la->ln2 to out (N, C), routing on the
// host. Backward: from dy (N, C) to dln2 (N, C, overwritten), adding the router's and experts'
// gradients; scratch (N, C) is used. Routes are allocated for the plan and freed with it.
int neox_model_has_moe(const neox_model_desc *d);
// fp32: the products in fp32 whatever the model's precision (generation). training: Sinkhorn routing.
void neox_model_moe_forward(neox_model *m, int l, const neox_moe_bufs *b, const float *inp, float *out, int N,
                            int training, int fp32);
void neox_model_moe_backward(neox_model *m, int l, const neox_moe_bufs *b, const float *inp, const float *dy,
                             float *dln2, float *scratch);
// exchange_rows > 0 (expert parallelism): the route exchanges rows with the expert group, whose
// buffers hold that many received rows.
neox_moe_route *neox_moe_route_new(const neox_model_desc *d, int N, int exchange_rows);
void neox_moe_route_free(neox_moe_route *r);

// The output layer's logits of rows [r0, r0 + rows) (rows <= head_rows) into the slot's logits buffer.
void neox_model_head_logits(neox_model *m, int r0, int rows);
// The output layer's backward for rows [r0, r0 + rows) whose dlogits are in the slot's logits
// buffer: the chunk's share of its weight gradient, then its rows of the input gradient (dln1;
// a partial sum under tensor parallelism). backward.c; the fused forward calls it too.
void neox_model_head_chunk_backward(neox_model *m, int r0, int rows);
// Megatron's reduction of partial sums over the tensor-parallel group (nothing on one rank), and
// sequence parallelism's reduce-scatter of the whole (N, C) partial sums into this rank's nC. Both
// sum in fp32: under bf16 storage through the slot's fp32 tp_sum, rounding once after the sum.
void neox_model_tp_reduce(neox_model *m, float *x, size_t n);
void neox_model_reduce_scatter(neox_model *m, const float *whole, float *out, size_t nC);

// Frees the activation plan.
void neox_model_free_plan(neox_model *m);
// (Re)allocates the 16-bit GEMM scratch for the plan's sizes (16-bit precisions only).
void neox_model_plan_half(neox_model *m);

// Attention's options for this rank's heads of global layer `layer` in the current slot: scale,
// window, operands, ALiBi's slopes `alibi` (backend memory filled by neox_model_fill_alibi, or NULL),
// and dropout p with its seed and the global row and head coordinates of its masks.
neox_attention_opts neox_model_attention_opts(const neox_model *m, const float *alibi, float dropout, int layer);
// Whether attention reads q, k, v where the fused QKV projection wrote them (rotary in place there,
// the gradients written straight into dqkv's views), rather than in split copies (docs/model.md,
// "Attention's data flow").
int neox_model_qkv_fused(const neox_model_desc *d);
// q, k, v (or their gradients) of one layer's attention: where each one's first head starts and the
// strides that attention and rotary take (all zero for split tensors).
typedef struct neox_qkv_bufs {
    float *q, *k, *v;
    neox_qkv_strides views;
} neox_qkv_bufs;
// The views of a fused (B, T, W) buffer on the fused route, else the split tensors q, k, v.
neox_qkv_bufs neox_model_qkv_bufs(const neox_model *m, float *fused, float *q, float *k, float *v);
// Fills n slopes (backend memory) for heads head0.. of the model with pos_emb alibi.
void neox_model_fill_alibi(const neox_model_desc *d, const neox_backend *be, float *slopes, int head0, int n);

// The model's norm of N rows of inp (hidden_size wide) into out, with its statistics (mean: LayerNorm
// only; rstd: the scale each row was multiplied by), whichever `norm` the model has.
void neox_model_norm_forward(const neox_backend *be, const neox_model_desc *d, float *out, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, int N, neox_elem act);
// Precision fp8's linears (fp8.c): the FP8 linear whose weight view is w, or -1 (its product is
// then bfloat16's); the three products of FP8 linear k (as linear.c's of the same names); scratch
// for N rows (planned with the activations), its bytes with the scaling state's; freeing.
int neox_model_fp8_linear(const neox_model *m, const float *w);
void neox_model_fp8_forward(neox_model *m, int k, float *out, const float *inp, const float *w, const float *bias,
                            int N, int IC, int OC);
void neox_model_fp8_backward_weights(neox_model *m, int k, float *dw, float *db, const float *dout, const float *inp,
                                     int N, int IC, int OC);
void neox_model_fp8_backward_input(neox_model *m, int k, float *dinp, const float *w, int N, int IC, int OC);
void neox_model_fp8_plan(neox_model *m, int N);
size_t neox_model_fp8_bytes(const neox_model *m);
void neox_model_fp8_free(neox_model *m);
// The element type of the model's products' operands: fp32, or its 16-bit precision's (linear.c).
neox_elem neox_model_operand_elem(const neox_model *m);
// The linear layers in the model's precision (linear.c). Weights are views into param_buf.
// The weights_use hook around a unit's use (nothing without the hook); the head's with the
// embedding when they are tied on this stage, in the order neox_model_weight_trace lists them.
void neox_model_use_weights(neox_model *m, int unit, int use);
void neox_model_use_head(neox_model *m, int use);
void neox_model_refresh_weights(neox_model *m);  // remakes the 16-bit weights when stale
void neox_model_linear_forward(neox_model *m, float *out, const float *inp, const float *w, const float *bias, int N,
                               int IC, int OC);
// The same with half (backend memory for N * IC 16-bit elements) as the input's 16-bit copy in place
// of the plan's (generation, whose rows are not the plan's); half is unused in fp32.
void neox_model_linear_forward_scratch(neox_model *m, uint16_t *half, float *out, const float *inp, const float *w,
                                       const float *bias, int N, int IC, int OC);
// The same product inside the backend's thread team (kernels/backend.h, NEOX_BACKEND_TEAM), called
// by every thread of it with its own copy of inp: fp32 when half is NULL, else in 16 bits with half
// the thread's own scratch for inp's rounded copy (the bias as neox_model_linear_forward_scratch adds
// it either way). out is shared; it returns when every thread's rows of it are written.
void neox_model_linear_team(neox_model *m, uint16_t *half, float *out, const float *inp, const float *w,
                            const float *bias, int N, int IC, int OC);
void neox_model_linear_backward_weights(neox_model *m, float *dw, float *db, const float *dout, const float *inp, int N,
                                        int IC, int OC);
// out (N, OC) with row stride ldo = inp (N, IC) @ w (OC, IC)^T, no bias: a block of columns of a
// wider output (a piece of the output layer's logits).
void neox_model_linear_forward_cols(neox_model *m, float *out, int ldo, const float *inp, const float *w, int N, int IC,
                                    int OC);
// The input gradient's share of rows [o0, o1) of w: dinp (N, IC) = dout[:, o0:o1] @ w[o0:o1]
// (o0 == 0), or += (o0 > 0); after the weights' backward of the same dout (its 16-bit copy).
void neox_model_linear_backward_input_rows(neox_model *m, float *dinp, const float *dout, const float *w, int N, int IC,
                                           int OC, int o0, int o1);
// A piece [begin, end) of param_buf (of the output layer or the input embedding) is used (1) or
// done with (0): ZeRO-3 gathers it (weights_piece).
void neox_model_use_piece(neox_model *m, const float *begin, const float *end, int use);
// Rows [o0, o1) of the weights' backward (dw += dout[:, o0:o1]^T inp): a piece of what
// neox_model_linear_backward_weights does for all OC rows; cast: make the 16-bit operands first (for
// the first piece of a dout). No bias.
void neox_model_linear_backward_weight_rows(neox_model *m, float *dw, const float *dout, const float *inp, int N,
                                            int IC, int OC, int o0, int o1, int cast);
void neox_model_linear_backward_input(neox_model *m, float *dinp, const float *dout, const float *w, int N, int IC,
                                      int OC);
// The MLP's first projection and its activation (linear.c decides whether they run as the backend's
// fused linear_act ops): fc (N, F, or 2F gated) = inp (N, C) @ w^T + bias, kept for backward, and
// act (N, F) = the activation of fc.
void neox_model_mlp_forward_in(neox_model *m, float *act, float *fc, const float *inp, const float *w,
                               const float *bias, int N, int C, int F);
// Its backward from the second projection's output gradient dout (N, C), after that projection's
// weight gradients: dfc (N, F or 2F) = the gradient of fc through the second projection w2 (C, F) and
// the activation (dact (N, F): scratch). Returns the first projection's bias gradient db still to be
// summed by its weights' backward, or NULL when the fused op has added it.
float *neox_model_mlp_backward_act(neox_model *m, float *dfc, float *dact, float *db, const float *dout,
                                   const float *w2, const float *fc, int N, int F, int C);

#endif
