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
// It also lists the parameters of a model in the trainer's buffer order (lib/model's own layout,
// neox_model_param_list), which the data-parallel flat-range layout is cut from.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

neox_cvt_param *neox_cvt_params(const neox_model_desc *d, int *count) {
    neox_error err = {0};
    int n = 0;
    neox_param *model = neox_model_param_list(d, &n, &err);
    if (!model) neox_die_error(&err);  // desc was checked when the checkpoint was opened
    neox_cvt_param *list = neox_calloc(n ? n : 1, sizeof *list);
    for (int i = 0; i < n; i++) {
        neox_cvt_param *p = &list[i];
        snprintf(p->name, sizeof p->name, "%s", model[i].name);
        p->ndim = model[i].ndim;
        p->shape[0] = model[i].shape[0];
        p->shape[1] = model[i].ndim == 2 ? model[i].shape[1] : 0;
        const char *at = strstr(p->name, ".layers.");
        p->layer = at ? atoi(at + strlen(".layers.")) : -1;
    }
    free(model);
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
