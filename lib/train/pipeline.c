// pipeline.c: the micro-batches of one iteration through the pipe stages. Every rank runs the same
// schedule for its stage, 1F1B as DeepSpeed's TrainSchedule: stage s of P runs min(P - s - 1, M)
// forwards, then alternates one forward and one backward, then drains the backwards; with one
// stage that is forward, backward, forward, ... Activations go to the next stage and gradients to
// the previous one with non-blocking sends (a blocking send could wait on a peer that is itself
// sending); each stage keeps up to P - s micro-batches in activation slots. Only the first stage
// reads token ids and only the last reads labels; the others just advance the data position.
// The trainer's parts (parts.c) hook into the passes: a frozen reference model run just before the
// policy, work around each pass, a loss in place of the language model's, and the gradients as
// backward finishes them.
// After the backward that completes a step's gradients (every backward under ZeRO-2, whose
// reducer adds each micro-batch's reduced partition into the exchange's partition sums: the
// gradient exchange says which) the tied embedding's two copies are summed and the data-parallel
// reduction is finished.
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "internal.h"

enum { TAG_ACTIVATION = 0, TAG_GRADIENT = 1, TAG_REFERENCE = 2, TAG_KINDS = 3 };

// MPI only promises tags up to 32767. Messages between two ranks on one communicator arrive in
// the order they were sent, and both sides walk micro-batches in the same order, so tags may wrap.
static int tag_of(int64_t micro_batch, int kind) { return (int)(TAG_KINDS * (micro_batch % 10000) + kind); }

// Dropout masks are counter-based, keyed on the run's seed and each row's index among all rows of
// the run that drew masks: data-parallel rank r takes rows [r x rows, (r + 1) x rows) of each global
// micro-batch, as it takes its samples, so every layout (and a resumed run) draws for a sample
// exactly the masks one uninterrupted rank draws.
static void set_dropout(neox_trainer *t, neox_model *m) {
    m->dropout_seed = neox_hash64(t->state.seed ^ 0x64726f706f7574ULL, 0);
    m->dropout_row0 = (unsigned long long)t->state.dropout_rows + (unsigned long long)t->grid->data_rank * t->rows;
    m->dropout_row0_at = NULL;
    m->head_scale_at = NULL;
    t->state.dropout_rows += (int64_t)t->rows * t->grid->data_size;
}

// A captured step's micro-batch k: its masks' first row and its loss gradient's scale are read from
// the step scalars on the device, where the host wrote them when the step was staged
// (neox_train_pipeline_fill_inputs).
static void use_staged_scalars(neox_trainer *t, neox_model *m, int64_t k) {
    m->dropout_row0 = 0;
    m->dropout_row0_at = neox_train_step_scalars_dropout_row(t, (int)k);
    m->head_scale_at = neox_train_step_scalars_head_scale(t, (int)k);
}

typedef struct pipe_run {
    neox_trainer *t;
    neox_batch_iterator *it;
    int training;
    double loss_sum;
    neox_request *act_send;   // one per slot: the activation send from that slot
    neox_request grad_send;
    neox_request ref_send;    // a part's reference model: its activations in flight to the next stage
} pipe_run;

static int stage_first(const neox_trainer *t) { return t->grid->pipe_rank == 0; }
static int stage_last(const neox_trainer *t) { return t->grid->pipe_rank == t->grid->pipe_size - 1; }
// The parts' passes: 1F1B runs other micro-batches' forwards between a micro-batch's forward and its
// backward, so with several stages each forward and each backward is a pass of its own (ZeRO-3
// gathers the units a backward uses again; the values are the same).
static int split_passes(const neox_trainer *t) { return t->grid->pipe_size > 1; }

static int next_batch(pipe_run *r, neox_error *err) {
    neox_trainer *t = r->t;
    if (!stage_first(t) && !stage_last(t)) {
        neox_batch_iterator_seek(r->it, neox_batch_iterator_position(r->it) + 1);
        return 0;
    }
    neox_timer *timer = neox_metrics_timer(t->metrics, NEOX_TIMER_BATCH_GENERATOR);
    neox_timer_start(timer);
    int rc = t->prefetch ? neox_prefetch_next(t->prefetch, r->it, &t->batch, err) : neox_batch_next(r->it, t->batch, err);
    neox_timer_stop(timer);
    return rc;
}

// A part's frozen reference model (DPO's, KTO's) runs micro-batch k through its own copy of this
// stage just before the policy does, its activations passing between stages with their own tag;
// the last stage keeps its log-probabilities where the part says (for its loss).
static int reference_forward(pipe_run *r, int64_t k, neox_error *err) {
    neox_trainer *t = r->t;
    double *token_logprobs = NULL;
    neox_model *ref = neox_train_parts_reference_model(t, &token_logprobs);
    if (!ref) return 0;
    neox_grid *g = t->grid;
    size_t NC = neox_model_stream_floats(&ref->desc, ref->B, ref->cp_T);
    neox_wait(&r->ref_send);  // its previous activations have left
    if (!stage_first(t)) neox_recv(&g->pipe, neox_model_stage_input(ref), NC, neox_dtype_of_elem(ref->act_elem), g->pipe_rank - 1, tag_of(k, TAG_REFERENCE));
    neox_batch *b = t->batch;
    ref->training = 0;
    if (neox_model_forward(ref, stage_first(t) ? (const int *)b->tokens : NULL, stage_last(t) ? (const int *)b->labels : NULL,
                           stage_last(t) ? b->loss_mask : NULL, err) != 0)
        return -1;
    if (stage_last(t)) neox_model_token_logprobs(ref, token_logprobs);
    else neox_isend(&g->pipe, neox_model_stage_output(ref), NC, neox_dtype_of_elem(ref->act_elem), g->pipe_rank + 1, tag_of(k, TAG_REFERENCE), &r->ref_send);
    return 0;
}

// The loss scale of a micro-batch's backward (the fp16 scaler's over the micro-batches' count), which
// the fused loss needs at forward time already.
static float micro_batch_loss_scale(const neox_trainer *t) { return (float)(t->scaler.scale / t->grad_accum); }

static int forward_pass(pipe_run *r, int64_t k, neox_error *err) {
    neox_trainer *t = r->t;
    neox_model *m = t->model;
    neox_grid *g = t->grid;
    int slot = (int)(k % m->nslots);
    size_t NC = neox_model_stream_floats(&m->desc, m->B, m->cp_T);
    neox_wait(&r->act_send[slot]);  // the slot's previous activations have left
    neox_model_use_slot(m, slot);
    // (a captured step's batches were read and staged before it: neox_train_pipeline_fill_inputs)
    if (!m->inputs_staged && next_batch(r, err) != 0) return -1;
    // The reference's activations first, as the stage before sent them: device messages have no tags
    // and match in the order issued (NCCL's rule, and the emulated device's), so the other order
    // would hand each model the other's activations.
    if (reference_forward(r, k, err) != 0) return -1;
    if (!stage_first(t)) neox_recv(&g->pipe, neox_model_stage_input(m), NC, neox_dtype_of_elem(m->act_elem), g->pipe_rank - 1, tag_of(k, TAG_ACTIVATION));
    m->training = r->training;
    m->head_loss_scale = micro_batch_loss_scale(t);
    if (r->training && !m->inputs_staged) set_dropout(t, m);
    else if (r->training) use_staged_scalars(t, m, k);
    neox_batch *b = t->batch;
    if (r->training && stage_first(t))  // (sparse_gradients: the rows the tokens touch)
        neox_grad_exchange_touch_rows(t->exchange, b->tokens, (size_t)b->micro_batch * b->seq_length);
    neox_timer *timer = neox_metrics_timer(t->metrics, NEOX_TIMER_FORWARD);
    if (r->training) neox_timer_start(timer);
    // A training pass ends after its backward, except under pipelining (one pass each).
    int whole_pass = r->training && !split_passes(t);
    int late = t->late && r->training;  // (the step reads its losses later: step.c)
    m->defer_loss = late;
    neox_train_parts_begin_pass(t, whole_pass ? NEOX_PASS_TRAIN : NEOX_PASS_FORWARD);
    int rc = neox_model_forward(m, stage_first(t) ? (const int *)b->tokens : NULL,
                                stage_last(t) ? (const int *)b->labels : NULL, stage_last(t) ? b->loss_mask : NULL, err);
    m->defer_loss = 0;  // (other forwards of this model, generation's, read their loss)
    if (!whole_pass || rc != 0) neox_train_parts_end_pass(t);
    if (r->training) neox_timer_stop(timer);
    if (rc != 0) return -1;
    if (late) {
        t->be->copy(neox_train_late_loss_slot(t, (int)k), neox_model_loss_sums(m), 2 * sizeof(double));
    } else if (stage_last(t)) {
        double loss = m->loss;
        if (neox_train_parts_loss(t, b, r->training, &loss, err) != 0) return -1;
        r->loss_sum += loss;
    } else neox_isend(&g->pipe, neox_model_stage_output(m), NC, neox_dtype_of_elem(m->act_elem), g->pipe_rank + 1, tag_of(k, TAG_ACTIVATION), &r->act_send[slot]);
    return 0;
}

// A micro-batch's forward, a range of a profile's trace.
static int forward(pipe_run *r, int64_t k, neox_error *err) {
    neox_range_pushf("micro-batch %lld forward", (long long)k);
    int rc = forward_pass(r, k, err);
    neox_range_pop();
    return rc;
}

static void backward(pipe_run *r, int k, int M) {
    neox_trainer *t = r->t;
    neox_range_pushf("micro-batch %d backward", k);
    neox_model *m = t->model;
    neox_grid *g = t->grid;
    size_t NC = neox_model_stream_floats(&m->desc, m->B, m->cp_T);
    neox_model_use_slot(m, k % m->nslots);
    if (!stage_last(t)) neox_recv(&g->pipe, neox_model_stage_output_grad(m), NC, neox_dtype_of_elem(m->act_elem), g->pipe_rank + 1, tag_of(k, TAG_GRADIENT));
    neox_grad_exchange_micro_batch(t->exchange, k == M - 1);
    neox_timer *timer = neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD);
    neox_timer_start(timer);
    if (split_passes(t)) neox_train_parts_begin_pass(t, NEOX_PASS_BACKWARD);
    neox_model_backward(m, micro_batch_loss_scale(t));
    neox_train_parts_end_pass(t);
    neox_timer_stop(timer);
    if (!stage_first(t)) {
        neox_wait(&r->grad_send);
        t->be->copy(t->pipe_grad_send, neox_model_stage_input_grad(m), neox_model_act_bytes(m, NC));
        neox_isend(&g->pipe, t->pipe_grad_send, NC, neox_dtype_of_elem(m->act_elem), g->pipe_rank - 1, tag_of(k, TAG_GRADIENT), &r->grad_send);
    }
    neox_train_after_backward(t);
    neox_range_pop();
}

static void finish_sends(pipe_run *r) {
    for (int s = 0; s < r->t->model->nslots; s++) neox_wait(&r->act_send[s]);
    neox_wait(&r->grad_send);
    neox_wait(&r->ref_send);
    free(r->act_send);
}

// The last stage's loss sum, on every rank of the pipe.
static double share_loss(neox_trainer *t, double loss_sum) {
    if (t->grid->pipe_size > 1) neox_broadcast(&t->grid->pipe, &loss_sum, 1, NEOX_F64, t->grid->pipe_size - 1);
    return loss_sum;
}

int neox_train_pipeline_step(neox_trainer *t, double *loss_sum, neox_error *err) {
    pipe_run r = {.t = t, .it = &t->train_it, .training = 1};
    r.act_send = neox_calloc((size_t)t->model->nslots, sizeof *r.act_send);
    int M = t->grad_accum, P = t->grid->pipe_size, s = t->grid->pipe_rank;
    int warmup = P - s - 1 < M ? P - s - 1 : M, rc = 0;
    for (int k = 0; rc == 0 && k < warmup; k++) rc = forward(&r, k, err);
    for (int i = 0; rc == 0 && i < M - warmup; i++) {
        rc = forward(&r, warmup + i, err);
        if (rc == 0 && i == 0) rc = neox_train_settle_before_backward(t, err);  // (the scale backward takes)
        if (rc == 0) backward(&r, i, M);
    }
    for (int i = M - warmup; rc == 0 && i < M; i++) backward(&r, i, M);
    finish_sends(&r);
    if (rc != 0) return -1;
    *loss_sum = share_loss(t, r.loss_sum);
    return 0;
}

int neox_train_pipeline_fill_inputs(neox_trainer *t, neox_error *err) {
    pipe_run r = {.t = t, .it = &t->train_it, .training = 1};
    neox_model *m = t->model;
    for (int k = 0; k < t->grad_accum; k++) {
        if (next_batch(&r, err) != 0) return -1;
        set_dropout(t, m);
        const neox_batch *b = t->batch;
        float mask_sum;
        if (neox_model_fill_inputs(m, b->tokens, b->labels, b->loss_mask, &mask_sum, err) != 0) return -1;
        float head_scale = neox_model_head_scale(micro_batch_loss_scale(t), mask_sum);
        neox_train_step_scalars_set_micro(t, k, m->dropout_row0, head_scale);
    }
    neox_train_step_scalars_set_loss_scale(t, t->scaler.scale);
    return 0;
}

int neox_train_pipeline_eval(neox_trainer *t, neox_batch_iterator *it, int64_t count, double *loss_sum, neox_error *err) {
    pipe_run r = {.t = t, .it = it, .training = 0};
    r.act_send = neox_calloc((size_t)t->model->nslots, sizeof *r.act_send);
    int rc = 0;
    for (int64_t k = 0; rc == 0 && k < count; k++) rc = forward(&r, k, err);
    finish_sends(&r);
    if (rc != 0) return -1;
    *loss_sum = share_loss(t, r.loss_sum);
    return 0;
}

// ---- after backward --------------------------------------------------------------------------
// The parameter whose gradient is summed between the first and last stage (the tied embedding,
// with pipelining), or -1.
int neox_train_tied_param(const neox_trainer *t) {
    const neox_model *m = t->model;
    if (t->grid->pipe_size <= 1 || !m->desc.tied || t->grid->embed.size == 0) return -1;
    for (int p = 0; p < m->nparams; p++)
        if (m->params[p].tied_copy || (stage_first(t) && p == 0)) return p;
    return -1;
}

static void on_grads_ready(void *ctx, int begin, int end) {
    neox_trainer *t = ctx;
    if (neox_grad_exchange_reduce_now(t->exchange)) neox_train_parts_grads_ready(t, begin, end);
    neox_grad_exchange_ready(t->exchange, begin, end);  // (the tied embedding's copy waits for its sum)
}

// A piece of a parameter's gradient is final (the output layer's, made in pieces under ZeRO-2/3).
static void on_grad_range_ready(void *ctx, size_t begin, size_t end) {
    neox_trainer *t = ctx;
    neox_grad_exchange_ready_range(t->exchange, begin, end);
}

void neox_train_install_grad_hook(neox_trainer *t) {
    t->model->grads_ready = on_grads_ready;
    t->model->grad_range_ready = on_grad_range_ready;
    t->model->grads_ready_ctx = t;
}

void neox_train_after_backward(neox_trainer *t) {
    if (!neox_grad_exchange_reduce_now(t->exchange)) return;
    neox_model *m = t->model;
    int tied = neox_train_tied_param(t);
    if (tied >= 0) {
        const neox_param *p = &m->params[tied];
        neox_allreduce_sum(&t->grid->embed, m->grad_buf + p->offset, p->numel, NEOX_F32);
        neox_grad_exchange_ready_held(t->exchange);
    }
    if (!neox_grad_exchange_reduces(t->exchange)) return;
    neox_timer *timer = neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE);
    neox_timer_start(timer);
    neox_grad_exchange_finish(t->exchange);
    neox_timer_stop(timer);
}
