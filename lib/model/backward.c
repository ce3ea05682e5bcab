// backward.c: the backward pass, layer by layer in reverse, adding into the gradient buffer. With
// activation checkpointing each layer's forward is first recomputed from its saved input (dropout
// masks come from counter-based seeds, so the recomputation is identical).
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model_internal.h"

static void norm_backward(const neox_model_desc *d, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd, int N) {
    if (d->norm == NEOX_NORM_RMSNORM) neox_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, d->hidden_size);
    else neox_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, d->hidden_size);
}

// The gradient reaching a branch output through its hidden dropout: dx itself, or a masked copy.
static const float *branch_grad(neox_model *m, const float *dx, float *scratch, size_t n, int layer, int site) {
    float p = m->training ? m->desc.hidden_dropout : 0.0f;
    if (p <= 0.0f) return dx;
    neox_dropout(scratch, dx, n, p, neox_model_dropout_seed(m, layer, site), 0);
    return scratch;
}

// MLP branch: from the gradient of its output to dln2 (the gradient of the second norm's output).
static void mlp_backward(neox_model *m, int l, const float *dy) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    int N = m->B * m->T, C = d->hidden_size, F = d->ffn_size, swiglu = d->activation == NEOX_ACT_SWIGLU;
    int FC = swiglu ? 2 * F : F;
    neox_linear_backward(a->dact, g->fc2_w, g->fc2_b, dy, C, la->act, p->fc2_w, N, F, C, 0);
    if (swiglu) neox_swiglu_backward(a->dfc, a->dact, la->fc, N, F);
    else neox_gelu_backward(a->dfc, a->dact, la->fc, (size_t)N * F, d->activation == NEOX_ACT_GELU_TANH);
    neox_linear_backward(a->dln2, g->fc_w, g->fc_b, a->dfc, FC, la->ln2, p->fc_w, N, C, FC, 0);
}

// Attention branch: from the gradient of its output to dln1.
static void attention_backward(neox_model *m, int l, const float *dy) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    int B = m->B, T = m->T, N = B * T, C = d->hidden_size, NH = d->num_heads, NKV = d->num_kv_heads;
    int HS = d->head_size, W = (NH + 2 * NKV) * HS;
    neox_linear_backward(a->datt, g->proj_w, g->proj_b, dy, C, la->att, p->proj_w, N, C, C, 0);
    float attn_p = m->training ? d->attention_dropout : 0.0f;
    neox_attention_backward(a->dq, a->dk, a->dv, a->datt, la->q, la->k, la->v, la->att, la->lse, B, T, NH, NKV, HS,
                            1.0f / sqrtf((float)HS), attn_p, neox_model_dropout_seed(m, l, NEOX_SITE_ATTN_PROBS));
    if (d->rotary_dims) {
        neox_rotary_apply(a->dq, a->cos, a->sin, B, NH, T, HS, d->rotary_dims, 1);
        neox_rotary_apply(a->dk, a->cos, a->sin, B, NKV, T, HS, d->rotary_dims, 1);
    }
    neox_qkv_merge(a->dqkv, a->dq, a->dk, a->dv, B, T, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX);
    neox_linear_backward(a->dln1, g->qkv_w, g->qkv_b, a->dqkv, W, la->ln1, p->qkv_w, N, C, W, 0);
}

// a->dx holds the gradient of x[l + 1] on entry and of x[l] on return.
static void layer_backward(neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    int N = m->B * m->T;
    size_t NC = (size_t)N * d->hidden_size;
    const float *x = a->x + l * NC;
    if (d->checkpoint_activations) neox_model_layer_forward(m, l);
    mlp_backward(m, l, branch_grad(m, a->dx, a->dbranch, NC, l, NEOX_SITE_MLP_OUT));
    if (d->parallel_residual) {
        // Both branches read d x[l+1] before either norm adds its part into it.
        attention_backward(m, l, branch_grad(m, a->dx, a->dbranch, NC, l, NEOX_SITE_ATTN_OUT));
        norm_backward(d, a->dx, g->ln2_w, g->ln2_b, a->dln2, x, p->ln2_w, la->ln2_mean, la->ln2_rstd, N);
        norm_backward(d, a->dx, g->ln1_w, g->ln1_b, a->dln1, x, p->ln1_w, la->ln1_mean, la->ln1_rstd, N);
    } else {
        norm_backward(d, a->dx, g->ln2_w, g->ln2_b, a->dln2, la->mid, p->ln2_w, la->ln2_mean, la->ln2_rstd, N);
        attention_backward(m, l, branch_grad(m, a->dx, a->dbranch, NC, l, NEOX_SITE_ATTN_OUT));
        norm_backward(d, a->dx, g->ln1_w, g->ln1_b, a->dln1, x, p->ln1_w, la->ln1_mean, la->ln1_rstd, N);
    }
}

void neox_model_backward(neox_model *m, float loss_scale) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    int N = m->B * m->T, C = d->hidden_size, V = d->vocab_size;
    size_t NC = (size_t)N * C;
    float scale = a->mask_sum > 0 ? loss_scale / a->mask_sum : 0.0f;
    neox_cross_entropy_backward(a->logits, a->logits, a->ce_lse, a->targets, a->mask, scale, N, V);
    neox_linear_backward(a->dln1, m->g.lm_head, NULL, a->logits, V, a->lnf, m->w.lm_head, N, C, V, 0);
    memset(a->dx, 0, NC * sizeof(float));
    norm_backward(d, a->dx, m->g.lnf_w, m->g.lnf_b, a->dln1, a->x + (size_t)d->num_layers * NC, m->w.lnf_w,
                  a->lnf_mean, a->lnf_rstd, N);
    for (int l = d->num_layers - 1; l >= 0; l--) layer_backward(m, l);
    if (m->training && d->hidden_dropout > 0.0f)
        neox_dropout(a->dx, a->dx, NC, d->hidden_dropout, neox_model_dropout_seed(m, -1, NEOX_SITE_ATTN_OUT), 0);
    neox_embedding_backward(m->g.wte, m->g.wpe, a->dx, a->ids, m->B, m->T, C);
}
