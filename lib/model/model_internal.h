// model_internal.h: the activation plan shared by lib/model/forward.c and lib/model/backward.c,
// and this rank's sizes under tensor and pipeline parallelism.
#ifndef NEOX_MODEL_INTERNAL_H
#define NEOX_MODEL_INTERNAL_H

#include "kernels/backend.h"
#include "model.h"
#include "parallel.h"

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

// What one layer's backward needs from its forward. With activation checkpointing every layer
// points at the same single set and its forward is recomputed from the layer input in backward.
// Sizes are the shard's: NH, NKV local heads, F the local MLP width.
typedef struct neox_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd;  // (N, C), (N), (N)
    float *qkv;                        // (N, W), W = (NH + 2*NKV) * HS
    float *q, *k, *v;                  // (B, NH, T, HS), (B, NKV, T, HS) x 2, after rotary
    float *att, *lse;                  // (N, NH*HS) attention output before the projection; (B, NH, T)
    float *mid;                        // (N, C) sequential residual after attention (NULL when parallel)
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc;                         // (N, F) or (N, 2F) before the activation
    float *act;                        // (N, F)
} neox_layer_acts;

// One slot: what a micro-batch keeps from its forward to its backward, plus pointers to the
// scratch every slot shares.
typedef struct neox_acts {
    float *x;                          // (L + 1, N, C): the residual stream entering each local layer, then the last
    neox_layer_acts *layers;           // L entries (local layer index)
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                     // (head_rows, V) of this rank's vocabulary (value head: (N)); dlogits after backward
    float *ce_lse, *mask;              // (N)
    int *ids, *targets;                // (N) ids and targets within this rank's vocabulary, -1 elsewhere
    float mask_sum;
    unsigned long long dropout_seed;
    // shared
    float *cos, *sin;                  // (T, R/2)
    float *alibi;                      // (NH) this rank's ALiBi slopes (pos_emb alibi), else NULL
    float *branch;                     // (N, C) output of the attention or MLP branch
    float *ce_max;                     // (N) row maxima of the logits
    double *ce_stats;                  // (2, N) sums of exponentials, target logits
    double *ce_loss;                   // (2) the masked sum of the rows' losses, the sum of the mask
    float *dx, *dln, *dbranch;         // (N, C), (2, N, C): dln1 then dln2, adjacent for one reduction
    float *dqkv, *dq, *dk, *dv, *datt, *dfc, *dact;
} neox_acts;

// Dropout streams: one per (micro-batch seed, global layer, site), so masks are regenerated in
// backward and do not depend on the pipeline layout.
enum { NEOX_SITE_ATTN_PROBS, NEOX_SITE_ATTN_OUT, NEOX_SITE_MLP_OUT, NEOX_SITES_PER_LAYER };
unsigned long long neox_model_dropout_seed(const neox_model *m, int layer, int site);
// The attention-probability dropout seed of a layer on this tensor-parallel rank.
unsigned long long neox_model_attention_seed(const neox_model *m, int layer);

// The elementwise function of the activation (of its gate when gated).
neox_act_fn neox_activation_function(neox_activation a);

// One layer's forward (global layer index l) from x[l - l0] into x[l - l0 + 1] of the current
// slot, saving into its layer activations.
void neox_model_layer_forward(neox_model *m, int l);
// The output layer's logits of rows [r0, r0 + rows) (rows <= head_rows) into the slot's logits buffer.
void neox_model_head_logits(neox_model *m, int r0, int rows);
// Megatron's reduction of partial sums over the tensor-parallel group (nothing on one rank).
void neox_model_tp_reduce(neox_model *m, float *x, size_t n);
// Frees the activation plan.
void neox_model_free_plan(neox_model *m);
// (Re)allocates the 16-bit GEMM scratch for the plan's sizes (16-bit precisions only).
void neox_model_plan_half(neox_model *m);

// Attention's options for this model's heads head0.. (global index): scale, window, operands, and
// ALiBi's slopes `alibi` (backend memory filled by neox_model_fill_alibi, or NULL).
neox_attention_opts neox_model_attention_opts(const neox_model *m, const float *alibi, float dropout,
                                              unsigned long long seed);
// Fills n slopes (backend memory) for heads head0.. of the model with pos_emb alibi.
void neox_model_fill_alibi(const neox_model_desc *d, const neox_backend *be, float *slopes, int head0, int n);

// The element type of the model's products' operands: fp32, or its 16-bit precision's (linear.c).
neox_elem neox_model_operand_elem(const neox_model *m);
// The linear layers in the model's precision (linear.c). Weights are views into param_buf.
void neox_model_refresh_weights(neox_model *m);  // remakes the 16-bit weights when stale
void neox_model_linear_forward(neox_model *m, float *out, const float *inp, const float *w, const float *bias, int N,
                               int IC, int OC);
void neox_model_linear_backward_weights(neox_model *m, float *dw, float *db, const float *dout, const float *inp, int N,
                                        int IC, int OC);
void neox_model_linear_backward_input(neox_model *m, float *dinp, const float *dout, const float *w, int N, int IC,
                                      int OC);

#endif
