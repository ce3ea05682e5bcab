// forward.c: the activation plan and the forward pass: embedding, the decoder layers (sequential or
// parallel residual), the final norm, the output projection and the fused cross-entropy.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model_internal.h"

static float *take(float **cursor, size_t n) {
    float *p = *cursor;
    *cursor += (n + 15) & ~(size_t)15;  // 64-byte aligned slices
    return p;
}

// Walks the plan; with base == NULL it only counts floats.
static size_t carve(neox_model *m, neox_acts *a, float *base) {
    const neox_model_desc *d = &m->desc;
    size_t B = m->B, T = m->T, N = B * T, C = d->hidden_size, L = d->num_layers, V = d->vocab_size;
    size_t HS = d->head_size, NH = d->num_heads, NKV = d->num_kv_heads, W = (NH + 2 * NKV) * HS;
    size_t F = d->ffn_size, FC = d->activation == NEOX_ACT_SWIGLU ? 2 * F : F;
    float *cur = base ? base : (float *)0 + 64;  // any non-NULL start when counting
    float *start = cur;
    a->x = take(&cur, (L + 1) * N * C);
    size_t sets = d->checkpoint_activations ? 1 : L;
    for (size_t s = 0; s < sets; s++) {
        neox_layer_acts *la = &a->layers[s];
        la->ln1 = take(&cur, N * C);
        la->ln1_mean = take(&cur, N);
        la->ln1_rstd = take(&cur, N);
        la->qkv = take(&cur, N * W);
        la->q = take(&cur, N * NH * HS);
        la->k = take(&cur, N * NKV * HS);
        la->v = take(&cur, N * NKV * HS);
        la->att = take(&cur, N * C);
        la->lse = take(&cur, N * NH);
        la->mid = d->parallel_residual ? NULL : take(&cur, N * C);
        la->ln2 = take(&cur, N * C);
        la->ln2_mean = take(&cur, N);
        la->ln2_rstd = take(&cur, N);
        la->fc = take(&cur, N * FC);
        la->act = take(&cur, N * F);
    }
    for (size_t l = sets; l < L; l++) a->layers[l] = a->layers[0];
    a->lnf = take(&cur, N * C);
    a->lnf_mean = take(&cur, N);
    a->lnf_rstd = take(&cur, N);
    a->logits = take(&cur, N * V);
    a->losses = take(&cur, N);
    a->ce_lse = take(&cur, N);
    a->mask = take(&cur, N);
    a->ids = (int *)take(&cur, N);
    a->targets = (int *)take(&cur, N);
    size_t R = d->rotary_dims ? d->rotary_dims : 2;
    a->cos = take(&cur, T * R / 2);
    a->sin = take(&cur, T * R / 2);
    a->branch = take(&cur, N * C);
    a->dx = take(&cur, N * C);
    a->dln1 = take(&cur, N * C);
    a->dln2 = take(&cur, N * C);
    a->dbranch = take(&cur, N * C);
    a->dqkv = take(&cur, N * W);
    a->dq = take(&cur, N * NH * HS);
    a->dk = take(&cur, N * NKV * HS);
    a->dv = take(&cur, N * NKV * HS);
    a->datt = take(&cur, N * C);
    a->dfc = take(&cur, N * FC);
    a->dact = take(&cur, N * F);
    return (size_t)(cur - start);
}

int neox_model_plan(neox_model *m, int B, int T, neox_error *err) {
    const neox_model_desc *d = &m->desc;
    if (B <= 0 || T <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "model: micro-batch and sequence must be positive");
    if (d->pos_emb == NEOX_POS_LEARNED && T > d->max_positions)
        return neox_fail(err, NEOX_EXIT_USAGE, "seq_length %d exceeds max_position_embeddings %d", T, d->max_positions);
    free(m->act_buf);
    if (m->acts) free(((neox_acts *)m->acts)->layers);
    free(m->acts);
    m->B = B;
    m->T = T;
    neox_acts *a = neox_calloc(1, sizeof *a);
    a->layers = neox_calloc(d->num_layers, sizeof *a->layers);
    m->act_floats = carve(m, a, NULL);
    m->act_buf = neox_aligned_alloc(64, m->act_floats * sizeof(float));
    memset(m->act_buf, 0, m->act_floats * sizeof(float));
    carve(m, a, m->act_buf);
    m->acts = a;
    if (d->rotary_dims) neox_rotary_tables(a->cos, a->sin, T, d->rotary_dims, d->rotary_base);
    return 0;
}

size_t neox_model_activation_bytes(const neox_model *m) { return m->act_floats * sizeof(float); }

const float *neox_model_logits(const neox_model *m) { return ((const neox_acts *)m->acts)->logits; }

unsigned long long neox_model_dropout_seed(const neox_model *m, int layer, int site) {
    return neox_hash64(m->dropout_seed, (unsigned long long)(layer + 1) * NEOX_SITES_PER_LAYER + site);
}

static void norm_forward(const neox_model_desc *d, float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N) {
    if (d->norm == NEOX_NORM_RMSNORM) neox_rmsnorm_forward(out, rstd, inp, w, N, d->hidden_size, d->norm_eps);
    else neox_layernorm_forward(out, mean, rstd, inp, w, b, N, d->hidden_size, d->norm_eps);
}

// Adds a branch output (after hidden dropout) into the residual: out = res + dropout(branch).
static void add_branch(neox_model *m, float *out, const float *res, float *branch, size_t n, int layer, int site) {
    float p = m->training ? m->desc.hidden_dropout : 0.0f;
    if (p > 0.0f) neox_dropout(branch, branch, n, p, neox_model_dropout_seed(m, layer, site), 0);
    neox_add(out, res, branch, n);
}

void neox_model_layer_forward(neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l];
    const neox_layer_params *p = &m->w.layers[l];
    int B = m->B, T = m->T, N = B * T, C = d->hidden_size, NH = d->num_heads, NKV = d->num_kv_heads;
    int HS = d->head_size, W = (NH + 2 * NKV) * HS, F = d->ffn_size, swiglu = d->activation == NEOX_ACT_SWIGLU;
    size_t NC = (size_t)N * C;
    const float *x = a->x + l * NC;
    float *y = a->x + (l + 1) * NC;

    // attention
    norm_forward(d, la->ln1, la->ln1_mean, la->ln1_rstd, x, p->ln1_w, p->ln1_b, N);
    neox_linear_forward(la->qkv, W, la->ln1, p->qkv_w, p->qkv_b, N, C, W);
    neox_qkv_split(la->q, la->k, la->v, la->qkv, B, T, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX);
    if (d->rotary_dims) {
        neox_rotary_apply(la->q, a->cos, a->sin, B, NH, T, HS, d->rotary_dims, 0);
        neox_rotary_apply(la->k, a->cos, a->sin, B, NKV, T, HS, d->rotary_dims, 0);
    }
    float attn_p = m->training ? d->attention_dropout : 0.0f;
    neox_attention_forward(la->att, la->lse, la->q, la->k, la->v, B, T, NH, NKV, HS, 1.0f / sqrtf((float)HS), attn_p,
                           neox_model_dropout_seed(m, l, NEOX_SITE_ATTN_PROBS));
    neox_linear_forward(a->branch, C, la->att, p->proj_w, p->proj_b, N, C, C);
    add_branch(m, d->parallel_residual ? y : la->mid, x, a->branch, NC, l, NEOX_SITE_ATTN_OUT);

    // MLP: on ln2(x) beside attention (parallel) or on ln2(x + attention) after it (sequential)
    const float *mlp_in = d->parallel_residual ? x : la->mid;
    norm_forward(d, la->ln2, la->ln2_mean, la->ln2_rstd, mlp_in, p->ln2_w, p->ln2_b, N);
    neox_linear_forward(la->fc, swiglu ? 2 * F : F, la->ln2, p->fc_w, p->fc_b, N, C, swiglu ? 2 * F : F);
    if (swiglu) neox_swiglu_forward(la->act, la->fc, N, F);
    else neox_gelu_forward(la->act, la->fc, (size_t)N * F, d->activation == NEOX_ACT_GELU_TANH);
    neox_linear_forward(a->branch, C, la->act, p->fc2_w, p->fc2_b, N, F, C);
    add_branch(m, y, d->parallel_residual ? y : la->mid, a->branch, NC, l, NEOX_SITE_MLP_OUT);
}

int neox_model_forward(neox_model *m, const int *ids, const int *targets, const float *loss_mask, neox_error *err) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    int N = m->B * m->T, C = d->hidden_size, V = d->vocab_size;
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return neox_fail(err, NEOX_EXIT_FAILURE, "token id %d at position %d is outside the vocabulary (%d)", ids[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return neox_fail(err, NEOX_EXIT_FAILURE, "target id %d at position %d is outside the vocabulary (%d)",
                             targets[i], i, V);
    }
    memcpy(a->ids, ids, (size_t)N * sizeof(int));
    neox_embedding_forward(a->x, ids, m->w.wte, m->w.wpe, m->B, m->T, C);
    if (m->training && d->hidden_dropout > 0.0f)
        neox_dropout(a->x, a->x, (size_t)N * C, d->hidden_dropout, neox_model_dropout_seed(m, -1, NEOX_SITE_ATTN_OUT), 0);
    for (int l = 0; l < d->num_layers; l++) neox_model_layer_forward(m, l);
    const float *last = a->x + (size_t)d->num_layers * N * C;
    norm_forward(d, a->lnf, a->lnf_mean, a->lnf_rstd, last, m->w.lnf_w, m->w.lnf_b, N);
    neox_linear_forward(a->logits, V, a->lnf, m->w.lm_head, NULL, N, C, V);
    if (!targets) return 0;
    memcpy(a->targets, targets, (size_t)N * sizeof(int));
    neox_cross_entropy_forward(a->losses, a->ce_lse, a->logits, targets, N, V);
    double sum = 0.0, wsum = 0.0;
    for (int i = 0; i < N; i++) {
        a->mask[i] = loss_mask ? loss_mask[i] : 1.0f;
        sum += (double)a->mask[i] * a->losses[i];
        wsum += a->mask[i];
    }
    a->mask_sum = (float)wsum;
    m->loss = wsum > 0 ? (float)(sum / wsum) : 0.0f;
    return 0;
}
