// loop.c: the training loop as GPT-NeoX's train() and pretrain() run it: step, log, save at the
// iterations of save_iters, evaluate every eval_interval, exit at exit_interval; then the final
// validation, the final save and the test evaluation. SIGTERM, SIGHUP and SIGUSR1 (SLURM's
// warning before a time limit) stop the loop after the step in flight, with a checkpoint. A step
// whose values the device still holds (the late read, step.c) is logged once they are read: after
// the next step is queued, or at once when anything follows it (a checkpoint, an evaluation, the
// exit, the end), so every line and metric comes out the same and in the same place.
#include <math.h>
#include <signal.h>
#include <string.h>

#include "internal.h"

volatile sig_atomic_t neox_train_stop_signal = 0;

static void on_stop_signal(int sig) { neox_train_stop_signal = sig; }

void neox_train_install_signal_handlers(void) { neox_set_stop_handler(on_stop_signal); }

// Every rank stops at the same step when any rank got the signal.
static int stop_requested(neox_trainer *t) {
    int stop = neox_train_stop_signal != 0;
    if (t->grid->world_size > 1) neox_allreduce_sum(&t->grid->world, &stop, 1, NEOX_I32);
    return stop != 0;
}

static int is_save_iteration(const neox_trainer *t, int64_t iteration) {
    for (int i = 0; i < t->nsave_iters; i++)
        if (t->save_iters[i] == iteration) return 1;
    return 0;
}

static int do_split(const neox_trainer *t, neox_key_id key, int split) {
    if (!t->datasets[split]) return 0;
    return neox_config_has_id(t->cfg, key) ? neox_config_bool_id(t->cfg, key) : 1;
}

// eval_tasks are scored with the validation evaluations, or with the test evaluation when the
// run ends without a validation evaluation.
static int evaluate(neox_trainer *t, int split, const char *chart, const char *prefix, int with_tasks, neox_error *err) {
    neox_batch_iterator test_it, *it = &t->valid_it;
    if (split == 2) {
        neox_batch_iterator_init(&test_it, t->datasets[2], t->micro_batch, neox_grid_sample_ways(t->grid),
                                 neox_grid_sample_rank(t->grid),
                                 t->eod_id, neox_config_bool(t->cfg, eod_mask_loss));
        it = &test_it;
    }
    return neox_train_evaluate_and_log(t, it, chart, prefix, with_tasks, err);
}

// Every rank's weights are finite; otherwise fails on every rank (naming the parameter on the
// rank that holds it), so no rank goes on to save or report a diverged model.
static int check_finite_weights(neox_trainer *t, const char *what, neox_error *err) {
    char where[96];
    snprintf(where, sizeof where, "iteration %lld: %s", (long long)t->state.iteration, what);
    neox_train_offload_settle(t);
    int bad = t->param_partition ? neox_model_check_finite_state(t->model, t->param_partition, t->part_begin, t->part_end,
                                                                 "params", err) != 0
                                 : neox_model_check_finite(t->model, where, err) != 0;
    if (t->grid->world_size > 1) neox_allreduce_sum(&t->grid->world, &bad, 1, NEOX_I32);
    if (bad && !err->status) neox_fail(err, NEOX_EXIT_FAILURE, "%s: another rank's weights hold NaN or inf", where);
    return bad ? -1 : 0;
}

// A checkpoint is saved only of finite weights: a diverged run stops with an error instead.
static int save_checkpoint(neox_trainer *t, neox_error *err) {
    if (check_finite_weights(t, "not saving a checkpoint", err) != 0) return -1;
    return neox_train_save(t, err);
}

// Under wall_clock_breakdown, at each log line (rank 0): the per-op profile's table by op class beside
// the timer lines, and log_dir/op_profile.json rewritten with everything so far (docs/metrics.md).
static int report_op_profile(const neox_trainer *t, int64_t iteration, neox_error *err) {
    int64_t every = neox_config_int(t->cfg, log_interval);
    if (!neox_profile_inner() || t->grid->world_rank != 0 || iteration % every != 0) return 0;
    neox_profile_print_table(stdout, every);
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!dir || !*dir) return 0;
    char path[4096], msg[2048];
    snprintf(path, sizeof path, "%s/op_profile.json", dir);
    if (neox_profile_write_json(path, msg, sizeof msg) != 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s", msg);
    return 0;
}

void neox_train_add_step_metrics(neox_trainer *t, const neox_eval_value *values, int n) {
    for (int i = 0; i < n; i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "train/%.120s", values[i].name);
        neox_metrics_add(t->metrics, tag, values[i].value);
    }
}

static int record_step(neox_trainer *t, const neox_step_result *r, neox_error *err) {
    neox_train_state *s = &t->state;
    // fp16's forward may overflow to an inf loss that the loss scaler handles: not counted.
    int diverged = r->nonfinite_loss && t->precision != NEOX_PRECISION_FP16;
    t->nonfinite_loss_in_a_row = diverged ? t->nonfinite_loss_in_a_row + 1 : 0;
    if (r->skipped) {
        s->skipped_total++;
        s->nonfinite_in_a_row++;
    } else {
        s->nonfinite_in_a_row = 0;
    }
    neox_step_stats stats = {.iteration = r->iteration, .lm_loss = r->loss, .learning_rate = r->lr,
                             .grad_norm = r->grad_norm, .loss_scale = r->loss_scale, .skipped = r->skipped};
    neox_train_parts_log(t, &stats);  // (a collective)
    // The peak memory so far (gauges, written at each log, so gathered only then).
    if (r->iteration % neox_config_int(t->cfg, log_interval) == 0) neox_train_memory_gauges(t);
    if (neox_metrics_step(t->metrics, &stats, err) != 0 || report_op_profile(t, r->iteration, err) != 0) return -1;
    if (s->nonfinite_in_a_row >= NEOX_TRAIN_MAX_NONFINITE_IN_A_ROW)
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "stopping at iteration %lld: the last %d iterations had a non-finite loss or gradient norm "
                         "(with fp16: an overflow) (skipped %lld iterations in all); lower the learning rate or check the data",
                         (long long)r->iteration, NEOX_TRAIN_MAX_NONFINITE_IN_A_ROW, (long long)s->skipped_total);
    return 0;
}

// Whether after_step does anything after the step just queued (its log line must come first).
static int acts_after_step(const neox_trainer *t) {
    int64_t it = t->state.iteration;
    int64_t eval_interval = neox_config_int(t->cfg, eval_interval);
    int64_t exit_interval = neox_config_has(t->cfg, exit_interval) ? neox_config_int(t->cfg, exit_interval) : 0;
    return (t->save_dir && is_save_iteration(t, it)) || (eval_interval > 0 && it % eval_interval == 0) ||
           (exit_interval > 0 && it % exit_interval == 0) || it >= t->train_iters || neox_train_stop_signal != 0;
}

// Logs the step the late read has settled, if any, with the timers' work of that step added back
// (step.c kept it apart while the next step ran), so its timer line is its own.
static int record_settled(neox_trainer *t, neox_error *err) {
    neox_step_result r;
    neox_timer work[NEOX_TIMER_COUNT];
    if (!neox_train_take_settled(t, &r, work)) return 0;
    for (int i = 0; i < NEOX_TIMER_COUNT; i++) {
        neox_timer *timer = neox_metrics_timer(t->metrics, (neox_timer_name)i);
        timer->elapsed += work[i].elapsed, timer->count += work[i].count;
    }
    return record_step(t, &r, err);
}

// Reads and logs the step still queued, if any.
static int flush_late(neox_trainer *t, neox_error *err) {
    return neox_train_settle(t, err) != 0 ? -1 : record_settled(t, err);
}

// One step and the log lines now due: the previous step's, settled while this one was queued, and
// this one's unless its values are still on the device and nothing follows it yet.
static int step_and_log(neox_trainer *t, neox_error *err) {
    neox_step_result r;
    int64_t waits = neox_host_waits();
    neox_train_profile_begin_step(t);
    if (neox_train_step(t, &r, err) != 0 || neox_train_profile_end_step(t, err) != 0) return -1;
    if (neox_profile_inner()) neox_profile_note_step_host_waits(neox_host_waits() - waits);
    if (record_settled(t, err) != 0) return -1;
    if (!r.pending) return record_step(t, &r, err);
    return acts_after_step(t) ? flush_late(t, err) : 0;
}

// After each step: save, evaluate, maybe exit. Returns 1 to leave the loop with *status set.
static int after_step(neox_trainer *t, int *status, neox_error *err) {
    int64_t it = t->state.iteration;
    if (t->save_dir && is_save_iteration(t, it) && save_checkpoint(t, err) != 0) return -1;
    int64_t eval_interval = neox_config_int(t->cfg, eval_interval);
    if (eval_interval > 0 && it % eval_interval == 0 && do_split(t, NEOX_K_do_valid, 1)) {
        char prefix[48];
        snprintf(prefix, sizeof prefix, "iteration %lld", (long long)it);
        if (evaluate(t, 1, "validation", prefix, 1, err) != 0) return -1;
    }
    int64_t exit_interval = neox_config_has(t->cfg, exit_interval) ? neox_config_int(t->cfg, exit_interval) : 0;
    if (exit_interval > 0 && it % exit_interval == 0) {
        if (t->rank0) neox_info("exiting program at iteration %lld (exit_interval)", (long long)it);
        *status = 0;
        return 1;
    }
    if (stop_requested(t)) {
        if (flush_late(t, err) != 0) return -1;  // (a signal that came after the step was queued)
        if (t->rank0) neox_notice("stop requested by a signal: stopping at iteration %lld", (long long)it);
        if (t->save_dir && t->last_saved != it && save_checkpoint(t, err) != 0) return -1;
        *status = NEOX_TRAIN_EXIT_INTERRUPTED;
        return 1;
    }
    return 0;
}

// A run whose last steps had a non-finite loss, or whose weights are not finite, did not train:
// it ends with an error whether or not it saves.
static int check_trained(neox_trainer *t, neox_error *err) {
    if (t->nonfinite_loss_in_a_row > 0)
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "training ended at iteration %lld with %lld iterations in a row of NaN or inf loss (skipped); "
                         "lower the learning rate or check the data",
                         (long long)t->state.iteration, (long long)t->nonfinite_loss_in_a_row);
    return check_finite_weights(t, "training ended", err);
}

static int finish(neox_trainer *t, neox_error *err) {
    if (flush_late(t, err) != 0) return -1;
    if (check_trained(t, err) != 0) return -1;
    int valid = do_split(t, NEOX_K_do_valid, 1);
    if (valid && evaluate(t, 1, "validation", "the end of training for val data", 1, err) != 0) return -1;
    if (t->save_dir && t->state.iteration > 0 && t->last_saved != t->state.iteration && save_checkpoint(t, err) != 0)
        return -1;
    if (do_split(t, NEOX_K_do_test, 2) && evaluate(t, 2, "test", "the end of training for test data", !valid, err) != 0) return -1;
    return 0;
}

// The end-of-run reports (collectives): a profile's trace if its window is still open,
// communication, then every rank's memory peaks.
static int write_reports(neox_trainer *t, neox_error *err) {
    if (neox_train_profile_finish(t, err) != 0 || neox_train_write_comm_report(t, err) != 0) return -1;
    return neox_train_write_memory_peaks(t, err);
}

int neox_trainer_run(neox_trainer *t, neox_error *err) {
    int train = neox_config_has(t->cfg, do_train) ? neox_config_bool(t->cfg, do_train) : 1;
    if (t->rank0 && !t->opts.quiet && t->state.iteration < t->train_iters && train)
        neox_info("training from iteration %lld to %lld", (long long)t->state.iteration, (long long)t->train_iters);
    neox_metrics_begin(t->metrics);
    while (train && t->state.iteration < t->train_iters) {
        int status = 0, done;
        if (step_and_log(t, err) != 0) return -1;
        if ((done = after_step(t, &status, err)) != 0)
            return done < 0 || write_reports(t, err) != 0 ? -1 : status;
    }
    if (finish(t, err) != 0 || write_reports(t, err) != 0) return -1;
    return neox_metrics_close(t->metrics, err) == 0 ? (t->metrics = NULL, 0) : (t->metrics = NULL, -1);
}
