// checkpoint.c: saving and loading training checkpoints (docs/checkpoints.md, "Training
// checkpoints"). Every rank writes rank_RRRRR.h5 holding its data-parallel share (under ZeRO its
// partition) of its own flat buffers — parameters = the fp32 master weights, Adam moments or the
// SGD momentum — as blocks of the global tensors, so a checkpoint can be read back by any layout
// (tensor-parallel blocks, pipe stages and data-parallel ranges intersect freely); rank 0 adds the run state (iteration, optimizer step,
// RNG, data positions, model shape) as JSON, the effective config and the input YAML files, all
// into a temporary directory. The registered parts (parts.c) save and load their own tensors and
// run-state keys (the LR schedule, the loss scaler, DPO's reference, the compressors' state) in one
// walk each way. After every shard is in place rank 0 writes manifest.json
// from the sizes and CRC-32s each rank took while writing (no shard is read back), switches the
// directory into place as SAVE/global_stepN, and only then moves `latest`.
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "internal.h"

static const char *optimizer_name(neox_optimizer_kind k) { return neox_optimizer_type_of(k)->name; }

// The state buffers of the optimizer, by the names they carry in checkpoints.
static int optimizer_buffers(const neox_trainer *t, const char **names, float **bufs) {
    const neox_optimizer *o = t->optimizer;
    for (int i = 0; i < o->nstate; i++) names[i] = o->type->state_names[i], bufs[i] = o->state[i];
    return o->nstate;
}

static int saves_no_optimizer(const neox_trainer *t) { return neox_config_bool(t->cfg, no_save_optim); }

static json_t *state_json(const neox_trainer *t) {
    const neox_train_state *s = &t->state;
    json_t *files = json_array();
    for (int i = 0; i < neox_config_file_count(t->cfg); i++) {
        char *copy = neox_strdup(neox_config_file_path(t->cfg, i));
        json_array_append_new(files, json_sprintf("config/input/%d-%s", i, basename(copy)));
        free(copy);
    }
    // no_save_rng: the seed and dropout counter are absent, which a resume (and neox-convert) reads as
    // "not stored".
    neox_run_counters c = {.iteration = s->iteration, .optimizer_steps = s->optimizer_steps,
                           .train_samples = s->train_position * t->micro_batch * neox_grid_sample_ways(t->grid),
                           .train_position = s->train_position, .valid_position = s->valid_position,
                           .skipped_total = s->skipped_total, .nonfinite_in_a_row = s->nonfinite_in_a_row,
                           .overflow_skips = s->overflow_skips, .seed = s->seed, .dropout_rows = s->dropout_rows,
                           .has_rng = !neox_config_bool(t->cfg, no_save_rng)};
    json_t *state = neox_ckpt_run_state_json(&c, &t->model->desc, files);
    // no_save_optim: no optimizer named, as no optimizer state is stored.
    if (!saves_no_optimizer(t)) json_object_set_new(state, "optimizer", json_string(optimizer_name(t->optim.kind)));
    return state;  // (the parts add theirs: neox_train_parts_save)
}

// ---- saving --------------------------------------------------------------------------------------
// Whether this rank writes parameter p: replicated tensors are written by tensor-parallel rank 0,
// the tied embedding by the first stage.
static int writes(const neox_trainer *t, const neox_param *p) {
    return !p->tied_copy && (p->split != NEOX_SPLIT_NONE || t->grid->model_rank == 0);
}

// Writes elements [part_begin, part_end) of a flat buffer (this rank's data-parallel share; buf[0]
// is element `base`) as blocks of the global tensors.
static int write_share(const neox_trainer *t, neox_ckpt_writer *w, const char *group, const float *buf, size_t base,
                       neox_error *err) {
    size_t begin = t->part_begin, end = t->part_end;
    for (int i = 0; i < t->model->nparams; i++) {
        const neox_param *p = &t->model->params[i];
        size_t lo, hi;
        if (!neox_overlap(p->offset, p->offset + p->numel, begin, end, &lo, &hi) || !writes(t, p) ||
            !neox_train_ep_writes(t, i))
            continue;
        char name[160];
        snprintf(name, sizeof name, "%s/%s", group, p->name);
        const float *data = buf + (lo - base);
        if (p->split != NEOX_SPLIT_COLS || t->grid->model_size == 1) {
            // The block is contiguous in the global tensor: one flat range.
            int64_t start = p->block_offset[0] * (p->ndim == 2 ? p->global_shape[1] : 1) + (int64_t)(lo - p->offset);
            if (neox_ckpt_write_range(w, name, p->ndim, p->global_shape, start, (int64_t)(hi - lo), data, err) != 0) return -1;
            continue;
        }
        neox_param_piece pieces[3];
        int n = neox_param_pieces(p, lo - p->offset, hi - p->offset, pieces);
        for (int k = 0; k < n; k++)
            if (neox_ckpt_write_block(w, name, p->ndim, p->global_shape, pieces[k].offset, pieces[k].count,
                                      buf + (p->offset - base) + pieces[k].start, err) != 0)
                return -1;
    }
    return 0;
}

// write_share from memory of backend be: on a device, this rank's share is first copied to the host.
static int write_share_on(const neox_trainer *t, const neox_backend *be, neox_ckpt_writer *w, const char *group,
                          const float *buf, size_t base, neox_error *err) {
    if (!be->on_device || t->part_end <= t->part_begin) return write_share(t, w, group, buf, base, err);
    size_t n = t->part_end - t->part_begin;
    float *host = neox_malloc(n * sizeof(float));
    be->to_host(host, buf + (t->part_begin - base), n * sizeof(float));
    int rc = write_share(t, w, group, host, t->part_begin, err);
    free(host);
    return rc;
}

int neox_train_write_share_of(const neox_trainer *t, neox_ckpt_writer *w, const char *group, const float *buf,
                              size_t base, neox_error *err) {
    return write_share_on(t, t->model->be, w, group, buf, base, err);
}

// The run state (rank 0's state/train.json), the effective config and the input YAML files.
static int write_run_files(const neox_trainer *t, neox_ckpt_writer *w, json_t *state, neox_error *err) {
    char *text = json_dumps(state, JSON_INDENT(2) | JSON_SORT_KEYS);
    int rc = neox_ckpt_write_bytes(w, "state/train.json", text, strlen(text), err);
    free(text);
    char *effective = NULL;
    size_t size = 0;
    FILE *mem = open_memstream(&effective, &size);
    neox_config_print_as(t->cfg, "json", mem);
    fclose(mem);
    if (rc == 0) rc = neox_ckpt_write_bytes(w, "config/effective.json", effective, size, err);
    free(effective);
    json_t *files = json_object_get(state, "config_files");
    for (int i = 0; rc == 0 && i < neox_config_file_count(t->cfg); i++) {
        size_t n;
        char *yaml = neox_read_file(neox_config_file_path(t->cfg, i), &n, err);
        rc = yaml ? neox_ckpt_write_bytes(w, json_string_value(json_array_get(files, (size_t)i)), yaml, n, err) : -1;
        free(yaml);
    }
    return rc;
}

// Writes this rank's shard; *entry gets its manifest entry (size and CRC-32, taken while writing).
static int write_shard(const neox_trainer *t, const char *dir, neox_ckpt_file_entry *entry, neox_error *err) {
    char name[32];
    neox_ckpt_shard_name(t->grid->world_rank, name, sizeof name);
    char *path = neox_asprintf("%s/%s", dir, name);
    neox_ckpt_writer *w = neox_ckpt_writer_open(path, err);
    free(path);
    if (!w) return -1;
    const char *names[NEOX_OPTIMIZER_MAX_STATE];
    float *bufs[NEOX_OPTIMIZER_MAX_STATE];
    int nbufs = saves_no_optimizer(t) ? 0 : optimizer_buffers(t, names, bufs);
    // (ZeRO-3: the partition's master weights; the flat buffer holds only gathered units)
    int rc = t->param_partition ? neox_train_write_share_of(t, w, "params", t->param_partition, t->part_begin, err)
                                : neox_train_write_share_of(t, w, "params", t->model->param_buf, 0, err);
    for (int b = 0; rc == 0 && b < nbufs; b++)  // (where the optimizer keeps it: offloaded, in host memory)
        rc = write_share_on(t, t->optimizer->be, w, names[b], bufs[b], t->state_begin, err);
    if (rc == 0 && !saves_no_optimizer(t)) rc = neox_train_save_accumulators(t, w, err);
    json_t *state = t->rank0 ? state_json(t) : NULL;
    if (rc == 0) rc = neox_train_parts_save(t, w, state, err);
    if (rc == 0 && t->rank0) rc = write_run_files(t, w, state, err);
    json_decref(state);
    if (rc != 0) {
        neox_ckpt_writer_abort(w);
        return -1;
    }
    return neox_ckpt_writer_close_entry(w, entry, err);
}

// Every rank's manifest entry on every rank (rank 0 writes the manifest without reading a shard).
static void gather_entries(neox_trainer *t, const neox_ckpt_file_entry *mine, neox_ckpt_file_entry *all) {
    int n = t->grid->world_size;
    int64_t sizes[2] = {(int64_t)mine->bytes, (int64_t)mine->crc32}, *every = neox_calloc((size_t)n * 2, sizeof *every);
    if (n > 1) neox_allgather(&t->grid->world, sizes, every, 2, NEOX_I64);
    else memcpy(every, sizes, sizeof sizes);
    for (int r = 0; r < n; r++) {
        neox_ckpt_shard_name(r, all[r].name, sizeof all[r].name);
        all[r].rank = r;
        all[r].bytes = (uint64_t)every[2 * r];
        all[r].crc32 = (uint32_t)every[2 * r + 1];
    }
    free(every);
}

static int write_manifest(const neox_trainer *t, const char *dir, neox_ckpt_file_entry *files, neox_error *err) {
    neox_ckpt_manifest m = {.iteration = t->state.iteration, .world_size = t->grid->world_size,
                            .pipe_size = t->grid->pipe_size, .data_size = t->grid->data_size,
                            .model_size = t->grid->model_size, .zero_stage = t->zero_stage,
                            .nfiles = t->grid->world_size, .files = files};
    return neox_ckpt_manifest_write(dir, &m, err);
}

// A failure on any rank fails the save on every rank (no rank waits for a checkpoint that will
// never be complete).
static int all_ranks_ok(neox_trainer *t, int rc) {
    int failed = rc != 0;
    if (t->grid->world_size > 1) neox_allreduce_sum(&t->grid->world, &failed, 1, NEOX_I32);
    return failed == 0;
}

// The temporary directory rank 0 created, on every rank (NULL on all when it could not).
static char *shared_dir_name(neox_trainer *t, char *mine) {
    char name[4096] = "";
    if (mine) snprintf(name, sizeof name, "%s", mine);
    if (t->grid->world_size > 1) neox_broadcast(&t->grid->world, name, sizeof name, NEOX_U8, 0);
    return name[0] ? neox_strdup(name) : NULL;
}

// Every shard and the manifest go into a temporary directory, switched into place whole before
// `latest` moves (the directory `latest` names is never modified).
static int write_checkpoint(neox_trainer *t, const char *tmp, neox_error *err) {
    neox_ckpt_file_entry mine = {0}, *files = neox_calloc((size_t)t->grid->world_size, sizeof *files);
    int rc = write_shard(t, tmp, &mine, err);
    if (!all_ranks_ok(t, rc)) {
        free(files);
        return rc ? rc : neox_fail(err, NEOX_EXIT_FAILURE, "another rank failed to write its shard");
    }
    gather_entries(t, &mine, files);
    if (t->rank0) {
        rc = write_manifest(t, tmp, files, err);
        if (rc == 0) rc = neox_ckpt_switch_dir(t->save_dir, t->state.iteration, tmp, err);
        if (rc == 0) rc = neox_ckpt_mark_latest(t->save_dir, t->state.iteration, t->keep_last, err);
        if (rc == 0) rc = neox_metrics_flush(t->metrics, err);
    }
    free(files);
    return rc;
}

// The phases of a save, each ended by agreeing over all ranks that it succeeded.
static int save_phases(neox_trainer *t, const char *dir, neox_error *err) {
    char *made = t->rank0 ? neox_ckpt_begin_dir(t->save_dir, t->state.iteration, err) : NULL;
    char *tmp = shared_dir_name(t, made);
    int rc = tmp ? 0 : -1;
    if (!tmp) {
        if (!t->rank0) neox_fail(err, NEOX_EXIT_FAILURE, "rank 0 could not create %s", dir);
    } else {
        rc = write_checkpoint(t, tmp, err);
    }
    if (rc != 0 && t->rank0) neox_remove_tree(tmp);
    free(made);
    free(tmp);
    if (!all_ranks_ok(t, rc)) return rc ? rc : neox_fail(err, NEOX_EXIT_FAILURE, "rank 0 failed to complete %s", dir);
    return 0;
}

int neox_train_save(neox_trainer *t, neox_error *err) {
    double start = neox_now();
    neox_train_offload_settle(t);
    char *dir = neox_ckpt_dir(t->save_dir, t->state.iteration);
    neox_range_push("checkpoint save");
    int rc = save_phases(t, dir, err);
    neox_range_pop();
    if (rc == 0) {
        t->last_saved = t->state.iteration;
        if (t->rank0 && !t->opts.quiet) neox_info("saved checkpoint %s in %.2f s", dir, neox_now() - start);
    } else {
        neox_fail_context(err, "saving checkpoint %s", dir);
    }
    free(dir);
    return rc;
}

// ---- loading -------------------------------------------------------------------------------------
static int64_t json_int_field(json_t *obj, const char *key) { return (int64_t)json_integer_value(json_object_get(obj, key)); }

// Whether the optimizer state (moments, step count, LR schedule) is loaded: not with finetune or
// no_load_optim, nor from a checkpoint saved without it (no_save_optim), which a notice says.
static int loads_optimizer(const neox_trainer *t, json_t *state, const char *dir) {
    if (neox_config_bool(t->cfg, finetune) || neox_config_bool(t->cfg, no_load_optim)) return 0;
    if (json_object_get(state, "optimizer")) return 1;
    if (t->rank0 && !t->opts.quiet)
        neox_notice("%s holds no optimizer state (saved with no_save_optim): the optimizer starts afresh (moments zero, "
                    "bias correction from step 1, the config's LR schedule)", dir);
    return 0;
}

// Whether the RNG state is loaded. A checkpoint saved with no_save_rng re-seeds, as no_load_rng
// does: the dropout stream restarts from the config's seed with its counter at zero.
static int loads_rng(const neox_trainer *t, json_t *state, const char *dir) {
    if (neox_config_bool(t->cfg, finetune) || neox_config_bool(t->cfg, no_load_rng)) return 0;
    if (json_object_get(state, "seed")) return 1;
    if (t->rank0 && !t->opts.quiet)
        neox_notice("%s holds no RNG state (saved with no_save_rng): re-seeding from the config's seed %llu (the dropout "
                    "stream restarts as in a new run)", dir, (unsigned long long)t->state.seed);
    return 0;
}

static int restore_state(neox_trainer *t, json_t *state, int load_optim, int load_rng, neox_error *err) {
    const neox_config *cfg = t->cfg;
    int finetune = neox_config_bool(cfg, finetune);
    int no_optim = !load_optim, no_rng = !load_rng;
    if (!finetune) {
        neox_train_state *s = &t->state;
        s->iteration = json_int_field(state, "iteration");
        // Positions count batches of (micro-batch x data-parallel size) samples, which differ
        // between layouts; train_samples (the samples consumed) does not.
        int64_t per_batch = (int64_t)t->micro_batch * neox_grid_sample_ways(t->grid);
        json_t *samples = json_object_get(state, "train_samples");
        s->train_position = json_int_field(state, "train_position");
        if (json_is_integer(samples)) {
            if (json_integer_value(samples) % per_batch != 0)
                return neox_fail(err, NEOX_EXIT_USAGE, "the checkpoint consumed %lld training samples, not a whole number "
                                 "of micro-batches (%d) x data-parallel ranks (%d); keep the global batch of the run that "
                                 "wrote it", (long long)json_integer_value(samples), t->micro_batch,
                                 neox_grid_sample_ways(t->grid));
            s->train_position = json_integer_value(samples) / per_batch;
        }
        // The valid split is read on from where the evaluations of iterations 1..N left it, as if
        // the run had not stopped (the checkpoint of iteration N is written before its evaluation).
        int64_t eval_interval = neox_config_int(cfg, eval_interval);
        s->valid_position = eval_interval > 0 ? s->iteration / eval_interval * neox_config_int(cfg, eval_iters) * t->grad_accum : 0;
        s->skipped_total = json_int_field(state, "skipped_total");
        s->nonfinite_in_a_row = json_int_field(state, "nonfinite_in_a_row");
        s->overflow_skips = json_int_field(state, "overflow_skips");
        if (!no_optim) s->optimizer_steps = json_int_field(state, "optimizer_steps");
        neox_batch_iterator_seek(&t->train_it, s->train_position);
        if (t->datasets[1]) neox_batch_iterator_seek(&t->valid_it, s->valid_position);
        t->last_saved = s->iteration;
    }
    if (!no_rng) {
        t->state.seed = (uint64_t)json_int_field(state, "seed");
        // Checkpoints from before the counter counted rows hold dropout_draws instead; every sample
        // consumed drew masks once unless the run was re-seeded.
        json_t *rows = json_object_get(state, "dropout_rows");
        t->state.dropout_rows = rows ? json_int_field(state, "dropout_rows")
                                     : json_int_field(state, "train_samples") * neox_train_rows_per_sample(cfg);
    }
    return 0;
}

// The weights this rank keeps: the whole flat buffer, or under ZeRO-3 its partition's master
// weights only (read straight into the partition, so the whole model is never resident). A reward
// model started from a language model's checkpoint (finetune) finds no value head there: it keeps
// its initialisation, as GPT-NeoX builds the head anew, and the rest is read.
static int read_params(neox_trainer *t, const neox_ckpt_reader *r, const char *dir, neox_error *err) {
    neox_model *m = t->model;
    size_t begin = t->param_partition ? t->part_begin : 0, end = t->param_partition ? t->part_end : m->num_floats;
    float *dst = t->param_partition ? t->param_partition : m->param_buf;
    if (!m->desc.value_head || neox_ckpt_has(r, "params/score.weight"))
        return neox_ckpt_read_model_range(m, r, "params", begin, end, dst, err);
    if (!neox_config_bool(t->cfg, finetune))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s holds a language model (no value head score.weight); start a reward "
                         "model from it with finetune: true", dir);
    if (t->rank0 && !t->opts.quiet)
        neox_notice("%s holds a language model: the reward model's value head (score.weight) starts from its "
                    "initialisation, the other weights are loaded", dir);
    neox_train_init_weights(t);  // (only the value head's survives the read)
    const neox_param *head = neox_model_find_param(m, "score.weight");
    if (!head) return neox_ckpt_read_model_range(m, r, "params", begin, end, dst, err);  // (not on this pipe stage)
    size_t skip_lo = head->offset, skip_hi = head->offset + head->numel;
    int rc = 0;
    if (begin < skip_lo) rc = neox_ckpt_read_model_range(m, r, "params", begin, skip_lo < end ? skip_lo : end, dst, err);
    if (rc == 0 && skip_hi < end) {
        size_t from = skip_hi > begin ? skip_hi : begin;
        rc = neox_ckpt_read_model_range(m, r, "params", from, end, dst + (from - begin), err);
    }
    return rc;
}

static int load_from(neox_trainer *t, const char *dir, neox_error *err) {
    neox_ckpt_reader *r = neox_ckpt_open_checkpoint(dir, err);
    json_t *state = NULL;
    int rc = r ? neox_ckpt_read_run_state(r, dir, &state, err) : -1;
    if (rc == 0) rc = neox_ckpt_check_model_shape(&t->model->desc, state, dir, NEOX_EXIT_USAGE, err);
    if (rc == 0) rc = read_params(t, r, dir, err);
    // A valid CRC-32 does not make the values trainable: a resume from NaN or inf would continue a
    // dead run. (A fine-tuning start from such weights is stopped by the first save or the run's
    // end, which refuse non-finite weights, with the NaN steps logged as such.)
    if (rc == 0 && !neox_config_bool(t->cfg, finetune))
        rc = t->param_partition ? neox_model_check_finite_state(t->model, t->param_partition, t->part_begin, t->part_end,
                                                                "params", err)
                                : neox_model_check_finite_state(t->model, t->model->param_buf, 0, t->model->num_floats,
                                                                "params", err);
    neox_model_weights_changed(t->model);
    int load_optim = rc == 0 && loads_optimizer(t, state, dir), load_rng = rc == 0 && loads_rng(t, state, dir);
    if (load_optim) {
        const char *saved = json_string_value(json_object_get(state, "optimizer"));
        if (!saved || strcmp(saved, optimizer_name(t->optim.kind)) != 0)
            rc = neox_fail(err, NEOX_EXIT_USAGE, "optimizer.type: the checkpoint holds %s state, the config asks for %s "
                           "(set no_load_optim: true to start the optimizer afresh)", saved ? saved : "no", optimizer_name(t->optim.kind));
        const char *names[NEOX_OPTIMIZER_MAX_STATE];
        float *bufs[NEOX_OPTIMIZER_MAX_STATE];
        int nbufs = optimizer_buffers(t, names, bufs);
        // The state is read where it lives: offloaded, on the host (the model's layout, the CPU backend).
        neox_model host_view = *t->model;
        host_view.be = t->optimizer->be;
        for (int b = 0; rc == 0 && b < nbufs; b++)
            if ((rc = neox_ckpt_read_model_range(&host_view, r, names[b], t->state_begin, t->state_end, bufs[b], err)) == 0)
                rc = neox_model_check_finite_state(&host_view, bufs[b], t->state_begin, t->state_end, names[b], err);
        if (rc == 0) rc = neox_train_load_accumulators(t, r, err);
    }
    if (rc == 0) rc = restore_state(t, state, load_optim, load_rng, err);
    neox_part_loading from = {.reader = r, .state = state, .dir = dir, .optimizer = load_optim,
                              .finetune = neox_config_bool(t->cfg, finetune)};
    if (rc == 0) rc = neox_train_parts_load(t, &from, err);
    json_decref(state);
    neox_ckpt_reader_close(r);
    return rc;
}

// The weights come from the checkpoint or, with none to load, from the seed: never both (initialising
// 100M+ parameters only to overwrite them cost seconds per run).
int neox_train_load(neox_trainer *t, neox_error *err) {
    if (!t->load_dir) {
        neox_train_init_weights(t);
        return 0;
    }
    int64_t iteration;
    int found;
    if (neox_ckpt_read_latest(t->load_dir, &iteration, &found, err) != 0) return -1;
    if (!found) {
        if (t->rank0 && !t->opts.quiet)
            neox_notice("load: no checkpoint in %s (no 'latest' file); training from scratch", t->load_dir);
        neox_train_init_weights(t);
        return 0;
    }
    char *dir = neox_ckpt_dir(t->load_dir, iteration);
    int rc = load_from(t, dir, err);
    if (rc != 0) neox_fail_context(err, "loading checkpoint %s", dir);
    else if (t->rank0 && !t->opts.quiet)
        neox_info("loaded checkpoint %s (iteration %lld)", dir, (long long)t->state.iteration);
    free(dir);
    return rc;
}
