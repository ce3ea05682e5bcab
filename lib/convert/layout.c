// layout.c: which part of each Hugging Face-named parameter a (pipe, data, model) rank holds in a
// Megatron-style layout, as neox-convert reshard writes it (docs/convert.md, "Layouts"):
//  - pipe: layers are split over the M stages uniformly (stage s holds layers [s*L/M, (s+1)*L/M));
//    the embeddings live on stage 0, the final norm and the output layer on stage M-1;
//  - model (tensor parallel, N ranks): column-parallel weights are cut by rows (query_key_value and
//    q/k/v_proj by whole heads, dense_h_to_4h / up_proj / gate_proj by MLP rows, so each shard has
//    both swiglu halves of its rows), row-parallel weights (attention dense / o_proj, dense_4h_to_h /
//    down_proj) by columns, embeddings and the output layer by vocabulary rows; their biases follow
//    the rows of column-parallel weights; norms, row-parallel biases and the learned position table
//    are replicated and written once, by model rank 0;
//  - data: parameters are written by data rank 0; see reshard.c for how ZeRO cuts optimizer state.
// It also lists the parameters of a model in the trainer's buffer order (as lib/model/params.c lays
// them out), which the data-parallel flat-range layout is cut from.
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

static void add(neox_cvt_param **list, int *n, int *cap, int layer, int64_t rows, int64_t cols, const char *fmt, ...) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *list = neox_realloc(*list, (size_t)*cap * sizeof **list);
    }
    neox_cvt_param *p = &(*list)[(*n)++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->layer = layer;
}

static void add_layer(neox_cvt_param **list, int *n, int *cap, const neox_model_desc *d, int l) {
    int64_t C = d->hidden_size, HS = d->head_size, NH = d->num_heads, NKV = d->num_kv_heads, F = d->ffn_size;
    int neox = d->naming == NEOX_NAMES_GPT_NEOX, swiglu = d->activation == NEOX_ACT_SWIGLU;
    const char *pre = neox ? "gpt_neox.layers" : "model.layers";
    add(list, n, cap, l, C, 0, "%s.%d.input_layernorm.weight", pre, l);
    if (d->norm_bias) add(list, n, cap, l, C, 0, "%s.%d.input_layernorm.bias", pre, l);
    add(list, n, cap, l, C, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
    if (d->norm_bias) add(list, n, cap, l, C, 0, "%s.%d.post_attention_layernorm.bias", pre, l);
    if (neox) {
        add(list, n, cap, l, 3 * C, C, "%s.%d.attention.query_key_value.weight", pre, l);
        if (d->attn_bias) add(list, n, cap, l, 3 * C, 0, "%s.%d.attention.query_key_value.bias", pre, l);
        add(list, n, cap, l, C, C, "%s.%d.attention.dense.weight", pre, l);
        if (d->attn_bias) add(list, n, cap, l, C, 0, "%s.%d.attention.dense.bias", pre, l);
        add(list, n, cap, l, F, C, "%s.%d.mlp.dense_h_to_4h.weight", pre, l);
        add(list, n, cap, l, F, 0, "%s.%d.mlp.dense_h_to_4h.bias", pre, l);
        add(list, n, cap, l, C, F, "%s.%d.mlp.dense_4h_to_h.weight", pre, l);
        add(list, n, cap, l, C, 0, "%s.%d.mlp.dense_4h_to_h.bias", pre, l);
        return;
    }
    add(list, n, cap, l, NH * HS, C, "%s.%d.self_attn.q_proj.weight", pre, l);
    add(list, n, cap, l, NKV * HS, C, "%s.%d.self_attn.k_proj.weight", pre, l);
    add(list, n, cap, l, NKV * HS, C, "%s.%d.self_attn.v_proj.weight", pre, l);
    if (d->attn_bias) {
        add(list, n, cap, l, NH * HS, 0, "%s.%d.self_attn.q_proj.bias", pre, l);
        add(list, n, cap, l, NKV * HS, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        add(list, n, cap, l, NKV * HS, 0, "%s.%d.self_attn.v_proj.bias", pre, l);
    }
    add(list, n, cap, l, C, C, "%s.%d.self_attn.o_proj.weight", pre, l);
    if (d->attn_bias) add(list, n, cap, l, C, 0, "%s.%d.self_attn.o_proj.bias", pre, l);
    add(list, n, cap, l, F, C, "%s.%d.mlp.up_proj.weight", pre, l);
    if (swiglu) add(list, n, cap, l, F, C, "%s.%d.mlp.gate_proj.weight", pre, l);
    if (d->mlp_bias) {
        add(list, n, cap, l, F, 0, "%s.%d.mlp.up_proj.bias", pre, l);
        if (swiglu) add(list, n, cap, l, F, 0, "%s.%d.mlp.gate_proj.bias", pre, l);
    }
    add(list, n, cap, l, C, F, "%s.%d.mlp.down_proj.weight", pre, l);
    if (d->mlp_bias) add(list, n, cap, l, C, 0, "%s.%d.mlp.down_proj.bias", pre, l);
}

neox_cvt_param *neox_cvt_params(const neox_model_desc *d, int *count) {
    neox_cvt_param *list = NULL;
    int n = 0, cap = 0, neox = d->naming == NEOX_NAMES_GPT_NEOX;
    int64_t C = d->hidden_size;
    add(&list, &n, &cap, -1, d->vocab_size, C, neox ? "gpt_neox.embed_in.weight" : "model.embed_tokens.weight");
    if (d->pos_emb == NEOX_POS_LEARNED)
        add(&list, &n, &cap, -1, d->max_positions, C, neox ? "gpt_neox.embed_pos.weight" : "model.embed_positions.weight");
    for (int l = 0; l < d->num_layers; l++) add_layer(&list, &n, &cap, d, l);
    add(&list, &n, &cap, -1, C, 0, neox ? "gpt_neox.final_layer_norm.weight" : "model.norm.weight");
    if (d->norm_bias) add(&list, &n, &cap, -1, C, 0, neox ? "gpt_neox.final_layer_norm.bias" : "model.norm.bias");
    if (!d->tied) add(&list, &n, &cap, -1, d->vocab_size, C, neox ? "embed_out.weight" : "lm_head.weight");
    *count = n;
    return list;
}

// ---- the Megatron-style blocks -----------------------------------------------------------------
static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

// How a tensor is cut over model ranks: 0 = rows, 1 = columns, -1 = replicated.
static int split_dim(const neox_cvt_param *p) {
    const char *n = p->name;
    if (contains(n, "layernorm") || contains(n, "final_layer_norm") || contains(n, ".norm.") || contains(n, "embed_pos") ||
        contains(n, "embed_positions"))
        return -1;
    if (contains(n, "attention.dense.") || contains(n, "dense_4h_to_h.") || contains(n, "o_proj.") || contains(n, "down_proj."))
        return ends_with(n, ".weight") ? 1 : -1;  // row-parallel: weight by columns, bias replicated
    return 0;  // column-parallel weights and biases, embeddings and the output layer: by rows
}

// The pipe stage holding a parameter.
static int stage_of(const neox_model_desc *d, const neox_cvt_param *p, int pp) {
    if (p->layer >= 0) {
        for (int s = 0; s < pp; s++)
            if (p->layer < (int64_t)(s + 1) * d->num_layers / pp) return s;
    }
    int embedding = contains(p->name, "embed_in") || contains(p->name, "embed_tokens") || contains(p->name, "embed_pos");
    return embedding ? 0 : pp - 1;
}

int neox_cvt_param_block(const neox_model_desc *d, const neox_cvt_param *p, const neox_cvt_layout *lay, int pipe,
                         int model, int64_t *offset, int64_t *count) {
    if (stage_of(d, p, lay->pp) != pipe) return 0;
    for (int i = 0; i < p->ndim; i++) offset[i] = 0, count[i] = p->shape[i];
    int dim = split_dim(p);
    if (dim < 0) return model == 0;
    // Whole heads per rank for attention rows (rows are multiples of the head size, and fused QKV
    // rows are [q k v] per head, so an even row cut is a cut by heads); the rest are even cuts that
    // neox_cvt_layout_check has made sure divide.
    int64_t per = p->shape[dim] / lay->tp;
    offset[dim] = per * model;
    count[dim] = per;
    return 1;
}

int neox_cvt_layout_check(const neox_model_desc *d, const neox_cvt_layout *lay, neox_error *err) {
    if (lay->tp < 1 || lay->pp < 1 || lay->dp < 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp, --pp and --dp must be at least 1");
    if (lay->zero < 0 || lay->zero > 3) return neox_fail(err, NEOX_EXIT_USAGE, "--zero must be 0, 1, 2 or 3");
    if (d->num_heads % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide num_attention_heads = %d", lay->tp, d->num_heads);
    if (d->num_kv_heads % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide num_kv_heads = %d", lay->tp, d->num_kv_heads);
    if (d->ffn_size % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide the MLP width (intermediate_size) %d", lay->tp,
                         d->ffn_size);
    if (d->vocab_size % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide the padded vocabulary %d", lay->tp, d->vocab_size);
    if (d->num_layers < lay->pp)
        return neox_fail(err, NEOX_EXIT_USAGE, "--pp %d is more pipe stages than num_layers = %d", lay->pp, d->num_layers);
    return 0;
}
