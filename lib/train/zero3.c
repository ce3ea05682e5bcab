// zero3.c: the trainer's side of ZeRO stage 3 (docs/parallel.md, "ZeRO stage 3"). The fp32 master
// weights of this rank's partition live in t->param_partition, which the optimizer updates and
// checkpoints save; the model's flat parameter buffer holds whole only the units the parameter
// coordinator (lib/gradient/param_gather.c) has gathered. The model tells the coordinator when it
// uses a unit (its weights_use hook); every micro-batch is one pass with the model's trace.
// Gradients and optimizer state are partitioned as under stage 2 (the reducer's partition_sum).
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// The stage-3 keys: each with its DeepSpeed name and the older one without the prefix, which
// DeepSpeed also reads (the prefixed one wins when both are set); unset, the schema's default
// (unlimited for a None default).
static int64_t stage3_key(const neox_config *cfg, neox_subkey_id prefixed, neox_subkey_id plain) {
    neox_subkey_id ids[2] = {prefixed, plain};
    for (int i = 0; i < 2; i++) {
        const neox_value *v = neox_config_sub_id(cfg, ids[i]);
        if (v && v->kind == NEOX_VALUE_INT) return v->integer;
    }
    return neox_subkey_default_int(prefixed, -1);
}

// Layouts stage 3 cannot serve, refused by name (zero_optimization.[stage3_]use_all_reduce_for_fetch_params
// true is refused by the schema).
static int check_zero3(const neox_trainer *t, neox_error *err) {
    if (t->be->on_device)
        return neox_fail(err, NEOX_EXIT_USAGE, "zero_optimization.stage 3: not available with compute_backend %s yet "
                         "(host memory only); set compute_backend: cpu", t->be->name);
    return 0;
}

static void on_gathered(void *ctx, size_t begin, size_t end) { neox_model_refresh_range(((neox_trainer *)ctx)->model, begin, end); }

// The 16-bit copy of a released range gives its pages back too.
static void on_released(void *ctx, size_t begin, size_t end) {
    neox_model *m = ((neox_trainer *)ctx)->model;
    if (m->param16) neox_discard_pages(m->param16 + begin, (end - begin) * sizeof(uint16_t));
}

static void on_weights_use(void *ctx, int unit, int use) {
    neox_trainer *t = ctx;
    if (use) neox_param_gather_acquire(t->gather, unit);
    else neox_param_gather_release(t->gather, unit);
}

static void on_weights_piece(void *ctx, size_t begin, size_t end, int use) {
    neox_param_gather_piece(((neox_trainer *)ctx)->gather, begin, end, use);
}

int neox_train_setup_zero3(neox_trainer *t, neox_error *err) {
    if (check_zero3(t, err) != 0) return -1;
    neox_model *m = t->model;
    const neox_config *c = t->cfg;
    t->param_partition = t->be->alloc((t->part_end - t->part_begin + 1) * sizeof(float));
    neox_param_gather_options o = {
        .prefetch_elems = stage3_key(c, NEOX_SK_zero_optimization__stage3_prefetch_bucket_size,
                                     NEOX_SK_zero_optimization__prefetch_bucket_size),
        .max_live = stage3_key(c, NEOX_SK_zero_optimization__stage3_max_live_parameters,
                               NEOX_SK_zero_optimization__max_live_parameters),
        .max_reuse_distance = stage3_key(c, NEOX_SK_zero_optimization__stage3_max_reuse_distance,
                                         NEOX_SK_zero_optimization__max_reuse_distance),
        .persistence_threshold = stage3_key(c, NEOX_SK_zero_optimization__stage3_param_persistence_threshold,
                                            NEOX_SK_zero_optimization__param_persistence_threshold),
        .model_persistence_threshold = stage3_key(c, NEOX_SK_zero_optimization__stage3_model_persistence_threshold,
                                                  NEOX_SK_zero_optimization__model_persistence_threshold),
        .gathered = on_gathered, .released = on_released, .ctx = t};
    int piece_rows = neox_model_head_piece_rows(m);
    if (piece_rows > 0) {  // the output layer is used piece by piece: gathered likewise, never whole
        neox_model_head_range(m, &o.piece_begin[0], &o.piece_end[0]);
        if (neox_model_embed_piece_rows(m) > 0) {  // and the input embedding's forward
            o.piece_begin[1] = 0;
            o.piece_end[1] = (size_t)neox_model_embed_rows(m) * (size_t)m->desc.hidden_size;
        }
        o.piece_elems = (size_t)piece_rows * (size_t)m->desc.hidden_size;
    }
    int nunits = neox_model_unit_count(&m->desc);
    int *first = neox_malloc((size_t)(nunits + 1) * sizeof(int));
    size_t *offset = neox_malloc((size_t)m->nparams * sizeof *offset), *size = neox_malloc((size_t)m->nparams * sizeof *size);
    for (int p = 0; p < m->nparams; p++) offset[p] = m->params[p].offset, size[p] = m->params[p].numel;
    neox_model_unit_params(m, first);
    t->gather = neox_param_gather_make(&t->grid->data, m->param_buf, m->num_floats, t->param_partition, offset, size,
                                       first, nunits, &o);
    free(first), free(offset), free(size);
    t->trace[0] = neox_malloc((size_t)(2 * nunits + 2) * sizeof(int));
    t->trace[1] = neox_malloc((size_t)(2 * nunits + 2) * sizeof(int));
    for (int b = 0; b < 2; b++) t->trace_len[b] = neox_model_weight_trace(m, b, t->trace[b]);
    // (the training trace is the forward's followed by backward's)
    t->trace[NEOX_ZERO3_BACKWARD] = t->trace[NEOX_ZERO3_TRAIN] + t->trace_len[NEOX_ZERO3_FORWARD];
    t->trace_len[NEOX_ZERO3_BACKWARD] = t->trace_len[NEOX_ZERO3_TRAIN] - t->trace_len[NEOX_ZERO3_FORWARD];
    return 0;
}

void neox_train_free_zero3(neox_trainer *t) {
    neox_param_gather_free(t->gather);
    if (t->param_partition) t->be->free(t->param_partition);
    free(t->trace[0]), free(t->trace[1]);
}

void neox_train_zero3_take_weights(neox_trainer *t) {
    if (!t->gather) return;
    neox_model *m = t->model;
    // The partition holds the weights (initialised or loaded into it); the flat buffer holds only the
    // persistent tensors, gathered here with their 16-bit copy.
    neox_param_gather_persistent(t->gather);
    m->param16_stale = 0;
    m->weights_use = on_weights_use;
    m->weights_piece = on_weights_piece;
    m->weights_use_ctx = t;
}

void neox_train_zero3_begin(neox_trainer *t, neox_zero3_pass pass) {
    if (t->gather) neox_param_gather_begin(t->gather, t->trace[pass], t->trace_len[pass]);
}

void neox_train_zero3_end(neox_trainer *t) {
    if (t->gather) neox_param_gather_end(t->gather);
}

void neox_train_zero3_gather_all(neox_trainer *t) {
    if (t->gather) neox_param_gather_all(t->gather);
}

size_t neox_train_zero3_planned_elements(const neox_trainer *t) {
    neox_param_gather_stats s = neox_param_gather_stats_of(t->gather);
    return neox_param_gather_plan(t->gather, t->trace[1], t->trace_len[1]) + (size_t)s.persistent_elements;
}

void neox_train_zero3_after_update(neox_trainer *t) { neox_param_gather_persistent(t->gather); }
