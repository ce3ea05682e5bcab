// step.c: one training iteration and the evaluation loop. An iteration runs
// gradient_accumulation_steps micro-batches through the pipeline schedule (pipeline.c; each loss
// is the loss-mask-weighted mean of its tokens, and backward scales it by 1/accumulation as
// DeepSpeed does), which also averages the gradients over data-parallel ranks; then it either
// skips the update (non-finite loss or gradient norm) or clips and applies it with the learning
// rate the schedule gives for the iterations completed so far. The features that take part in a
// step (the loss scaler's decision, the optimizer offload, the preference and reward-model metrics,
// the compressors, the communication log) are the registered parts' hooks (parts.c).
//
// The late read: on the device step (t->step_sumsq: AdamW, SGD or Lion on one rank of a device backend) with the
// language model's loss, a step makes no decision on the host and reads nothing back while it runs.
// Its micro-batches' losses stay on the device (the model's defer_loss), the update is guarded on the
// device by the loss and the norm (loss_guard), and the losses and the sum of squares are copied to
// the host asynchronously, to be read when the next step needs what they decide (the count of updates
// and the learning rate before its update; the fp16 scale before its first backward) or at the log
// point of the step before an evaluation, a checkpoint or the end (neox_train_settle). Two sets of
// buffers alternate, so the values of one step are still in their own while the next is queued;
// under a captured step (graph.c) each step settles the one before it first, and one set serves.
// neox_train_run_step is the step between the parts' begin_step and end_step, which graph.c also
// runs inside a capture.
#include <math.h>
#include <string.h>

#include "internal.h"

static double mean_over_data_ranks(neox_trainer *t, double value) {
    if (t->grid->data_size <= 1) return value;
    neox_allreduce_sum(&t->grid->data, &value, 1, NEOX_F64);
    return value / t->grid->data_size;
}

// The norm (all-reduced over the grid on the host), then clipping and the update unless skipped.
static void host_step(neox_trainer *t, neox_step_result *out, double scale) {
    neox_timer *clip = neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_CLIP_GRAD);
    neox_timer_start(clip);
    out->grad_norm = neox_train_grad_norm(t) / scale;
    out->skipped = out->nonfinite_loss || !isfinite(out->grad_norm);
    if (!out->skipped) neox_train_clip(t, out->grad_norm, 1.0 / scale);
    neox_timer_stop(clip);
    if (out->skipped) return;
    neox_timer *opt = neox_metrics_timer(t->metrics, NEOX_TIMER_OPTIMIZER);
    neox_timer_start(opt);
    neox_train_update(t, out->lr, ++t->state.optimizer_steps);
    neox_model_weights_changed(t->model);
    neox_timer_stop(opt);
}

// The same decisions with the norm, the clipping and the update queued on the device (their
// results equal the host path's bit for bit): the update is applied, or skipped by the device when
// the norm is not finite, before the host learns which; then the count of updates follows.
static void device_step(neox_trainer *t, neox_step_result *out, double scale) {
    neox_timer *opt = neox_metrics_timer(t->metrics, NEOX_TIMER_OPTIMIZER);
    neox_timer_start(opt);
    double sumsq = neox_train_device_update(t, scale, out->lr, t->state.optimizer_steps + 1);
    neox_timer_stop(opt);
    out->grad_norm = sqrt(sumsq) / scale;
    out->skipped = !isfinite(out->grad_norm);
    if (!out->skipped) {
        t->state.optimizer_steps++;
        neox_model_weights_changed(t->model);
    }
}

struct neox_late_read {
    double *device;           // on be: both sets of stats, then the guard
    double *stats[2];         // (1 + 2 M) on be: the sum of squares, then each micro-batch's loss pair
    double *host[2];          // (1 + 2 M) host_alloc'ed: their copies
    int64_t ticket[2];
    double *guard;            // on be: the update's guard (loss_guard)
    int set;                  // the set the next step fills (always 0 under a captured step, graph.c,
                              // which settles each step before the next, so a capture holds one set)
    int queued_set;           // the set the queued step filled
    int queued;               // a step waits for its values: `step` (loss and norm not read yet)
    neox_step_result step;
    double scale;             // the loss scale that step ran with
    neox_timer timers[NEOX_TIMER_COUNT];  // what that step added to the wall_clock_breakdown timers
    int settled;              // `done` holds a settled step the loop has not logged yet
    neox_step_result done;
    neox_timer done_timers[NEOX_TIMER_COUNT];
};

void neox_train_late_setup(neox_trainer *t) {
    if (!t->step_sumsq || !neox_train_parts_allow_late_log(t)) return;
    neox_late_read *l = neox_calloc(1, sizeof *l);
    size_t n = 1 + 2 * (size_t)t->grad_accum;
    l->device = t->be->alloc((2 * n + 1) * sizeof(double));  // (one allocation: both sets and the guard)
    for (int k = 0; k < 2; k++) l->stats[k] = l->device + k * n, l->host[k] = t->be->host_alloc(n * sizeof(double));
    l->guard = l->device + 2 * n;
    t->late = l;
}

void neox_train_late_free(neox_trainer *t) {
    neox_late_read *l = t->late;
    if (!l) return;
    for (int k = 0; k < 2; k++) {
        t->be->host_wait(l->ticket[k]);  // (no copy may still write memory freed here)
        t->be->host_free(l->host[k]);
    }
    t->be->free(l->device);
    free(l);
    t->late = NULL;
}

double *neox_train_late_loss_slot(neox_trainer *t, int micro_batch) {
    return t->late->stats[t->late->set] + 1 + 2 * micro_batch;
}

// The queued step's values, read from their copy: the loss as the host path sums it, the norm, and
// what they decide (the count of updates, the parts' after_update: the loss scaler's).
int neox_train_settle(neox_trainer *t, neox_error *err) {
    neox_late_read *l = t->late;
    if (!l || !l->queued) return 0;
    int set = l->queued_set;
    t->be->host_wait(l->ticket[set]);
    const double *v = l->host[set];
    neox_step_result *out = &l->step;
    double loss_sum = 0.0;
    for (int k = 0; k < t->grad_accum; k++) loss_sum += neox_mean_loss(v[1 + 2 * k], v[2 + 2 * k]);
    out->loss = loss_sum / t->grad_accum;
    out->nonfinite_loss = !isfinite(out->loss);
    out->grad_norm = sqrt(v[0]) / l->scale;
    out->skipped = out->nonfinite_loss || !isfinite(out->grad_norm);
    if (!out->skipped) t->state.optimizer_steps++;
    l->queued = 0;
    if (neox_train_parts_after_update(t, out, err) != 0) return -1;
    out->loss_scale = t->scaler.scale;
    l->done = *out;
    memcpy(l->done_timers, l->timers, sizeof l->timers);
    l->settled = 1;
    return 0;
}

int neox_train_take_settled(neox_trainer *t, neox_step_result *out, neox_timer timers[NEOX_TIMER_COUNT]) {
    if (!t->late || !t->late->settled) return 0;
    *out = t->late->done;
    memcpy(timers, t->late->done_timers, sizeof t->late->done_timers);
    t->late->settled = 0;
    return 1;
}

int neox_train_settle_before_backward(neox_trainer *t, neox_error *err) {
    // Only the dynamic fp16 scale is needed this early (a static one never changes).
    return t->late && t->scaler.window > 0 ? neox_train_settle(t, err) : 0;
}

// The wall_clock_breakdown timers' work in a late step is kept for its log line, which comes after
// the next step has run: taken out of the timers here and added back when the loop logs the step.
static void timers_before_step(neox_trainer *t, neox_timer before[NEOX_TIMER_COUNT]) {
    for (int i = 0; i < NEOX_TIMER_COUNT; i++) before[i] = *neox_metrics_timer(t->metrics, (neox_timer_name)i);
}

static void timers_after_step(neox_trainer *t, const neox_timer before[NEOX_TIMER_COUNT]) {
    for (int i = 0; i < NEOX_TIMER_COUNT; i++) {
        neox_timer *timer = neox_metrics_timer(t->metrics, (neox_timer_name)i);
        t->late->timers[i] = (neox_timer){.started = -1, .elapsed = timer->elapsed - before[i].elapsed,
                                          .count = timer->count - before[i].count};
        *timer = before[i];
    }
}

// The device step with nothing read back: the update guarded by the losses and the norm, then the
// values' copy to the host queued; the step's result waits in t->late until neox_train_settle.
static void late_step(neox_trainer *t, neox_step_result *out, double scale) {
    neox_late_read *l = t->late;
    double *stats = l->stats[l->set];
    neox_timer *opt = neox_metrics_timer(t->metrics, NEOX_TIMER_OPTIMIZER);
    neox_timer_start(opt);
    neox_train_device_update_guarded(t, stats, stats + 1, l->guard, scale, out->lr, t->state.optimizer_steps + 1);
    neox_model_weights_changed(t->model);  // (an update the device skipped leaves them as they were: the same values)
    neox_timer_stop(opt);
    int64_t ticket = t->be->to_host_async(l->host[l->set], stats, (1 + 2 * (size_t)t->grad_accum) * sizeof(double));
    neox_train_late_replayed(t, out, scale, ticket);
}

void neox_train_late_replayed(neox_trainer *t, neox_step_result *out, double scale, int64_t ticket) {
    neox_late_read *l = t->late;
    l->ticket[l->set] = ticket;
    l->queued_set = l->set;
    if (!t->graph) l->set ^= 1;
    l->step = *out;
    l->scale = scale;
    l->queued = 1;
    out->pending = 1;
}

int neox_train_run_step(neox_trainer *t, neox_step_result *out, neox_error *err) {
    // ZeRO-2: every reduction leaves the flat buffer all zeros with its pages given back; only the
    // partition's sum starts again (the exchange's; zeroing the whole buffer would map all of it).
    if (!neox_grad_exchange_partition_grads(t->exchange)) neox_model_zero_grad(t->model);
    neox_train_parts_begin_micro_batches(t);
    // (The adaptive plan may hand a compressor's error to these gradients.)
    if (neox_grad_exchange_begin_step(t->exchange, t->state.iteration, t->state.optimizer_steps, err) != 0) return -1;
    double loss_sum = 0.0;
    if (neox_train_pipeline_step(t, &loss_sum, err) != 0) return -1;
    double gauges[NEOX_ADAPTIVE_GAUGES];
    if (neox_grad_exchange_end_step(t->exchange, gauges))  // the adaptive plan's share per scheme, for the metrics
        for (int i = 0; i < NEOX_ADAPTIVE_GAUGES; i++) neox_metrics_add(t->metrics, neox_adaptive_gauge_name(i), gauges[i]);
    neox_train_parts_end_micro_batches(t);
    if (neox_train_settle(t, err) != 0) return -1;  // (the previous step's count of updates, its overflow)
    double scale = t->scaler.scale;  // the one this step's backward took (the settle above may have moved it)
    *out = (neox_step_result){0};
    out->iteration = t->state.iteration + 1;
    out->lr = neox_lr_at(&t->lr, t->state.iteration - t->state.overflow_skips);
    neox_range_push("optimizer");
    if (t->late) {
        late_step(t, out, scale);
    } else {
        out->loss = mean_over_data_ranks(t, loss_sum / t->grad_accum);
        out->nonfinite_loss = !isfinite(out->loss);
        if (t->step_sumsq && !out->nonfinite_loss) device_step(t, out, scale);
        else host_step(t, out, scale);
        if (neox_train_parts_after_update(t, out, err) != 0) return -1;
        out->loss_scale = t->scaler.scale;  // after the update, as GPT-NeoX logs optimizer.cur_scale
    }
    neox_range_pop();
    return 0;
}

// The parts' hooks (parts.c) run at the points neox_train_part names.
int neox_train_step(neox_trainer *t, neox_step_result *out, neox_error *err) {
    neox_timer before[NEOX_TIMER_COUNT];
    if (t->late) timers_before_step(t, before);
    neox_train_parts_begin_step(t);
    if ((t->graph ? neox_train_graph_step(t, out, err) : neox_train_run_step(t, out, err)) != 0) return -1;
    t->state.iteration++;
    t->state.train_position = neox_batch_iterator_position(&t->train_it);
    neox_train_parts_end_step(t);
    if (t->late) timers_after_step(t, before);
    return 0;
}

int neox_train_evaluate(neox_trainer *t, neox_batch_iterator *it, int64_t iters, double *loss, neox_error *err) {
    double sum = 0.0;
    int64_t count = iters * t->grad_accum;
    if (neox_train_pipeline_eval(t, it, count, &sum, err) != 0) return -1;
    *loss = mean_over_data_ranks(t, count > 0 ? sum / (double)count : NAN);
    if (it == &t->valid_it) t->state.valid_position = neox_batch_iterator_position(it);
    return 0;
}
