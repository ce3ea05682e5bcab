// params.c: the model's parameters: one buffer laid out tensor by tensor under Hugging Face names,
// a gradient buffer of the same layout, the per-layer views both are read through, and GPT-NeoX's
// initialisation methods.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"

// The rank's part of the model: defaults for the whole model, and the divisibility Megatron's cuts need.
static int check_layout(neox_model_desc *d, neox_error *err) {
    if (d->tp_size <= 0) d->tp_size = 1;
    if (d->pp_size <= 0) d->pp_size = 1;
    if (d->layer_begin == 0 && d->layer_end == 0) d->layer_end = d->num_layers;
    if (d->tp_rank < 0 || d->tp_rank >= d->tp_size || d->pp_rank < 0 || d->pp_rank >= d->pp_size)
        return neox_fail(err, NEOX_EXIT_USAGE, "model: rank outside the parallel layout");
    if (d->layer_begin < 0 || d->layer_end > d->num_layers || d->layer_begin >= d->layer_end)
        return neox_fail(err, NEOX_EXIT_USAGE, "model: pipe stage %d has no layers (layers [%d, %d) of %d)", d->pp_rank,
                         d->layer_begin, d->layer_end, d->num_layers);
    struct { const char *what; int n; } cuts[] = {
        {"num_attention_heads", d->num_heads}, {"num_kv_heads", d->num_kv_heads},
        {"the MLP width (intermediate_size)", d->ffn_size}, {"the padded vocabulary (padded_vocab_size)", d->vocab_size},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        if (cuts[i].n % d->tp_size != 0)
            return neox_fail(err, NEOX_EXIT_USAGE, "model_parallel_size %d does not divide %s = %d", d->tp_size,
                             cuts[i].what, cuts[i].n);
    // GPT-NeoX's query/key LayerNorm spans one rank's heads, so its model would change with the layout.
    if (d->qk_norm && d->tp_size > 1 && neox_qk_norm_group(d, d->num_heads) > 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_qk_layernorm with norm: %s normalises over all heads of a "
                         "token; model_parallel_size %d would cut it (GPT-NeoX normalises each rank's heads apart, a "
                         "different model per layout); use model_parallel_size 1 or norm: rmsnorm",
                         d->norm == NEOX_NORM_NONPARAMETRIC ? "non_parametric_layernorm" : "layernorm", d->tp_size);
    return 0;
}

// What neox.c's Mixture of Experts covers (docs/model.md, "Mixture of Experts").
static int check_moe(const neox_model_desc *d, neox_error *err) {
    if (d->moe_experts <= 1) return 0;
    if (d->moe_top_k < 1 || d->moe_top_k > d->moe_experts)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_top_k %d must be between 1 and moe_num_experts %d", d->moe_top_k,
                         d->moe_experts);
    if (d->moe_interval < 1 || d->moe_ffn_size <= 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_expert_interval and the experts' width must be positive");
    if (d->moe_jitter_eps < 0.0f || d->moe_jitter_eps >= 1.0f)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_jitter_eps %g: need 0 <= eps < 1 (noise in [1 - eps, 1 + eps))",
                         d->moe_jitter_eps);
    if (d->moe_jitter_eps > 0.0f && d->moe_router != NEOX_MOE_TOPK)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_jitter_eps applies to moe_router_type: topk only (GPT-NeoX's "
                         "Sinkhorn router never reads it)");
    if (d->ep_size > 1 && (d->moe_experts % d->ep_size != 0 || d->ep_rank < 0 || d->ep_rank >= d->ep_size))
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_expert_parallel_size %d must divide moe_num_experts %d", d->ep_size,
                         d->moe_experts);
    // Sinkhorn's top-1 weight is a sigmoid: divided by itself it is 1, and the router would never learn.
    // (Its top-k > 1 weights could be renormalised, but that is no published model's rule: Mixtral's
    // router is topk.)
    if (d->moe_renormalize && d->moe_router != NEOX_MOE_TOPK)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_topk_renormalize applies to moe_router_type: topk only (the "
                         "Sinkhorn router's top-1 weight is a sigmoid, which renormalised is always 1, so its router "
                         "would get no gradient)");
    if (d->parallel_residual)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_num_experts with gpt_j_residual: GPT-NeoX's parallel layer drops "
                         "the attention output when its MLP is a MoE; use gpt_j_residual: false");
    return 0;
}

int neox_model_desc_check(neox_model_desc *d, neox_error *err) {
    if (d->vocab_size <= 0 || d->hidden_size <= 0 || d->num_layers <= 0 || d->num_heads <= 0 || d->ffn_size <= 0 ||
        d->max_positions <= 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "model: sizes must be positive");
    if (d->num_kv_heads <= 0) d->num_kv_heads = d->num_heads;
    if (d->hidden_size % d->num_heads != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "hidden_size %d is not divisible by num_attention_heads %d",
                         d->hidden_size, d->num_heads);
    if (d->num_heads % d->num_kv_heads != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "num_attention_heads %d is not divisible by num_kv_heads %d",
                         d->num_heads, d->num_kv_heads);
    d->head_size = d->hidden_size / d->num_heads;
    if (d->pos_emb != NEOX_POS_ROTARY) d->rotary_dims = 0;
    if (d->rotary_dims < 0 || d->rotary_dims > d->head_size || d->rotary_dims % 2 != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "rotary_pct gives %d rotary dims of head size %d; need an even number "
                         "no larger than the head size", d->rotary_dims, d->head_size);
    if (d->norm != NEOX_NORM_LAYERNORM) d->norm_bias = 0;
    // GPT-NeoX's ScaleNorm over (heads, head_size) would still reduce each head's last dim alone;
    // the query/key norm kernels hold LayerNorm's and RMSNorm's statistics only.
    if (d->qk_norm && d->norm == NEOX_NORM_SCALENORM)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_qk_layernorm is not supported with norm: scalenorm (layernorm, "
                         "non_parametric_layernorm, rmsnorm)");
    // GPT-NeoX's one query/key norm has the queries' shape: keys of fewer heads do not fit it.
    if (d->qk_norm && d->num_kv_heads != d->num_heads)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_qk_layernorm needs num_kv_heads = num_attention_heads (%d, not %d): "
                         "its one norm of shape (heads, head_size) serves queries and keys", d->num_heads,
                         d->num_kv_heads);
    if (d->value_head && d->tied)
        return neox_fail(err, NEOX_EXIT_USAGE, "train_impl rm: a reward model's value head (score.weight, 1 x hidden) "
                         "cannot be the input embedding; set no_weight_tying: true");
    if (check_moe(d, err) != 0) return -1;
    int neox_like = d->norm == NEOX_NORM_LAYERNORM && d->norm_bias && !neox_activation_gated(d->activation) &&
                    d->num_kv_heads == d->num_heads && d->mlp_bias;
    d->naming = neox_like ? NEOX_NAMES_GPT_NEOX : NEOX_NAMES_LLAMA;
    return check_layout(d, err);
}

// ---- layout ------------------------------------------------------------------------------------
// The whole model's tensors are visited in one order (wte, wpe, layers, final norm, output layer);
// each has an index in that order, whether or not this rank holds it, so initialisation streams
// and names do not depend on the layout. A rank keeps the tensors of its stage, cut for its
// tensor-parallel rank.
typedef struct layout_ctx {
    neox_model *m;
    int cap;
    int index;    // the next tensor's position in the whole model
    int present;  // the tensors being added live on this stage
    int *expert_index;  // expert parallelism: each layer's first expert tensor's index (laid out last)
} layout_ctx;

// Appends one tensor (when present) and returns its offset + 1, or 0 when this rank does not hold it.
static size_t add_param(layout_ctx *c, int no_decay, neox_split split, int64_t rows, int64_t cols, const char *fmt, ...) {
    neox_model *m = c->m;
    int index = c->index++;
    if (!c->present) return 0;
    if (m->nparams == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        m->params = neox_realloc(m->params, (size_t)c->cap * sizeof *m->params);
    }
    neox_param *p = &m->params[m->nparams++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = cols ? 2 : 1;
    p->global_shape[0] = p->shape[0] = rows;
    p->global_shape[1] = p->shape[1] = cols;
    int tp = m->desc.tp_size, rank = m->desc.tp_rank, dim = split == NEOX_SPLIT_ROWS ? 0 : 1;
    if (split != NEOX_SPLIT_NONE && tp > 1) {
        p->shape[dim] /= tp;
        p->block_offset[dim] = p->shape[dim] * rank;
    }
    p->split = split;
    p->index = index;
    p->numel = (size_t)p->shape[0] * (size_t)(cols ? p->shape[1] : 1);
    p->offset = m->num_floats;
    p->no_decay = no_decay;
    m->num_floats += p->numel;
    return p->offset + 1;
}

#define OFF(x) ((float *)(uintptr_t)(x))
#define ROWS NEOX_SPLIT_ROWS
#define COLS NEOX_SPLIT_COLS
#define NONE NEOX_SPLIT_NONE

// use_qk_layernorm's norm, GPT-NeoX's module name under the attention block's: (heads, head_size),
// cut by heads as the queries are (Hugging Face has no class with one norm shared by q and k).
static void layout_qk_norm(layout_ctx *c, neox_layer_params *v, const char *pre, const char *attn, int l) {
    const neox_model_desc *d = &c->m->desc;
    if (!d->qk_norm || neox_norm_weights(d) == 0) return;
    v->qk_norm_w = OFF(add_param(c, 1, ROWS, d->num_heads, d->head_size, "%s.%d.%s.qk_layernorm.weight", pre, l, attn));
    if (d->norm_bias)
        v->qk_norm_b = OFF(add_param(c, 1, ROWS, d->num_heads, d->head_size, "%s.%d.%s.qk_layernorm.bias", pre, l, attn));
}

// A Mixture-of-Experts layer's router and experts, named as Hugging Face's Mixtral names its
// block_sparse_moe (gate, experts.E.w1, w2 and, gated, w3; GPT-NeoX's ungated experts have no w3).
// Each expert's tensors are adjacent, expert after expert: w1 then w2, or gated w3 (up), w1 (gate),
// w2, so that [w3; w1] is one GEMM giving [up | gate] as the gated kernels take it.
// Under tensor parallelism the router and experts are replicated (each rank routes and computes every
// token of the whole, replicated, MLP input: no reduction). Under expert parallelism a rank holds
// only its own experts, laid out after every other tensor (lay_out), so that the rest of the buffer
// is the same on every data-parallel rank and the experts' part on every rank holding them.
static void layout_experts(layout_ctx *c, neox_layer_params *v, const char *pre, int l) {
    const neox_model_desc *d = &c->m->desc;
    int C = d->hidden_size, Fe = d->moe_ffn_size, present = c->present, first = 1;
    int gated = neox_activation_gated(d->activation);
    for (int e = 0; e < d->moe_experts; e++) {
        c->present = present && neox_model_expert_local(d, e);
        size_t w3 = gated ? add_param(c, 0, NONE, Fe, C, "%s.%d.block_sparse_moe.experts.%d.w3.weight", pre, l, e) : 0;
        size_t w1 = add_param(c, 0, NONE, Fe, C, "%s.%d.block_sparse_moe.experts.%d.w1.weight", pre, l, e);
        add_param(c, 0, NONE, C, Fe, "%s.%d.block_sparse_moe.experts.%d.w2.weight", pre, l, e);
        size_t first_tensor = gated ? w3 : w1;
        if (first_tensor && first) v->experts_w = OFF(first_tensor), first = 0;
    }
    c->present = present;
}

static void layout_moe(layout_ctx *c, neox_layer_params *v, const char *pre, int l) {
    const neox_model_desc *d = &c->m->desc;
    v->router_w = OFF(add_param(c, 0, NONE, d->moe_experts, d->hidden_size, "%s.%d.block_sparse_moe.gate.weight", pre, l));
    if (d->ep_size <= 1) {
        layout_experts(c, v, pre, l);
        return;
    }
    if (c->expert_index) c->expert_index[l] = c->index;  // laid out later, with these indices
    c->index += (neox_activation_gated(d->activation) ? 3 : 2) * d->moe_experts;  // w1, w2 (and w3) each
}

// One layer: column-parallel QKV and first MLP projection (cut by rows: whole heads, MLP rows),
// row-parallel attention output and second MLP projection (cut by columns; biases replicated).
static void layout_layer(layout_ctx *c, int l, neox_layer_params *v) {
    const neox_model_desc *d = &c->m->desc;
    int C = d->hidden_size, HS = d->head_size, NH = d->num_heads, NKV = d->num_kv_heads, F = d->ffn_size;
    int neox = d->naming == NEOX_NAMES_GPT_NEOX, ln_bias = d->norm_bias;
    const char *pre = neox ? "gpt_neox.layers" : "model.layers";
    memset(v, 0, sizeof *v);
    int NW = neox_norm_weights(d);
    if (NW) v->ln1_w = OFF(add_param(c, 1, NONE, NW, 0, "%s.%d.input_layernorm.weight", pre, l));
    if (ln_bias) v->ln1_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.input_layernorm.bias", pre, l));
    if (NW) v->ln2_w = OFF(add_param(c, 1, NONE, NW, 0, "%s.%d.post_attention_layernorm.weight", pre, l));
    if (ln_bias) v->ln2_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.post_attention_layernorm.bias", pre, l));
    if (neox) {
        // Fused QKV rows are [q k v] per head, so an even cut of the rows is a cut by heads.
        v->qkv_w = OFF(add_param(c, 0, ROWS, 3 * C, C, "%s.%d.attention.query_key_value.weight", pre, l));
        if (d->attn_bias) v->qkv_b = OFF(add_param(c, 1, ROWS, 3 * C, 0, "%s.%d.attention.query_key_value.bias", pre, l));
        layout_qk_norm(c, v, pre, "attention", l);
        v->proj_w = OFF(add_param(c, 0, COLS, C, C, "%s.%d.attention.dense.weight", pre, l));
        if (d->attn_bias && !d->attn_out_unbiased)
            v->proj_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.attention.dense.bias", pre, l));
        if (neox_model_moe_layer(d, l)) {
        layout_moe(c, v, pre, l);
        return;
    }
        v->fc_w = OFF(add_param(c, 0, ROWS, F, C, "%s.%d.mlp.dense_h_to_4h.weight", pre, l));
        v->fc_b = OFF(add_param(c, 1, ROWS, F, 0, "%s.%d.mlp.dense_h_to_4h.bias", pre, l));
        v->fc2_w = OFF(add_param(c, 0, COLS, C, F, "%s.%d.mlp.dense_4h_to_h.weight", pre, l));
        v->fc2_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.mlp.dense_4h_to_h.bias", pre, l));
        return;
    }
    // q, k and v projections (and their biases) are adjacent, so they form one fused matrix; each
    // is cut by whole heads, so a shard's fused matrix is [q | k | v] of its own heads.
    v->qkv_w = OFF(add_param(c, 0, ROWS, (int64_t)NH * HS, C, "%s.%d.self_attn.q_proj.weight", pre, l));
    add_param(c, 0, ROWS, (int64_t)NKV * HS, C, "%s.%d.self_attn.k_proj.weight", pre, l);
    add_param(c, 0, ROWS, (int64_t)NKV * HS, C, "%s.%d.self_attn.v_proj.weight", pre, l);
    if (d->attn_bias) {
        v->qkv_b = OFF(add_param(c, 1, ROWS, (int64_t)NH * HS, 0, "%s.%d.self_attn.q_proj.bias", pre, l));
        add_param(c, 1, ROWS, (int64_t)NKV * HS, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        add_param(c, 1, ROWS, (int64_t)NKV * HS, 0, "%s.%d.self_attn.v_proj.bias", pre, l);
    }
    layout_qk_norm(c, v, pre, "self_attn", l);
    v->proj_w = OFF(add_param(c, 0, COLS, C, C, "%s.%d.self_attn.o_proj.weight", pre, l));
    if (d->attn_bias && !d->attn_out_unbiased)
        v->proj_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.self_attn.o_proj.bias", pre, l));
    if (neox_model_moe_layer(d, l)) {
        layout_moe(c, v, pre, l);
        return;
    }
    // GPT-NeoX's gated MLP computes [x | gate] from one matrix: up_proj then gate_proj, adjacent;
    // each cut by rows, so every shard holds both halves of its rows.
    v->fc_w = OFF(add_param(c, 0, ROWS, F, C, "%s.%d.mlp.up_proj.weight", pre, l));
    if (neox_activation_gated(d->activation)) add_param(c, 0, ROWS, F, C, "%s.%d.mlp.gate_proj.weight", pre, l);
    if (d->mlp_bias) {
        v->fc_b = OFF(add_param(c, 1, ROWS, F, 0, "%s.%d.mlp.up_proj.bias", pre, l));
        if (neox_activation_gated(d->activation)) add_param(c, 1, ROWS, F, 0, "%s.%d.mlp.gate_proj.bias", pre, l);
    }
    v->fc2_w = OFF(add_param(c, 0, COLS, C, F, "%s.%d.mlp.down_proj.weight", pre, l));
    if (d->mlp_bias) v->fc2_b = OFF(add_param(c, 1, NONE, C, 0, "%s.%d.mlp.down_proj.bias", pre, l));
}

static float *rebase(float *base, float *off) { return off ? base + (uintptr_t)off - 1 : NULL; }

// Turns the offset + 1 views of `layout` into pointers into base.
static void make_views(const neox_model *m, const neox_model_weights *layout, float *base, neox_model_weights *out) {
    out->wte = rebase(base, layout->wte);
    out->wpe = rebase(base, layout->wpe);
    out->lnf_w = rebase(base, layout->lnf_w);
    out->lnf_b = rebase(base, layout->lnf_b);
    out->lm_head = rebase(base, layout->lm_head);
    out->layers = neox_calloc(m->desc.num_layers, sizeof *out->layers);
    for (int l = 0; l < m->desc.num_layers; l++) {
        const neox_layer_params *s = &layout->layers[l];
        neox_layer_params *v = &out->layers[l];
        float **dst[] = {&v->ln1_w, &v->ln1_b, &v->ln2_w, &v->ln2_b, &v->qkv_w, &v->qkv_b, &v->qk_norm_w,
                         &v->qk_norm_b, &v->proj_w, &v->proj_b, &v->fc_w, &v->fc_b, &v->fc2_w, &v->fc2_b, &v->router_w, &v->experts_w};
        float *const src[] = {s->ln1_w, s->ln1_b, s->ln2_w, s->ln2_b, s->qkv_w, s->qkv_b, s->qk_norm_w,
                              s->qk_norm_b, s->proj_w, s->proj_b, s->fc_w, s->fc_b, s->fc2_w, s->fc2_b, s->router_w, s->experts_w};
        for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) *dst[i] = rebase(base, src[i]);
    }
}

// Lays out this rank's parameters of m->desc (m->params, m->num_floats, m->layer_first_param) and
// records, in *layout, each view's offset + 1 (0 = absent). Allocates no buffers.
static void lay_out(neox_model *m, neox_model_weights *layout) {
    const neox_model_desc d = m->desc;
    int C = d.hidden_size, neox = d.naming == NEOX_NAMES_GPT_NEOX;
    int first = neox_model_first_stage(&d), last = neox_model_last_stage(&d);
    layout_ctx c = {.m = m, .present = first};
    c.expert_index = d.ep_size > 1 ? neox_calloc((size_t)d.num_layers, sizeof(int)) : NULL;
    memset(layout, 0, sizeof *layout);
    layout->layers = neox_calloc(d.num_layers, sizeof *layout->layers);
    m->layer_first_param = neox_calloc((size_t)d.num_layers + 1, sizeof(int));
    int wte_index = c.index;
    layout->wte = OFF(add_param(&c, 0, ROWS, d.vocab_size, C, neox ? "gpt_neox.embed_in.weight" : "model.embed_tokens.weight"));
    if (d.pos_emb == NEOX_POS_LEARNED)
        layout->wpe = OFF(add_param(&c, 0, NONE, d.max_positions, C, neox ? "gpt_neox.embed_pos.weight" : "model.embed_positions.weight"));
    for (int l = 0; l < d.num_layers; l++) {
        c.present = l >= d.layer_begin && l < d.layer_end;
        m->layer_first_param[l] = m->nparams;
        layout_layer(&c, l, &layout->layers[l]);
    }
    m->layer_first_param[d.num_layers] = m->nparams;
    c.present = last;

    if (neox_norm_weights(&d))
        layout->lnf_w = OFF(add_param(&c, 1, NONE, neox_norm_weights(&d), 0,
                                      neox ? "gpt_neox.final_layer_norm.weight" : "model.norm.weight"));
    if (d.norm_bias)
        layout->lnf_b = OFF(add_param(&c, 1, NONE, C, 0, neox ? "gpt_neox.final_layer_norm.bias" : "model.norm.bias"));
    if (d.value_head) {
        layout->lm_head = OFF(add_param(&c, 0, NONE, 1, C, "score.weight"));
    } else if (!d.tied) {
        layout->lm_head = OFF(add_param(&c, 0, ROWS, d.vocab_size, C, neox ? "embed_out.weight" : "lm_head.weight"));
    } else if (first) {
        layout->lm_head = layout->wte;
    } else if (last) {
        // The last stage keeps its own copy of the tied embedding, initialised identically.
        c.index = wte_index;
        layout->lm_head = OFF(add_param(&c, 0, ROWS, d.vocab_size, C, neox ? "gpt_neox.embed_in.weight" : "model.embed_tokens.weight"));
        m->params[m->nparams - 1].tied_copy = 1;
    }
    m->dense_params = m->nparams;
    for (int l = d.layer_begin; c.expert_index && l < d.layer_end; l++) {
        if (!neox_model_moe_layer(&d, l)) continue;
        c.index = c.expert_index[l], c.present = 1;
        layout_experts(&c, &layout->layers[l], neox ? "gpt_neox.layers" : "model.layers", l);
    }
    free(c.expert_index);
}

#undef ROWS
#undef COLS
#undef NONE

neox_param *neox_model_param_list(const neox_model_desc *desc, int *count, neox_error *err) {
    neox_model m = {.desc = *desc};
    if (neox_model_desc_check(&m.desc, err) != 0) return NULL;
    neox_model_weights layout;
    lay_out(&m, &layout);
    free(layout.layers);
    free(m.layer_first_param);
    *count = m.nparams;
    return m.params;
}

// Zeroes a fresh buffer without mapping it on the host: a rank that holds only a part of the model
// whole (ZeRO-2's gradients, ZeRO-3's parameters) never touches the rest, so its resident memory,
// at start-up too, is what the memory plan counts.
static void zero_untouched(const neox_backend *be, void *p, size_t bytes) {
    if (be->on_device) be->memset_zero(p, bytes);
    else be->release(p, bytes);
}

// A parameter-free norm: the weight views of this rank's norms (its layers', their query/key norm's,
// the final one on the last stage) point at one constant of ones, and their gradient views at one
// sink, so the kernels of the norm with weights compute it unchanged on every backend.
static void point_free_norms(neox_model *m) {
    const neox_model_desc *d = &m->desc;
    const neox_backend *be = m->be;
    size_t n = (size_t)d->hidden_size, qk = (size_t)neox_model_shard(d).NH * d->head_size;
    if (qk > n) n = qk;
    float *ones = neox_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    m->norm_ones = be->alloc(n * sizeof(float));
    be->to_device(m->norm_ones, ones, n * sizeof(float));
    free(ones);
    m->norm_sink = be->alloc(n * sizeof(float));
    be->memset_zero(m->norm_sink, n * sizeof(float));
    for (int l = d->layer_begin; l < d->layer_end; l++) {
        neox_layer_params *w = &m->w.layers[l], *g = &m->g.layers[l];
        w->ln1_w = w->ln2_w = m->norm_ones;
        g->ln1_w = g->ln2_w = m->norm_sink;
        if (d->qk_norm) w->qk_norm_w = m->norm_ones, g->qk_norm_w = m->norm_sink;
    }
    if (neox_model_last_stage(d)) m->w.lnf_w = m->norm_ones, m->g.lnf_w = m->norm_sink;
}

neox_model *neox_model_create_on(const neox_model_desc *desc, const neox_backend *be, neox_error *err) {
    neox_model_desc d = *desc;
    if (neox_model_desc_check(&d, err) != 0) return NULL;
    neox_model *m = neox_calloc(1, sizeof *m);
    m->desc = d;
    m->be = be;
    neox_model_weights layout;
    lay_out(m, &layout);
    m->param_buf = be->alloc(m->num_floats * sizeof(float));
    m->grad_buf = be->alloc(m->num_floats * sizeof(float));
    zero_untouched(be, m->param_buf, m->num_floats * sizeof(float));
    zero_untouched(be, m->grad_buf, m->num_floats * sizeof(float));
    make_views(m, &layout, m->param_buf, &m->w);
    make_views(m, &layout, m->grad_buf, &m->g);
    free(layout.layers);
    if (neox_norm_weights(&d) == 0) point_free_norms(m);
    return m;
}

neox_model *neox_model_create(const neox_model_desc *desc, neox_error *err) {
    return neox_model_create_on(desc, neox_backend_cpu(), err);
}

void neox_model_free(neox_model *m) {
    if (!m) return;
    free(m->params);
    free(m->layer_first_param);
    m->be->free(m->param_buf);
    m->be->free(m->grad_buf);
    m->be->free(m->param16);
    m->be->free(m->norm_ones);
    m->be->free(m->norm_sink);
    free(m->w.layers);
    free(m->g.layers);
    neox_model_free_plan(m);
    neox_model_fp8_free(m);
    free(m);
}

const neox_param *neox_model_find_param(const neox_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

static void add_piece(const neox_param *p, int64_t row, int64_t col, int64_t rows, int64_t cols, neox_param_piece *out) {
    out->offset[0] = p->block_offset[0] + row;
    out->offset[1] = p->block_offset[1] + col;
    out->count[0] = rows;
    out->count[1] = cols;
    out->start = (size_t)(row * (p->ndim == 2 ? p->shape[1] : 1) + col);
}

int neox_param_pieces(const neox_param *p, size_t begin, size_t end, neox_param_piece out[3]) {
    if (begin >= end) return 0;
    if (p->ndim == 1) {
        add_piece(p, (int64_t)begin, 0, (int64_t)(end - begin), 0, &out[0]);
        return 1;
    }
    int64_t cols = p->shape[1], a = (int64_t)begin, b = (int64_t)end;
    int n = 0;
    if (a % cols != 0) {  // the end of a first, partial row
        int64_t stop = (a / cols + 1) * cols < b ? (a / cols + 1) * cols : b;
        add_piece(p, a / cols, a % cols, 1, stop - a, &out[n++]);
        a = stop;
    }
    if (b / cols > a / cols && a < b) {  // whole rows
        add_piece(p, a / cols, 0, b / cols - a / cols, cols, &out[n++]);
        a = b / cols * cols;
    }
    if (a < b) add_piece(p, a / cols, 0, 1, b - a, &out[n++]);  // the start of a last row
    return n;
}

void neox_model_zero_grad(neox_model *m) { m->be->memset_zero(m->grad_buf, m->num_floats * sizeof(float)); }

// The standard deviation of GPT-NeoX's init functions (megatron/model/init_functions.py).
static double init_std(neox_init_method method, const neox_model_desc *d) {
    switch (method) {
    case NEOX_INIT_SCALED_NORMAL: return d->init_std / sqrt(2.0 * d->num_layers);
    case NEOX_INIT_SMALL: return sqrt(2.0 / (5.0 * d->hidden_size));
    case NEOX_INIT_WANG: return 2.0 / d->num_layers / sqrt((double)d->hidden_size);
    case NEOX_INIT_NORMAL: break;
    }
    return d->init_std;
}

// Output layers (attention dense, MLP output) use output_layer_init_method, as GPT-NeoX's
// RowParallelLinear layers do.
static int is_output_layer(const char *name) {
    return strstr(name, "attention.dense.") || strstr(name, "o_proj.") || strstr(name, "dense_4h_to_h.") ||
           strstr(name, "down_proj.") || (strstr(name, ".experts.") && strstr(name, ".w2."));
}

// Elements [begin, end) of the flat layout, initialised into dst[0, end - begin) (host memory).
void neox_model_init_range(const neox_model *m, unsigned long long seed, size_t begin, size_t end, float *dst) {
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        size_t lo, hi;
        if (!neox_overlap(p->offset, p->offset + p->numel, begin, end, &lo, &hi)) continue;
        float *x = dst + (p->offset - begin);  // x[j]: element j of the tensor, for j in [lo, hi) - offset
        size_t j0 = lo - p->offset, j1 = hi - p->offset;
        int is_norm = strstr(p->name, "norm.") != NULL || strstr(p->name, "layernorm.") != NULL;
        int is_bias = strlen(p->name) > 5 && strcmp(p->name + strlen(p->name) - 5, ".bias") == 0;
        if (is_bias || is_norm) {
            float value = is_norm && !is_bias ? 1.0f : 0.0f;
            for (size_t j = j0; j < j1; j++) x[j] = value;
            continue;
        }
        double std = init_std(is_output_layer(p->name) ? m->desc.output_init_method : m->desc.init_method, &m->desc);
        // One stream per tensor, indexed by the element's position in the global tensor, so every
        // layout holds the same values.
        unsigned long long s = neox_hash64(seed, (unsigned long long)p->index);
        size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1, gcols = p->ndim == 2 ? (size_t)p->global_shape[1] : 1;
        size_t r0 = (size_t)p->block_offset[0], c0 = p->ndim == 2 ? (size_t)p->block_offset[1] : 0;
        #pragma omp parallel for
        for (size_t j = j0; j < j1; j++)
            x[j] = (float)(std * neox_normal(s, (r0 + j / cols) * gcols + c0 + j % cols));
    }
}

// Initialises on the host (into a staging copy when the parameters live on a device).
void neox_model_init(neox_model *m, unsigned long long seed) {
    float *host = m->be->on_device ? neox_malloc(m->num_floats * sizeof(float)) : m->param_buf;
    neox_model_init_range(m, seed, 0, m->num_floats, host);
    if (host != m->param_buf) {
        m->be->to_device(m->param_buf, host, m->num_floats * sizeof(float));
        free(host);
    }
    neox_model_weights_changed(m);
}

// ---- units of weights (ZeRO-3's gathers; see neox_weights_use_fn) ----------------------------
void neox_model_unit_params(const neox_model *m, int *first) {
    const neox_model_desc *d = &m->desc;
    first[NEOX_UNIT_EMBED] = 0;
    for (int l = 0; l <= d->num_layers; l++) first[NEOX_UNIT_LAYER(l)] = m->layer_first_param[l];
    first[neox_model_unit_count(d)] = m->nparams;
}

// The head reads the embedding too when the output layer is the input embedding on this stage.
static int head_uses_embedding(const neox_model *m) { return m->w.lm_head == m->w.wte && m->w.wte; }

int neox_model_weight_trace(const neox_model *m, int backward, int *trace) {
    const neox_model_desc *d = &m->desc;
    int n = 0, head = neox_model_unit_head(d), first = neox_model_first_stage(d), last = neox_model_last_stage(d);
    if (first) trace[n++] = NEOX_UNIT_EMBED;
    for (int l = d->layer_begin; l < d->layer_end; l++) trace[n++] = NEOX_UNIT_LAYER(l);
    for (int pass = 0; last && pass < 1 + backward; pass++) {  // the head ends forward and starts backward
        trace[n++] = head;
        if (head_uses_embedding(m)) trace[n++] = NEOX_UNIT_EMBED;
    }
    for (int l = d->layer_end - 1; backward && l >= d->layer_begin; l--) trace[n++] = NEOX_UNIT_LAYER(l);
    return n;  // (the embedding's backward reads no weights)
}

void neox_model_use_weights(neox_model *m, int unit, int use) {
    if (!m->weights_use) return;
    m->weights_use(m->weights_use_ctx, unit, use);
}

void neox_model_use_head(neox_model *m, int use) {
    if (!m->weights_use) return;
    m->weights_use(m->weights_use_ctx, neox_model_unit_head(&m->desc), use);
    if (head_uses_embedding(m)) m->weights_use(m->weights_use_ctx, NEOX_UNIT_EMBED, use);
}
