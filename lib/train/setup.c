// setup.c: builds a trainer from a loaded config — tokenizer (for the vocabulary and the EOD id),
// model (created, initialised from the seed, activations planned), optimizer settings and state,
// LR schedule, datasets and batch iterators, metrics, the data-parallel gradient reducer and the
// checkpoint schedule — then loads the checkpoint `load` names.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

int neox_train_read_optimizer(const neox_config *cfg, neox_optimizer_settings *o, neox_error *err) {
    const char *type = neox_config_str(cfg, "optimizer_type");
    *o = (neox_optimizer_settings){0};
    if (type && !strcasecmp(type, "sgd")) {
        o->kind = NEOX_OPTIMIZER_SGD;
        o->momentum = neox_config_has(cfg, "sgd_momentum") ? neox_config_float(cfg, "sgd_momentum") : 0.0;
    } else if (!type || !strcasecmp(type, "adam")) {
        o->kind = NEOX_OPTIMIZER_ADAM;
        o->beta1 = neox_config_has(cfg, "adam_beta1") ? neox_config_float(cfg, "adam_beta1") : 0.9;
        o->beta2 = neox_config_has(cfg, "adam_beta2") ? neox_config_float(cfg, "adam_beta2") : 0.999;
        o->eps = neox_config_has(cfg, "adam_eps") ? neox_config_float(cfg, "adam_eps") : 1e-8;
    } else {
        return neox_fail(err, NEOX_EXIT_USAGE, "optimizer.type: '%s' is not supported by neox-train (adam, sgd)", type);
    }
    o->weight_decay = neox_config_float(cfg, "weight_decay");
    o->clip_grad = neox_config_has(cfg, "clip_grad") ? neox_config_float(cfg, "clip_grad") : 0.0;
    return 0;
}

int neox_train_read_schedule(const neox_config *cfg, neox_lr_schedule *lr, neox_error *err) {
    neox_lr_style style;
    const char *name = neox_config_str(cfg, "lr_decay_style");
    if (!name || neox_lr_style_parse(name, &style) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "lr_decay_style: '%s' is not constant, linear, cosine or exponential",
                         name ? name : "None");
    double start = neox_config_has(cfg, "lr") ? neox_config_float(cfg, "lr") : 0.001;
    int64_t decay = neox_config_has(cfg, "lr_decay_iters") ? neox_config_int(cfg, "lr_decay_iters")
                                                           : neox_config_int(cfg, "train_iters");
    *lr = neox_lr_schedule_make(start, neox_config_float(cfg, "min_lr"), neox_config_float(cfg, "warmup"), decay, style);
    return 0;
}

static int64_t config_int_or(const neox_config *cfg, const char *key, int64_t fallback) {
    return neox_config_has(cfg, key) ? neox_config_int(cfg, key) : fallback;
}

static int check_layout(const neox_trainer *t, neox_error *err) {
    if (t->grid->model_size > 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "model_parallel_size: tensor parallelism is not implemented in neox-train yet");
    if (t->grid->pipe_size > 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "pipe_parallel_size: pipeline parallelism is not implemented in neox-train yet");
    if (!neox_config_has(t->cfg, "train_iters"))
        return neox_fail(err, NEOX_EXIT_USAGE, "train_iters: not set (neox-train trains for a number of iterations)");
    const char *precision = neox_config_str(t->cfg, "precision");
    if (t->rank0 && !t->opts.quiet && precision && strcmp(precision, "fp32") != 0)
        neox_notice("precision %s: the CPU backend trains in fp32 (parameters, gradients and optimizer state)", precision);
    return 0;
}

static int setup_model(neox_trainer *t, neox_error *err) {
    const neox_config *cfg = t->cfg;
    neox_tokenizer_options to = {neox_config_str(cfg, "tokenizer_type"), neox_config_str(cfg, "vocab_file"),
                                 neox_config_str(cfg, "merge_file")};
    t->tokenizer = neox_tokenizer_load(&to, err);
    if (!t->tokenizer) return neox_fail_context(err, "tokenizer_type %s", to.type ? to.type : "None");
    t->eod_id = neox_tokenizer_eod_id(t->tokenizer);
    neox_model_desc desc;
    if (neox_model_desc_from_config(&desc, cfg, neox_tokenizer_vocab_size(t->tokenizer), err) != 0) return -1;
    t->model = neox_model_create(&desc, err);
    if (!t->model) return -1;
    neox_model_init(t->model, t->state.seed);
    return neox_model_plan(t->model, t->micro_batch, t->seq_length, err);
}

static int setup_optimizer(neox_trainer *t, neox_error *err) {
    if (neox_train_read_optimizer(t->cfg, &t->optim, err) != 0 || neox_train_read_schedule(t->cfg, &t->lr, err) != 0)
        return -1;
    size_t n = t->model->num_floats;
    t->exp_avg = neox_calloc(n, sizeof(float));
    if (t->optim.kind == NEOX_OPTIMIZER_ADAM) t->exp_avg_sq = neox_calloc(n, sizeof(float));
    if (t->grid->data_size > 1) {
        // ZeRO partitioning saves memory only; every rank keeps the whole optimizer state here and
        // the gradients are all-reduced (stage 0), which gives the same updates.
        int stage = (int)config_int_or(t->cfg, "zero_stage", 0);
        if (stage > 0 && t->rank0 && !t->opts.quiet)
            neox_notice("zero_optimization.stage %d: optimizer state is not partitioned yet; gradients are all-reduced",
                        stage);
        const neox_model *m = t->model;
        size_t *offset = neox_malloc((size_t)m->nparams * sizeof *offset), *size = neox_malloc((size_t)m->nparams * sizeof *size);
        for (int p = 0; p < m->nparams; p++) offset[p] = m->params[p].offset, size[p] = m->params[p].numel;
        int64_t bucket = config_int_or(t->cfg, "zero_reduce_bucket_size", 500000000);
        neox_grad_reducer_options ro = {.bucket_bytes = (size_t)bucket * 4, .zero_stage = 0, .overlap = 0,
                                        .predivide_factor = 1.0};
        t->reducer = neox_grad_reducer_make(&t->grid->data, m->grad_buf, n, offset, size, m->nparams, &ro);
        free(offset);
        free(size);
    }
    return 0;
}

static int setup_data(neox_trainer *t, neox_error *err) {
    if (neox_data_settings_from_config(t->cfg, &t->data_settings, err) != 0) return -1;
    t->data_settings.train_batch_size = t->train_batch_size;
    t->data_settings.train_iters = t->train_iters;
    if (neox_build_datasets(&t->data_settings, t->datasets, err) != 0) return -1;
    if (!t->datasets[0]) return neox_fail(err, NEOX_EXIT_USAGE, "data_path: the training split has no samples");
    int eod_mask = neox_config_bool(t->cfg, "eod_mask_loss");
    int dp = t->grid->data_size, rank = t->grid->data_rank;
    neox_batch_iterator_init(&t->train_it, t->datasets[0], t->micro_batch, dp, rank, t->eod_id, eod_mask);
    if (t->datasets[1]) neox_batch_iterator_init(&t->valid_it, t->datasets[1], t->micro_batch, dp, rank, t->eod_id, eod_mask);
    t->batch = neox_batch_alloc(t->micro_batch, t->seq_length);
    return 0;
}

static int setup_metrics(neox_trainer *t, neox_error *err) {
    const neox_model_desc *d = &t->model->desc;
    neox_flops_model fm = {d->num_layers, d->hidden_size, d->vocab_size, t->seq_length, t->train_batch_size,
                           d->checkpoint_activations};
    neox_metrics_options mo = {
        .rank = t->grid->world_rank,
        .world_size = t->grid->world_size,
        .train_iters = t->train_iters,
        .log_interval = config_int_or(t->cfg, "log_interval", 100),
        .train_batch_size = t->train_batch_size,
        .seq_length = t->seq_length,
        .flops_per_iteration = neox_flops_per_iteration(&fm),
        .wall_clock_breakdown = neox_config_bool(t->cfg, "wall_clock_breakdown"),
        .log_dir = neox_config_str(t->cfg, "log_dir"),
        .tensorboard_dir = neox_config_str(t->cfg, "tensorboard_dir"),
    };
    t->metrics = neox_metrics_open(&mo, err);
    return t->metrics ? 0 : -1;
}

static void setup_checkpoint_schedule(neox_trainer *t) {
    t->save_dir = neox_config_str(t->cfg, "save");
    t->load_dir = neox_config_str(t->cfg, "load");
    t->keep_last = (int)config_int_or(t->cfg, "keep_last_n_checkpoints", 0);
    t->last_saved = -1;
    const neox_value *v = neox_config_has(t->cfg, "save_iters") ? neox_config_value(t->cfg, "save_iters") : NULL;
    if (v && v->kind == NEOX_VALUE_LIST) {
        t->save_iters = neox_calloc((size_t)v->count + 1, sizeof *t->save_iters);
        for (int i = 0; i < v->count; i++)
            if (v->items[i]->kind == NEOX_VALUE_INT) t->save_iters[t->nsave_iters++] = v->items[i]->integer;
    }
}

neox_trainer *neox_trainer_create(const neox_config *cfg, neox_grid *grid, const neox_train_options *opts,
                                  neox_error *err) {
    neox_trainer *t = neox_calloc(1, sizeof *t);
    t->cfg = cfg;
    t->grid = grid;
    if (opts) t->opts = *opts;
    t->rank0 = grid->world_rank == 0;
    t->micro_batch = (int)neox_config_int(cfg, "train_micro_batch_size_per_gpu");
    t->grad_accum = (int)neox_config_int(cfg, "gradient_accumulation_steps");
    t->seq_length = (int)neox_config_int(cfg, "seq_length");
    t->train_iters = config_int_or(cfg, "train_iters", 0);
    t->train_batch_size = neox_config_int(cfg, "train_batch_size");
    t->state.seed = (uint64_t)neox_config_int(cfg, "seed");
    setup_checkpoint_schedule(t);
    if (check_layout(t, err) != 0 || setup_model(t, err) != 0 || setup_optimizer(t, err) != 0 ||
        setup_data(t, err) != 0 || neox_train_load(t, err) != 0 || setup_metrics(t, err) != 0) {
        neox_trainer_free(t);
        return NULL;
    }
    if (t->rank0 && !t->opts.quiet) {
        char params[16];
        neox_info("model: %s parameters, %d layers, hidden %d, vocabulary %d (padded); %d ranks (data parallel %d)",
                  neox_format_count((double)t->model->num_floats, params, sizeof params), t->model->desc.num_layers,
                  t->model->desc.hidden_size, t->model->desc.vocab_size, grid->world_size, grid->data_size);
        neox_info("batch: %lld samples per iteration = micro-batch %d x accumulation %d x data parallel %d; seq %d",
                  (long long)t->train_batch_size, t->micro_batch, t->grad_accum, grid->data_size, t->seq_length);
    }
    return t;
}

void neox_trainer_free(neox_trainer *t) {
    if (!t) return;
    neox_error ignored = {0};
    neox_metrics_close(t->metrics, &ignored);
    neox_batch_free(t->batch);
    for (int i = 0; i < 3; i++) neox_dataset_free(t->datasets[i]);
    neox_data_settings_release(&t->data_settings);
    if (t->reducer) neox_grad_reducer_free(t->reducer);
    free(t->exp_avg);
    free(t->exp_avg_sq);
    neox_model_free(t->model);
    if (t->tokenizer) neox_tokenizer_free(t->tokenizer);
    free(t->save_iters);
    free(t);
}

int64_t neox_trainer_iteration(const neox_trainer *t) { return t->state.iteration; }
