// step.c: one training iteration and the evaluation loop. An iteration runs
// gradient_accumulation_steps micro-batches (each loss is the loss-mask-weighted mean of its
// tokens, and backward scales it by 1/accumulation as DeepSpeed does), averages the gradients over
// data-parallel ranks, then either skips the update (non-finite loss or gradient norm) or clips
// and applies it with the learning rate the schedule gives for the iterations completed so far.
#include <math.h>

#include "kernels/kernels.h"
#include "internal.h"

// Dropout masks are counter-based: each micro-batch of each data-parallel rank gets a seed from
// (run seed, global micro-batch count, rank), so a resumed run draws exactly the masks it would
// have drawn without stopping.
static unsigned long long dropout_seed(const neox_trainer *t) {
    unsigned long long draw = (unsigned long long)t->state.dropout_draws * (unsigned long long)t->grid->data_size +
                              (unsigned long long)t->grid->data_rank;
    return neox_hash64(t->state.seed ^ 0x64726f706f7574ULL, draw);
}

static double mean_over_data_ranks(neox_trainer *t, double value) {
    if (t->grid->data_size <= 1) return value;
    neox_allreduce_sum(&t->grid->data, &value, 1, NEOX_F64);
    return value / t->grid->data_size;
}

static int forward_backward(neox_trainer *t, double *loss_sum, neox_error *err) {
    neox_model *m = t->model;
    neox_batch *b = t->batch;
    neox_timer *batch_timer = neox_metrics_timer(t->metrics, NEOX_TIMER_BATCH_GENERATOR);
    neox_timer_start(batch_timer);
    int rc = neox_batch_next(&t->train_it, b, err);
    neox_timer_stop(batch_timer);
    if (rc != 0) return -1;
    m->training = 1;
    m->dropout_seed = dropout_seed(t);
    t->state.dropout_draws++;
    neox_timer_start(neox_metrics_timer(t->metrics, NEOX_TIMER_FORWARD));
    rc = neox_model_forward(m, (const int *)b->tokens, (const int *)b->labels, b->loss_mask, err);
    neox_timer_stop(neox_metrics_timer(t->metrics, NEOX_TIMER_FORWARD));
    if (rc != 0) return -1;
    *loss_sum += m->loss;
    neox_timer_start(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD));
    neox_model_backward(m, 1.0f / (float)t->grad_accum);
    neox_timer_stop(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD));
    return 0;
}

int neox_train_step(neox_trainer *t, neox_step_result *out, neox_error *err) {
    neox_model_zero_grad(t->model);
    double loss_sum = 0.0;
    for (int a = 0; a < t->grad_accum; a++)
        if (forward_backward(t, &loss_sum, err) != 0) return -1;
    if (t->reducer) {
        neox_timer *ar = neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE);
        neox_timer_start(ar);
        neox_grad_reducer_finish(t->reducer);
        neox_timer_stop(ar);
    }
    *out = (neox_step_result){0};
    out->loss = mean_over_data_ranks(t, loss_sum / t->grad_accum);
    out->lr = neox_lr_at(&t->lr, t->state.iteration);
    neox_timer *clip = neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_CLIP_GRAD);
    neox_timer_start(clip);
    out->grad_norm = neox_train_grad_norm(t);
    out->nonfinite_loss = !isfinite(out->loss);
    out->skipped = out->nonfinite_loss || !isfinite(out->grad_norm);
    if (!out->skipped) neox_train_clip(t, out->grad_norm);
    neox_timer_stop(clip);
    if (!out->skipped) {
        neox_timer *opt = neox_metrics_timer(t->metrics, NEOX_TIMER_OPTIMIZER);
        neox_timer_start(opt);
        neox_train_update(t, out->lr, ++t->state.optimizer_steps);
        neox_timer_stop(opt);
    }
    t->state.iteration++;
    t->state.train_position = neox_batch_iterator_position(&t->train_it);
    return 0;
}

int neox_train_evaluate(neox_trainer *t, neox_batch_iterator *it, int64_t iters, double *loss, neox_error *err) {
    neox_model *m = t->model;
    neox_batch *b = t->batch;
    double sum = 0.0;
    int64_t count = iters * t->grad_accum;
    m->training = 0;
    for (int64_t i = 0; i < count; i++) {
        if (neox_batch_next(it, b, err) != 0 ||
            neox_model_forward(m, (const int *)b->tokens, (const int *)b->labels, b->loss_mask, err) != 0)
            return -1;
        sum += m->loss;
    }
    *loss = mean_over_data_ranks(t, count > 0 ? sum / (double)count : NAN);
    if (it == &t->valid_it) t->state.valid_position = neox_batch_iterator_position(it);
    return 0;
}
