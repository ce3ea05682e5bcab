// step.c: one training iteration and the evaluation loop. An iteration runs
// gradient_accumulation_steps micro-batches through the pipeline schedule (pipeline.c; each loss
// is the loss-mask-weighted mean of its tokens, and backward scales it by 1/accumulation as
// DeepSpeed does), which also averages the gradients over data-parallel ranks; then it either
// skips the update (non-finite loss or gradient norm) or clips and applies it with the learning
// rate the schedule gives for the iterations completed so far. The features that take part in a
// step (the loss scaler's decision, the optimizer offload, the preference and reward-model metrics,
// the compressors, the communication log) are the registered parts' hooks (parts.c).
#include <math.h>

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

// The parts' hooks (parts.c) run at the points neox_train_part names.
int neox_train_step(neox_trainer *t, neox_step_result *out, neox_error *err) {
    neox_train_parts_begin_step(t);
    // ZeRO-2: every reduction leaves the flat buffer all zeros with its pages given back; only the
    // partition's sum starts again (the exchange's; zeroing the whole buffer would map all of it).
    if (!neox_grad_exchange_partition_grads(t->exchange)) neox_model_zero_grad(t->model);
    neox_train_parts_begin_micro_batches(t);
    // (The adaptive plan may hand a compressor's error to these gradients.)
    if (neox_grad_exchange_begin_step(t->exchange, t->state.iteration, t->state.optimizer_steps, err) != 0) return -1;
    double loss_sum = 0.0, scale = t->scaler.scale;
    if (neox_train_pipeline_step(t, &loss_sum, err) != 0) return -1;
    double gauges[NEOX_ADAPTIVE_GAUGES];
    if (neox_grad_exchange_end_step(t->exchange, gauges))  // the adaptive plan's share per scheme, for the metrics
        for (int i = 0; i < NEOX_ADAPTIVE_GAUGES; i++) neox_metrics_add(t->metrics, neox_adaptive_gauge_name(i), gauges[i]);
    neox_train_parts_end_micro_batches(t);
    *out = (neox_step_result){0};
    out->loss = mean_over_data_ranks(t, loss_sum / t->grad_accum);
    out->lr = neox_lr_at(&t->lr, t->state.iteration - t->state.overflow_skips);
    out->nonfinite_loss = !isfinite(out->loss);
    if (t->step_sumsq && !out->nonfinite_loss) device_step(t, out, scale);
    else host_step(t, out, scale);
    if (neox_train_parts_after_update(t, out, err) != 0) return -1;
    out->loss_scale = t->scaler.scale;  // after the update, as GPT-NeoX logs optimizer.cur_scale
    t->state.iteration++;
    t->state.train_position = neox_batch_iterator_position(&t->train_it);
    neox_train_parts_end_step(t);
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
