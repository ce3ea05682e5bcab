// grad_exchange.c: the trainer's side of the gradient exchange (lib/gradient's neox_grad_exchange):
// the config keys that shape it read into its settings — communication_data_type and
// fp32_allreduce (the wire), zero_optimization's overlap_comm, reduce_scatter and
// reduce_bucket_size, gradient_predivide_factor, comm_progress_thread_us, sparse_gradients,
// gradient_compression with its rank, start, interval and replay, 1-bit Adam's freeze_step — with
// the combinations it cannot serve refused by name; the model's parameters and the grid's groups
// handed to it; the trainer's timers as its clock; and its checkpoint state (the compressors'
// buffers in the rank's shard, the adaptive plan in train.json), shaped as a checkpoint part.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

// communication_data_type (DeepSpeed: fp32, fp16 or bf16, any case) and fp32_allreduce: the type
// gradients travel in. Unset: fp32, the type of neox.c's gradients; a 16-bit type with
// fp32_allreduce true contradicts it and is refused.
static int read_wire_type(const neox_config *cfg, neox_dtype *wire, neox_error *err) {
    *wire = NEOX_F32;
    const neox_value *v = neox_config_has(cfg, communication_data_type) ? neox_config_value(cfg, communication_data_type) : NULL;
    if (!v || v->kind == NEOX_VALUE_NULL) return 0;
    const char *names[] = {"fp32", "fp16", "bf16"};
    neox_dtype types[] = {NEOX_F32, NEOX_F16, NEOX_BF16};
    int found = -1;
    for (int i = 0; v->kind == NEOX_VALUE_STRING && i < 3; i++)
        if (strcasecmp(v->string, names[i]) == 0) found = i;
    if (found < 0) return neox_fail(err, NEOX_EXIT_USAGE, "communication_data_type: expected fp32, fp16 or bf16");
    *wire = types[found];
    if (*wire != NEOX_F32 && neox_config_bool(cfg, fp32_allreduce))
        return neox_fail(err, NEOX_EXIT_USAGE, "communication_data_type %s contradicts fp32_allreduce: true", names[found]);
    return 0;
}

// comm_progress_thread_us: a thread that tests the overlapped buckets in flight on CPU ranks.
static int read_progress_thread(const neox_trainer *t, int overlap, double *interval, neox_error *err) {
    int64_t us = neox_config_int_or(t->cfg, comm_progress_thread_us, 0);
    *interval = 0;
    if (us == 0) return 0;
    if (!overlap)
        return neox_fail(err, NEOX_EXIT_USAGE, "comm_progress_thread_us: the thread progresses the overlapped gradient "
                         "reduction; set zero_optimization.overlap_comm: true");
    if (t->be->on_device)
        return neox_fail(err, NEOX_EXIT_USAGE, "comm_progress_thread_us: device gradients are reduced by NCCL on its own "
                         "stream, with nothing for a host thread to progress");
    *interval = (double)us * 1e-6;
    return 0;
}

// gradient_compression: none, onebit, powersgd or adaptive (the schema's choices), with what
// it cannot be combined with refused.
static int read_compression(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err) {
    static const char *const names[] = {"none", "onebit", "powersgd", "adaptive"};  // (neox_grad_compression's order)
    const char *gc = neox_config_str(t->cfg, gradient_compression);
    int onebit_adam = t->optim.kind == NEOX_OPTIMIZER_ONEBITADAM, found = gc ? -1 : NEOX_COMPRESSION_NONE;
    for (int i = 0; gc && i < 4; i++)
        if (!strcmp(gc, names[i])) found = i;
    if (found < 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression: '%s' is not none, onebit, powersgd or adaptive", gc);
    s->compression = (neox_grad_compression)found;
    if (onebit_adam && s->compression != NEOX_COMPRESSION_NONE)
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression: onebitadam compresses the momentum already; "
                         "set gradient_compression: none");
    if ((onebit_adam || s->compression != NEOX_COMPRESSION_NONE) && t->zero_stage > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "zero_optimization.stage %d: %s needs whole replicas (stage 0), as "
                         "DeepSpeed's 1-bit Adam does", t->zero_stage, onebit_adam ? "onebitadam" : "gradient_compression");
    s->onebit_adam = onebit_adam, s->freeze_step = t->optim.freeze_step;
    s->powersgd_rank = (int)neox_config_int(t->cfg, gradient_compression_rank);
    s->compress_start = neox_config_int(t->cfg, gradient_compression_start);
    return 0;
}

static int check_own_keys(const neox_config *cfg, int adaptive, neox_error *err) {
    if (adaptive) return 0;
    if (neox_config_has(cfg, gradient_compression_interval))
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_interval: only gradient_compression: adaptive decides");
    if (neox_config_has(cfg, gradient_compression_replay))
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: only gradient_compression: adaptive decides");
    return 0;
}

// gradient_compression: adaptive's own keys (refused without it), its replay file and the
// measurements a test or a reproduction gives it (NEOX_ADAPTIVE_MEASUREMENTS).
static int read_adaptive(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err) {
    int adaptive = s->compression == NEOX_COMPRESSION_ADAPTIVE;
    if (check_own_keys(t->cfg, adaptive, err) != 0) return -1;
    if (!adaptive) return 0;
    s->adaptive_interval = neox_config_int_or(t->cfg, gradient_compression_interval, 20);
    s->replay_path = neox_config_str(t->cfg, gradient_compression_replay);
    const char *fixed = getenv("NEOX_ADAPTIVE_MEASUREMENTS");
    s->measurements_path = fixed && *fixed ? fixed : NULL;
    return 0;
}

// The reducer's keys (data-parallel size > 1): buckets, overlap and its progress thread,
// reduce-scatter, predivide, the wire, sparse rows.
static int read_reduction(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err) {
    if (read_wire_type(t->cfg, &s->wire, err) != 0) return -1;
    if (t->grid->data_size <= 1) return 0;
    const neox_value *overlap = neox_config_sub(t->cfg, zero_optimization__overlap_comm);
    s->overlap = overlap && overlap->kind == NEOX_VALUE_BOOL ? overlap->boolean : 0;
    if (read_progress_thread(t, s->overlap, &s->progress_interval, err) != 0) return -1;
    if (neox_train_sparse_settings(t, s, err) != 0) return -1;
    s->bucket_bytes = (size_t)neox_config_int_or(t->cfg, zero_reduce_bucket_size, 500000000) * 4;
    s->zero_stage = t->zero_stage;
    s->reduce_scatter = neox_config_bool(t->cfg, zero_reduce_scatter);
    s->predivide = neox_config_has(t->cfg, gradient_predivide_factor) ? neox_config_float(t->cfg, gradient_predivide_factor) : 1.0;
    return 0;
}

// The model's parameters as the exchange sees them: offsets, sizes and matrix shapes.
typedef struct param_table {
    size_t *offset, *size;
    int *rows, *cols;
} param_table;

static param_table param_table_of(const neox_model *m, neox_grad_exchange_settings *s) {
    param_table p = {neox_calloc((size_t)m->nparams + 1, sizeof(size_t)), neox_calloc((size_t)m->nparams + 1, sizeof(size_t)),
                     neox_calloc((size_t)m->nparams + 1, sizeof(int)), neox_calloc((size_t)m->nparams + 1, sizeof(int))};
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *q = &m->params[i];
        p.offset[i] = q->offset, p.size[i] = q->numel;
        p.rows[i] = q->ndim == 2 ? (int)q->shape[0] : 1;
        p.cols[i] = q->ndim == 2 ? (int)q->shape[1] : (int)q->numel;
    }
    s->grads = m->grad_buf, s->n = m->num_floats, s->fill_elems = neox_model_grad_fill_elems(m);
    s->nparams = m->nparams, s->dense_params = m->dense_params;
    s->param_offset = p.offset, s->param_size = p.size, s->rows = p.rows, s->cols = p.cols;
    return p;
}

// The exchange's clock: backward's and the reduction's timers.
static void read_timers(void *ctx, double *backward_s, double *reduce_s) {
    const neox_trainer *t = ctx;
    *backward_s = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD));
    *reduce_s = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE));
}

// Rank 0 with log_dir: the adaptive plan's decisions, appended to log_dir/gradient_compression.jsonl.
static int open_decisions_log(neox_trainer *t, neox_error *err) {
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!t->rank0 || !dir || !neox_grad_exchange_logs_decisions(t->exchange)) return 0;
    char *path = neox_asprintf("%s/gradient_compression.jsonl", dir);
    int rc = neox_mkdirs(dir, err);
    FILE *log = rc == 0 ? fopen(path, "a") : NULL;
    if (rc == 0 && !log) rc = neox_fail(err, NEOX_EXIT_FAILURE, "cannot open %s for appending", path);
    free(path);
    if (log) neox_grad_exchange_set_log(t->exchange, log);
    return rc;
}

int neox_train_setup_exchange(neox_trainer *t, neox_error *err) {
    neox_grid *g = t->grid;
    neox_grad_exchange_settings s = {.backend = t->be, .data = &g->data, .data_intra = &g->data_intra,
                                     .data_inter = &g->data_inter, .expert_data = t->ep_size > 1 ? &g->expert_data : NULL,
                                     .held_param = neox_train_tied_param(t), .clock = read_timers, .clock_ctx = t,
                                     .verbose = t->rank0 && !t->opts.quiet};
    if (read_reduction(t, &s, err) != 0 || read_compression(t, &s, err) != 0 || read_adaptive(t, &s, err) != 0) return -1;
    // Each rank's loss gradient divides by the whole group's tokens (the data-parallel size times its
    // own), as one rank's does over the same samples, and the exchange sums: every layout then
    // computes one rank's gradient values, which FP8's amaxes see (docs/parallel.md, "How gradients
    // are reduced").
    t->model->loss_ranks = g->data.size;
    param_table p = param_table_of(t->model, &s);
    t->exchange = neox_grad_exchange_make(&s, err);
    free(p.offset), free(p.size), free(p.rows), free(p.cols);
    if (!t->exchange) return -1;
    return open_decisions_log(t, err);
}

// ---- checkpoint state ------------------------------------------------------------------------
// The compressors' error buffers are per rank (each rank's residuals, padded per tensor for the
// data-parallel size): tensor NAME/rank_RRRRR of the rank's own shard.
static void error_name(const neox_trainer *t, const char *group, char *buf, size_t size) {
    snprintf(buf, size, "%s/rank_%05d", group, t->grid->world_rank);
}

static int write_errors(const neox_trainer *t, neox_ckpt_writer *w, neox_error *err) {
    const char *names[NEOX_EXCHANGE_BUFFERS];
    float *bufs[NEOX_EXCHANGE_BUFFERS];
    size_t counts[NEOX_EXCHANGE_BUFFERS];
    int n = neox_grad_exchange_buffers(t->exchange, names, bufs, counts);
    for (int b = 0; b < n; b++) {
        char name[96];
        error_name(t, names[b], name, sizeof name);
        int64_t shape[1] = {(int64_t)counts[b]};
        // The buffers are the gradients' backend's: the shard is written from a host copy.
        float *host = neox_malloc((counts[b] + 1) * sizeof(float));
        t->be->to_host(host, bufs[b], counts[b] * sizeof(float));
        int rc = neox_ckpt_write_range(w, name, 1, shape, 0, shape[0], host, err);
        free(host);
        if (rc != 0) return -1;
    }
    return 0;
}

// Buffer b of the exchange read from the shard into a host copy, then onto the gradients' backend.
static int read_error(const neox_trainer *t, const neox_ckpt_reader *r, const char *name, float *buf, size_t count,
                      neox_error *err) {
    float *host = neox_malloc((count + 1) * sizeof(float));
    int rc = neox_ckpt_read_range(r, name, 0, (int64_t)count, host, err);
    if (rc == 0) t->be->to_device(buf, host, count * sizeof(float));
    free(host);
    return rc;
}

// Restores the compressors' state when the checkpoint was written by the same layout; otherwise
// it stays as set-up made it (zero errors; PowerSGD's fixed random Q), with a notice: the chunks
// and the residuals they hold belong to other ranks.
static int read_errors(neox_trainer *t, const neox_ckpt_reader *r, const char *dir, neox_error *err) {
    const char *names[NEOX_EXCHANGE_BUFFERS];
    float *bufs[NEOX_EXCHANGE_BUFFERS];
    size_t counts[NEOX_EXCHANGE_BUFFERS];
    int n = neox_grad_exchange_buffers(t->exchange, names, bufs, counts);
    if (n == 0) return 0;
    neox_ckpt_manifest man;
    if (neox_ckpt_manifest_read(dir, &man, err) != 0) return -1;
    const neox_grid *g = t->grid;
    int same = man.pipe_size == g->pipe_size && man.data_size == g->data_size && man.model_size == g->model_size;
    char name[NEOX_EXCHANGE_BUFFERS][96];
    for (int b = 0; b < n; b++) {
        error_name(t, names[b], name[b], sizeof name[b]);
        int ndim;
        int64_t shape[4];
        same = same && neox_ckpt_has(r, name[b]) && neox_ckpt_tensor_shape(r, name[b], &ndim, shape, err) == 0 &&
               ndim == 1 && shape[0] == (int64_t)counts[b];
    }
    for (int b = 0; same && b < n; b++)
        if (read_error(t, r, name[b], bufs[b], counts[b], err) != 0) return -1;
    if (!same && t->rank0 && !t->opts.quiet)
        neox_notice("compression error buffers start from zero: the checkpoint has another layout or none (written by "
                    "%d x %d x %d pipe x data x model ranks, now %d x %d x %d)", man.pipe_size, man.data_size,
                    man.model_size, g->pipe_size, g->data_size, g->model_size);
    neox_ckpt_manifest_free(&man);
    return 0;
}

static int exchange_save_state(const neox_trainer *t, neox_ckpt_writer *w, json_t *state, neox_error *err) {
    if (state) {
        json_t *adaptive = neox_grad_exchange_state(t->exchange);
        if (adaptive) json_object_set_new(state, "gradient_compression", adaptive);
    }
    return w ? write_errors(t, w, err) : 0;
}

static int exchange_load_state(neox_trainer *t, const neox_ckpt_reader *r, json_t *state, const char *dir,
                               neox_error *err) {
    if (r && read_errors(t, r, dir, err) != 0) return -1;
    return state ? neox_grad_exchange_restore(t->exchange, json_object_get(state, "gradient_compression"), dir, err) : 0;
}

// ---- the exchange as a trainer part (parts.c) ---------------------------------------------------
// Made and freed with the trainer's partition (setup.c); its checkpoint state, memory and report
// go through the part's hooks.

// The compressors' error buffers go with the optimizer state (not with no_save_optim); the
// adaptive plan in use goes into the run state.
static int exchange_save(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    return exchange_save_state(t, neox_config_bool(t->cfg, no_save_optim) ? NULL : w, run_state, err);
}

// Restored with the optimizer state only, as GPT-NeoX restores what is optimizer state; the
// compression scheme in use not when fine-tuning.
static int exchange_load(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    if (!from->optimizer) return 0;
    return exchange_load_state(t, from->reader, from->finetune ? NULL : from->state, from->dir, err);
}

// The gradients (the flat buffer's resident part, ZeRO-2's partition sums) and their
// communication (wire copies, the collectives' temporaries, the compressors' error buffers).
static void exchange_memory(const neox_trainer *t, neox_memory_plan *p) {
    neox_grad_exchange_memory m = neox_grad_exchange_memory_of(t->exchange);
    p->grads += (double)m.grads;
    p->comm += (double)m.comm;
}

// gradient_compression: adaptive: per bucket, the steps reduced with each scheme.
static void exchange_report(neox_trainer *t, json_t *doc) {
    json_t *adaptive = doc ? neox_grad_exchange_report(t->exchange) : NULL;
    if (adaptive) json_object_set_new(doc, "gradient_compression_buckets", adaptive);
}

const neox_train_part neox_train_exchange_part = {
    .name = "gradient exchange",
    .save = exchange_save,
    .load = exchange_load,
    .memory = exchange_memory,
    .report = exchange_report,
};
