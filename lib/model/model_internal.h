// model_internal.h: the activation plan shared by lib/model/forward.c and lib/model/backward.c.
#ifndef NEOX_MODEL_INTERNAL_H
#define NEOX_MODEL_INTERNAL_H

#include "model.h"

// What one layer's backward needs from its forward. With activation checkpointing every layer
// points at the same single set and its forward is recomputed from the layer input in backward.
typedef struct neox_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd;  // (N, C), (N), (N)
    float *qkv;                        // (N, W), W = (NH + 2*NKV) * HS
    float *q, *k, *v;                  // (B, NH, T, HS), (B, NKV, T, HS) x 2, after rotary
    float *att, *lse;                  // (N, C) attention output before the projection; (B, NH, T)
    float *mid;                        // (N, C) sequential residual after attention (NULL when parallel)
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc;                         // (N, F) or (N, 2F) before the activation
    float *act;                        // (N, F)
} neox_layer_acts;

typedef struct neox_acts {
    float *x;                          // (L + 1, N, C): the residual stream entering each layer, then the last
    neox_layer_acts *layers;           // L entries
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                     // (N, V); holds dlogits after backward
    float *losses, *ce_lse, *mask;     // (N)
    int *ids, *targets;                // (N)
    float *cos, *sin;                  // (T, R/2)
    float *branch;                     // (N, C) output of the attention or MLP branch
    // backward scratch
    float *dx, *dln1, *dln2, *dbranch;  // (N, C)
    float *dqkv, *dq, *dk, *dv, *datt, *dfc, *dact;
    float mask_sum;
} neox_acts;

// Dropout streams: one per (micro-batch seed, site), so masks are regenerated in backward.
enum { NEOX_SITE_ATTN_PROBS, NEOX_SITE_ATTN_OUT, NEOX_SITE_MLP_OUT, NEOX_SITES_PER_LAYER };
unsigned long long neox_model_dropout_seed(const neox_model *m, int layer, int site);

// One layer's forward from m->acts x[l] into x[l + 1], saving into acts->layers[l].
void neox_model_layer_forward(neox_model *m, int l);

#endif
