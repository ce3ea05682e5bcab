// zero3.c: the trainer's side of ZeRO stage 3 (docs/parallel.md, "ZeRO stage 3"). The fp32 master
// weights of this rank's partition live in t->param_partition, which the optimizer updates and
// checkpoints save; the model's flat parameter buffer holds whole only the units the parameter
// coordinator (lib/gradient/param_gather.c) has gathered. The model tells the coordinator when it
// uses a unit (its weights_use hook); every micro-batch is one pass with the model's trace.
// Gradients and optimizer state are partitioned as under stage 2 (the reducer's partition_sum).
// A trainer part (parts.c): set-up, start, free, its memory, its gathers in comm_stats.json and the
// gathers around each pass of the model (begin_pass, end_pass) are its hooks.
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// The part's state: the coordinator that gathers the model's units into its flat buffer, and the
// model's traces (0: forward, 1: forward + backward).
typedef struct neox_zero3 {
    neox_param_gather *gather;
    int *trace[3], trace_len[3];   // by neox_train_pass (the backward trace is the end of the training one)
} neox_zero3;

extern const neox_train_part neox_train_zero3_part;

static neox_zero3 *zero3_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_zero3_part); }

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

static int64_t max_live_of(const neox_config *cfg) {
    return stage3_key(cfg, NEOX_SK_zero_optimization__stage3_max_live_parameters,
                      NEOX_SK_zero_optimization__max_live_parameters);
}

size_t neox_train_zero3_piece_limit(const neox_trainer *t) {
    return neox_param_gather_piece_limit(t->model->num_floats, t->grid->data_size, max_live_of(t->cfg));
}

// A gathered range's 16-bit copy is written from it: its memory, given back with the range's, is taken
// back first.
static void on_gathered(void *ctx, size_t begin, size_t end) {
    neox_model *m = ((neox_trainer *)ctx)->model;
    if (m->param16) m->be->commit(m->param16 + begin, (end - begin) * sizeof(uint16_t));
    neox_model_refresh_range(m, begin, end);
}

// The 16-bit copy of a released range gives its memory back too, as the flat buffer's does
// (lib/gradient/param_gather.c).
static void on_released(void *ctx, size_t begin, size_t end) {
    neox_model *m = ((neox_trainer *)ctx)->model;
    if (m->param16) m->be->release(m->param16 + begin, (end - begin) * sizeof(uint16_t));
}

// A device allocated the flat buffers whole (and zeroed them); none of it is in use until gathered, so
// it goes back before the optimizer and the activations take theirs. (The host never mapped them:
// lib/model/params.c, zero_untouched.)
static void give_back_flat_buffers(neox_trainer *t) {
    neox_model *m = t->model;
    if (!t->be->on_device) return;
    t->be->release(m->param_buf, m->num_floats * sizeof(float));
    if (m->param16) t->be->release(m->param16, m->num_floats * sizeof(uint16_t));
}

static void on_weights_use(void *ctx, int unit, int use) {
    neox_zero3 *z = zero3_of(ctx);
    if (use) neox_param_gather_acquire(z->gather, unit);
    else neox_param_gather_release(z->gather, unit);
}

static void on_weights_piece(void *ctx, size_t begin, size_t end, int use) {
    neox_param_gather_piece(zero3_of(ctx)->gather, begin, end, use);
}

// After the reducer (the partition is known): makes the partition's master weights and the
// parameter coordinator with the stage3_* keys (every layout and backend is served: nothing fails).
static int setup_zero3(neox_trainer *t, neox_error *err) {
    (void)err;
    if (t->zero_stage != 3) return 0;
    neox_zero3 *z = neox_calloc(1, sizeof *z);
    *neox_train_part_slot(t, &neox_train_zero3_part) = z;
    neox_model *m = t->model;
    const neox_config *c = t->cfg;
    t->param_partition = t->be->alloc((t->part_end - t->part_begin + 1) * sizeof(float));
    neox_param_gather_options o = {
        .prefetch_elems = stage3_key(c, NEOX_SK_zero_optimization__stage3_prefetch_bucket_size,
                                     NEOX_SK_zero_optimization__prefetch_bucket_size),
        .max_live = max_live_of(c),
        .max_reuse_distance = stage3_key(c, NEOX_SK_zero_optimization__stage3_max_reuse_distance,
                                         NEOX_SK_zero_optimization__max_reuse_distance),
        .persistence_threshold = stage3_key(c, NEOX_SK_zero_optimization__stage3_param_persistence_threshold,
                                            NEOX_SK_zero_optimization__param_persistence_threshold),
        .model_persistence_threshold = stage3_key(c, NEOX_SK_zero_optimization__stage3_model_persistence_threshold,
                                                  NEOX_SK_zero_optimization__model_persistence_threshold),
        .gathered = on_gathered, .released = on_released, .ctx = t, .be = t->be};
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
    z->gather = neox_param_gather_make(&t->grid->data, m->param_buf, m->num_floats, t->param_partition, offset, size,
                                       first, nunits, &o);
    free(first), free(offset), free(size);
    z->trace[0] = neox_malloc((size_t)(2 * nunits + 2) * sizeof(int));
    z->trace[1] = neox_malloc((size_t)(2 * nunits + 2) * sizeof(int));
    for (int b = 0; b < 2; b++) z->trace_len[b] = neox_model_weight_trace(m, b, z->trace[b]);
    // (the training trace is the forward's followed by backward's)
    z->trace[NEOX_PASS_BACKWARD] = z->trace[NEOX_PASS_TRAIN] + z->trace_len[NEOX_PASS_FORWARD];
    z->trace_len[NEOX_PASS_BACKWARD] = z->trace_len[NEOX_PASS_TRAIN] - z->trace_len[NEOX_PASS_FORWARD];
    give_back_flat_buffers(t);
    return 0;
}

static void free_zero3(neox_trainer *t) {
    neox_zero3 *z = zero3_of(t);
    if (t->param_partition) t->be->free(t->param_partition);
    t->param_partition = NULL;
    if (!z) return;
    neox_param_gather_free(z->gather);
    free(z->trace[0]), free(z->trace[1]);
    free(z);
    *neox_train_part_slot(t, &neox_train_zero3_part) = NULL;
}

// After the partition's weights are initialised or loaded (into t->param_partition, never whole):
// the persistent tensors are gathered and the model's weights_use hook installed.
static void zero3_take_weights(neox_trainer *t) {
    neox_zero3 *z = zero3_of(t);
    if (!z) return;
    neox_model *m = t->model;
    // The partition holds the weights (initialised or loaded into it); the flat buffer holds only the
    // persistent tensors, gathered here with their 16-bit copy.
    neox_param_gather_persistent(z->gather);
    m->param16_stale = 0;
    m->weights_use = on_weights_use;
    m->weights_piece = on_weights_piece;
    m->weights_use_ctx = t;
}

// The partition's initial weights, made on the host (staged when the partition is device memory).
void neox_train_zero3_init_partition(neox_trainer *t) {
    size_t bytes = (t->part_end - t->part_begin) * sizeof(float);
    float *host = t->be->on_device ? neox_malloc(bytes ? bytes : 1) : t->param_partition;
    neox_model_init_range(t->model, t->state.seed, t->part_begin, t->part_end, host);
    if (host == t->param_partition) return;
    t->be->to_device(t->param_partition, host, bytes);
    free(host);
}

// A pass gathers the units its trace uses as it reaches them.
static void zero3_begin_pass(neox_trainer *t, neox_train_pass pass) {
    neox_zero3 *z = zero3_of(t);
    if (z) neox_param_gather_begin(z->gather, z->trace[pass], z->trace_len[pass]);
}

void neox_train_zero3_end(neox_trainer *t) {
    neox_zero3 *z = zero3_of(t);
    if (z) neox_param_gather_end(z->gather);
}

void neox_train_zero3_gather_all(neox_trainer *t) {
    neox_zero3 *z = zero3_of(t);
    if (z) neox_param_gather_all(z->gather);
}

void neox_train_zero3_after_update(neox_trainer *t) { neox_param_gather_persistent(zero3_of(t)->gather); }

// A device gives back whole pages only (its mapping granules: 2 MiB on CUDA): a page that a released
// unit shares with its neighbour stays held (at most one at each boundary between units). The host's
// plan is compared with the resident set, whose own rounding its check allows for, so only a device's
// plan counts these.
static double page_rounding(const neox_trainer *t) {
    if (!t->be->on_device || !t->be->releases) return 0.0;
    return (double)(neox_model_unit_count(&t->model->desc) + 1) * (double)t->be->release_granularity();
}

// Parameters: the master weights of the partition plus what a pass holds whole at most (the peak of
// a training pass plus the persistent tensors) instead of the whole model (where the backend gives
// memory back), their
// 16-bit copies likewise; and the coordinator's MPI temporary for a unit's gather (which may run beside a
// bucket's reduction).
static void zero3_memory(const neox_trainer *t, neox_memory_plan *p) {
    neox_zero3 *z = zero3_of(t);
    if (!z) return;
    const neox_model *m = t->model;
    neox_param_gather_stats s = neox_param_gather_stats_of(z->gather);
    double held = (double)(neox_param_gather_plan(z->gather, z->trace[1], z->trace_len[1]) + (size_t)s.persistent_elements);
    // Where the backend cannot give memory back (CUDA, the dry table) the flat buffers stay allocated
    // whole (lib/gradient/param_gather.c, give_back): the partition comes on top of them.
    double fewer = t->be->releases ? (double)m->num_floats - held : 0.0;
    p->params += (double)(t->part_end - t->part_begin) * 4 - fewer * 4 + page_rounding(t);
    if (m->param16) p->params16 += page_rounding(t) - fewer * 2;
    p->comm += (double)neox_param_gather_scratch_bytes(z->gather);
}

static json_t *gathers_json(const neox_param_gather_stats *s) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "gathers", (json_int_t)s->gathers, "prefetched", (json_int_t)s->prefetched,
                     "pieces_prefetched", (json_int_t)s->pieces_prefetched,
                     "gathered_elements", (json_int_t)s->gathered_elements, "peak_live_elements",
                     (json_int_t)s->peak_live_elements, "persistent_elements", (json_int_t)s->persistent_elements);
}

// Every rank's coordinator: its gathers and the most parameters it held whole ("parameter_gathers").
static void zero3_report(neox_trainer *t, json_t *doc) {
    neox_zero3 *z = zero3_of(t);
    neox_param_gather_stats mine = {0};
    if (z) mine = neox_param_gather_stats_of(z->gather);
    json_t *ranks;
    neox_param_gather_stats *all = neox_train_gather_rank_stats(t, &mine, sizeof mine, doc, &ranks);
    for (int r = 0; ranks && r < t->grid->world_size; r++)
        if (all[r].gathers > 0 || all[r].persistent_elements > 0)
            json_object_set_new(json_array_get(ranks, (size_t)r), "parameter_gathers", gathers_json(&all[r]));
    free(all);
}

const neox_train_part neox_train_zero3_part = {
    .name = "ZeRO stage 3",
    .stage = NEOX_PART_AFTER_PARTITION,
    .setup = setup_zero3,
    .start = zero3_take_weights,
    .free = free_zero3,
    .memory = zero3_memory,
    .report = zero3_report,
    .begin_pass = zero3_begin_pass,
    .end_pass = neox_train_zero3_end,
};
