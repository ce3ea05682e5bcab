// fp8.c: precision fp8's linear layers. The transformer layers' four products (QKV, attention
// output, the MLP's two: the modules Transformer Engine's te.Linear/LayerNormMLP/MultiheadAttention
// run in FP8 in GPT-NeoX) take FP8 operands: the input and the weight cast to E4M3 with their own
// per-tensor scales, the output gradient to the recipe's backward format, products accumulated in
// fp32 into the same fp32 results as bfloat16 precision; the master weights stay fp32 and are cast
// at each use. Scales follow Transformer Engine's DelayedScaling: each cast records its tensor's
// amax, and after each training pass the caller reduces the amaxes over the ranks and calls
// neox_model_fp8_update, which rolls the histories and computes the scales the next pass casts with.
// Under pipelining the forward scales move after each forward (neox_model_fp8_update_forward) while
// other micro-batches' backwards are still to come: each activation slot then holds the forward
// scales its micro-batch was cast with, which its backward (and a recomputed forward) casts with
// again, as Transformer Engine keeps a recomputation's scales.
// The output layer (GPT-NeoX's parallel_lm_logits, not a TE module) and MoE's products stay
// bfloat16 (linear.c).
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"

enum { FP8_PER_LAYER = 4 };

struct neox_fp8 {
    neox_fp8_recipe recipe;
    int nlin;               // FP8 linears on this rank, in layer order (qkv, proj, fc, fc2 of each layer)
    const float **weight;   // (nlin) each one's weight view in param_buf
    size_t *weight_elems;   // (nlin) OC x IC of each
    // Backend memory. Tensor columns: 2k the input and 2k + 1 the weight of linear k (forward, E4M3),
    // 2 nlin + k its output gradient (backward format).
    float *history;         // (history_len, 3 nlin)
    float *scale, *scale_inv;  // (3 nlin)
    // Per activation slot: the forward scales (2 nlin) and their inverses (2 nlin) its micro-batch
    // was cast with, kept from its forward's update to its backward; held[slot] (host) says whether
    // they are kept (else the current scales are the forward's).
    float *slot_scales;     // (nslots, 4 nlin)
    int *held, nslots;
    uint8_t *in8, *w8, *out8;  // FP8 operand scratch: an input (N, IC), a weight, an output gradient (N, OC)
    size_t in_bytes, w_bytes, out_bytes;
};

static int tensors(const struct neox_fp8 *f) { return 3 * f->nlin; }

// The FP8 linear whose weight is w, or -1 (the output layer, MoE's products, a weight of rows).
int neox_model_fp8_linear(const neox_model *m, const float *w) {
    const struct neox_fp8 *f = m->fp8;
    if (!f) return -1;
    for (int k = 0; k < f->nlin; k++)
        if (f->weight[k] == w) return k;
    return -1;
}

static const neox_param *param_of(const neox_model *m, const float *w) {
    for (int i = 0; i < m->nparams; i++)
        if (m->param_buf + m->params[i].offset == w) return &m->params[i];
    return NULL;
}

// The FP8 linears: every present dense projection of this rank's layers.
static void find_linears(neox_model *m, struct neox_fp8 *f) {
    int L = m->desc.num_layers;
    f->weight = neox_calloc((size_t)L * FP8_PER_LAYER, sizeof *f->weight);
    f->weight_elems = neox_calloc((size_t)L * FP8_PER_LAYER, sizeof *f->weight_elems);
    for (int l = 0; l < L; l++) {
        const neox_layer_params *p = &m->w.layers[l];
        const float *ws[FP8_PER_LAYER] = {p->qkv_w, p->proj_w, p->fc_w, p->fc2_w};
        for (int j = 0; j < FP8_PER_LAYER; j++) {
            const neox_param *prm = ws[j] ? param_of(m, ws[j]) : NULL;
            if (!prm) continue;  // off this stage, or a MoE layer's MLP
            f->weight[f->nlin] = ws[j];
            f->weight_elems[f->nlin++] = prm->numel;
        }
    }
}

// Every scale starts at 1, as Transformer Engine's. (Each rank's output gradients are one rank's
// over the same samples, whatever the layout: its loss gradient divides by the whole global batch's
// tokens (neox_model.loss_ranks), so no layout needs other scales.)
static void initial_scales(neox_model *m, struct neox_fp8 *f, int n) {
    float *scale = neox_malloc((size_t)n * sizeof(float));
    for (int j = 0; j < n; j++) scale[j] = 1.0f;
    m->be->to_device(f->scale, scale, (size_t)n * sizeof(float));
    m->be->synchronize();
    free(scale);
    neox_model_fp8_scales_changed(m);
}

static void free_scratch(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    m->be->free(f->in8);
    m->be->free(f->w8);
    m->be->free(f->out8);
    m->be->free(f->slot_scales);
    free(f->held);
    f->in8 = f->w8 = f->out8 = NULL;
    f->slot_scales = NULL, f->held = NULL, f->nslots = 0;
    f->in_bytes = f->w_bytes = f->out_bytes = 0;
}

static size_t slot_floats(const struct neox_fp8 *f) { return 4 * (size_t)f->nlin; }

// Whether the current slot's micro-batch keeps forward scales of its own (its forward's update has run).
static int slot_held(const neox_model *m) {
    const struct neox_fp8 *f = m->fp8;
    return m->slot < f->nslots && f->held[m->slot];
}

// The scale and inverse of forward tensor j (2k: linear k's input, 2k + 1 its weight) that the current
// slot's micro-batch is cast with.
static const float *forward_scale(const neox_model *m, int j) {
    const struct neox_fp8 *f = m->fp8;
    return slot_held(m) ? f->slot_scales + (size_t)m->slot * slot_floats(f) + j : f->scale + j;
}
static const float *forward_scale_inv(const neox_model *m, int j) {
    const struct neox_fp8 *f = m->fp8;
    return slot_held(m) ? f->slot_scales + (size_t)m->slot * slot_floats(f) + 2 * f->nlin + j : f->scale_inv + j;
}

void neox_model_fp8_free(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    if (!f) return;
    free_scratch(m);
    m->be->free(f->history);
    m->be->free(f->scale);
    m->be->free(f->scale_inv);
    free(f->weight);
    free(f->weight_elems);
    free(f);
    m->fp8 = NULL;
}

void neox_model_set_fp8_recipe(neox_model *m, const neox_fp8_recipe *recipe) {
    neox_assert(m->precision == NEOX_PRECISION_FP8 && recipe->history_len >= 1, "an FP8 recipe for a %s model",
                neox_precision_name(m->precision));
    neox_model_fp8_free(m);
    struct neox_fp8 *f = neox_calloc(1, sizeof *f);
    f->recipe = *recipe;
    m->fp8 = f;
    find_linears(m, f);
    int n = tensors(f) ? tensors(f) : 1;
    f->history = m->be->alloc((size_t)recipe->history_len * n * sizeof(float));
    m->be->memset_zero(f->history, (size_t)recipe->history_len * n * sizeof(float));
    f->scale = m->be->alloc((size_t)n * sizeof(float));
    f->scale_inv = m->be->alloc((size_t)n * sizeof(float));
    initial_scales(m, f, n);
    if (m->act_buf) neox_model_fp8_plan(m, m->B * m->T);
}

// Scratch for N rows: the widest input and output of the FP8 linears, the largest weight.
void neox_model_fp8_plan(neox_model *m, int N) {
    struct neox_fp8 *f = m->fp8;
    if (!f) return;
    free_scratch(m);
    const neox_model_desc *d = &m->desc;
    size_t in = 0, out = 0, w = 0;
    for (int k = 0; k < f->nlin; k++) w = w > f->weight_elems[k] ? w : f->weight_elems[k];
    for (int k = 0; k < f->nlin; k++) {  // every FP8 linear's IC and OC is C or a factor of its weight
        size_t other = f->weight_elems[k] / (size_t)d->hidden_size;
        in = in > other ? in : other;
        out = out > other ? out : other;
    }
    in = in > (size_t)d->hidden_size ? in : (size_t)d->hidden_size;
    out = out > (size_t)d->hidden_size ? out : (size_t)d->hidden_size;
    f->in_bytes = (size_t)N * in, f->out_bytes = (size_t)N * out, f->w_bytes = w;
    f->in8 = m->be->alloc(f->in_bytes ? f->in_bytes : 1);
    f->out8 = m->be->alloc(f->out_bytes ? f->out_bytes : 1);
    f->w8 = m->be->alloc(f->w_bytes ? f->w_bytes : 1);
    f->nslots = m->nslots > 0 ? m->nslots : 1;
    f->slot_scales = m->be->alloc((size_t)f->nslots * slot_floats(f) * sizeof(float) + sizeof(float));
    f->held = neox_calloc((size_t)f->nslots, sizeof *f->held);
}

size_t neox_model_fp8_bytes(const neox_model *m) {
    const struct neox_fp8 *f = m->fp8;
    if (!f) return 0;
    return f->in_bytes + f->w_bytes + f->out_bytes + (size_t)tensors(f) * sizeof(float) * (f->recipe.history_len + 2) +
           (size_t)f->nslots * slot_floats(f) * sizeof(float);
}

int neox_model_fp8_tensors(const neox_model *m) { return m->fp8 ? tensors(m->fp8) : 0; }
float *neox_model_fp8_history(const neox_model *m) { return m->fp8 ? m->fp8->history : NULL; }
float *neox_model_fp8_scale(const neox_model *m) { return m->fp8 ? m->fp8->scale : NULL; }

static void update_forward_columns(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    const neox_fp8_recipe *r = &f->recipe;
    m->be->fp8_update_scales(f->history, f->scale, f->scale_inv, r->history_len, tensors(f), 2 * f->nlin,
                             NEOX_FP8_E4M3, r->margin, r->algo_max);
}

static void update_gradient_columns(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    const neox_fp8_recipe *r = &f->recipe;
    int n = f->nlin;
    m->be->fp8_update_scales(f->history + 2 * n, f->scale + 2 * n, f->scale_inv + 2 * n, r->history_len, tensors(f),
                             n, r->backward_format, r->margin, r->algo_max);
}

void neox_model_fp8_update(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    if (!f || !f->nlin) return;
    update_forward_columns(m);
    update_gradient_columns(m);
}

void neox_model_fp8_update_forward(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    if (!f || !f->nlin) return;
    neox_assert(m->slot < f->nslots && !f->held[m->slot], "an FP8 forward update of slot %d twice before its backward",
                m->slot);
    float *kept = f->slot_scales + (size_t)m->slot * slot_floats(f);
    size_t bytes = 2 * (size_t)f->nlin * sizeof(float);
    m->be->copy(kept, f->scale, bytes);
    m->be->copy(kept + 2 * f->nlin, f->scale_inv, bytes);
    f->held[m->slot] = 1;
    update_forward_columns(m);
}

void neox_model_fp8_update_backward(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    if (!f || !f->nlin) return;
    if (m->slot < f->nslots) f->held[m->slot] = 0;
    update_gradient_columns(m);
}

float *neox_model_fp8_newest_amaxes(const neox_model *m, int gradients, int *count) {
    const struct neox_fp8 *f = m->fp8;
    *count = f ? (gradients ? f->nlin : 2 * f->nlin) : 0;
    return f ? f->history + (gradients ? 2 * f->nlin : 0) : NULL;
}

void neox_model_fp8_scales_changed(neox_model *m) {
    struct neox_fp8 *f = m->fp8;
    if (!f || !f->nlin) return;
    int n = tensors(f);
    float *scale = neox_malloc((size_t)n * sizeof(float)), *inv = neox_malloc((size_t)n * sizeof(float));
    m->be->to_host(scale, f->scale, (size_t)n * sizeof(float));
    m->be->synchronize();
    for (int j = 0; j < n; j++) inv[j] = 1.0f / scale[j];
    m->be->to_device(f->scale_inv, inv, (size_t)n * sizeof(float));
    m->be->synchronize();
    free(scale);
    free(inv);
}

void neox_model_fp8_state_get(const neox_model *m, float *history, float *scale) {
    const struct neox_fp8 *f = m->fp8;
    size_t n = (size_t)tensors(f);
    m->be->to_host(history, f->history, (size_t)f->recipe.history_len * n * sizeof(float));
    m->be->to_host(scale, f->scale, n * sizeof(float));
    m->be->synchronize();
}

void neox_model_fp8_state_set(neox_model *m, const float *history, const float *scale) {
    struct neox_fp8 *f = m->fp8;
    size_t n = (size_t)tensors(f), len = (size_t)f->recipe.history_len;
    m->be->to_device(f->history, history, len * n * sizeof(float));
    m->be->to_device(f->scale, scale, n * sizeof(float));
    m->be->synchronize();
    neox_model_fp8_scales_changed(m);
}

// The amax slot of tensor j when this pass records amaxes (training), else NULL. A forward recomputed
// after its micro-batch's forward update (under pipelining) records nothing: those amaxes are in.
static float *amax_of(const neox_model *m, int j) {
    if (!m->training || (j < 2 * m->fp8->nlin && slot_held(m))) return NULL;
    return m->fp8->history + j;
}

// out (N, OC) = inp (N, IC) @ w^T (OC, IC) of FP8 linear k (+ bias (OC)).
void neox_model_fp8_forward(neox_model *m, int k, float *out, const float *inp, const float *w, const float *bias,
                            int N, int IC, int OC) {
    const neox_backend *be = m->be;
    struct neox_fp8 *f = m->fp8;
    be->fp8_cast(f->in8, amax_of(m, 2 * k), inp, (size_t)N * IC, forward_scale(m, 2 * k), NEOX_FP8_E4M3);
    be->fp8_cast(f->w8, amax_of(m, 2 * k + 1), w, (size_t)OC * IC, forward_scale(m, 2 * k + 1), NEOX_FP8_E4M3);
    be->gemm_fp8(0, 1, N, OC, IC, f->in8, IC, NEOX_FP8_E4M3, forward_scale_inv(m, 2 * k), f->w8, IC, NEOX_FP8_E4M3,
                 forward_scale_inv(m, 2 * k + 1), 0.0f, out, OC);
    if (bias) be->add_bias(out, bias, N, OC, NEOX_ELEM_F32);
}

// dw (OC, IC) += dout^T @ inp of FP8 linear k, leaving dout's FP8 copy for the input gradient; with
// te_fp8_wgrad false the product is bfloat16's (the 16-bit scratch half_in, half_out). db as linear.c.
void neox_model_fp8_backward_weights(neox_model *m, int k, float *dw, float *db, const float *dout, const float *inp,
                                     int N, int IC, int OC) {
    const neox_backend *be = m->be;
    struct neox_fp8 *f = m->fp8;
    int g = 2 * f->nlin + k;
    neox_fp8_format bf = f->recipe.backward_format;
    be->fp8_cast(f->out8, amax_of(m, g), dout, (size_t)N * OC, f->scale + g, bf);
    if (f->recipe.wgrad) {
        // The forward's FP8 input again: the scale it was cast with (its slot's), so the same bytes.
        be->fp8_cast(f->in8, NULL, inp, (size_t)N * IC, forward_scale(m, 2 * k), NEOX_FP8_E4M3);
        be->gemm_fp8(1, 0, OC, IC, N, f->out8, OC, bf, f->scale_inv + g, f->in8, IC, NEOX_FP8_E4M3,
                     forward_scale_inv(m, 2 * k), 1.0f, dw, IC);
    } else {
        be->cast_f32_to_bf16(m->half_out, dout, (size_t)N * OC);
        be->cast_f32_to_bf16(m->half_in, inp, (size_t)N * IC);
        be->gemm_ex(1, 0, OC, IC, N, 1.0f, m->half_out, OC, m->half_in, IC, NEOX_ELEM_BF16, 1.0f, dw, IC,
                    NEOX_ELEM_F32);
    }
    if (db) be->linear_backward(NULL, NULL, db, dout, OC, NULL, NULL, N, IC, OC, 0, NEOX_ELEM_F32);
}

// dinp (N, IC) = dout (N, OC) @ w (OC, IC) of FP8 linear k, overwritten; dout's FP8 copy is the one
// neox_model_fp8_backward_weights just made.
void neox_model_fp8_backward_input(neox_model *m, int k, float *dinp, const float *w, int N, int IC, int OC) {
    const neox_backend *be = m->be;
    struct neox_fp8 *f = m->fp8;
    int g = 2 * f->nlin + k;
    be->fp8_cast(f->w8, NULL, w, (size_t)OC * IC, forward_scale(m, 2 * k + 1), NEOX_FP8_E4M3);
    be->gemm_fp8(0, 0, N, IC, OC, f->out8, OC, f->recipe.backward_format, f->scale_inv + g, f->w8, IC,
                 NEOX_FP8_E4M3, forward_scale_inv(m, 2 * k + 1), 0.0f, dinp, IC);
}
