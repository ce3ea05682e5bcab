// optimizer.c: the trainer's side of the update — the global gradient norm (every element once
// over the whole grid), clipping by it, and the optimizer (lib/optim) applied to this rank's range
// [state_begin, state_end) of the flat buffers: all of it, or under ZeRO its data-parallel
// partition, after which the partitions are all-gathered. No weight decay on biases and norm
// weights (GPT-NeoX's parameter groups).
#include <math.h>
#include <stdlib.h>

#include "internal.h"

// Whether this rank's copy of parameter p counts in the global norm: replicated tensors are
// counted on tensor-parallel rank 0 and the tied embedding on the first stage only.
static int counts_in_norm(const neox_trainer *t, const neox_param *p) {
    return !p->tied_copy && (p->split != NEOX_SPLIT_NONE || t->grid->model_rank == 0);
}

// The parameters' runs within [state_begin, state_end), relative to state_begin, with their weight
// decay; with only_norm, just those that count in the global norm. neox_malloc'ed.
static neox_segment *state_segments(const neox_trainer *t, int only_norm, int *count) {
    const neox_model *m = t->model;
    neox_segment *segs = neox_malloc(((size_t)m->nparams + 1) * sizeof *segs);
    int n = 0;
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        size_t lo = p->offset > t->state_begin ? p->offset : t->state_begin;
        size_t hi = p->offset + p->numel < t->state_end ? p->offset + p->numel : t->state_end;
        if (lo >= hi || (only_norm && !counts_in_norm(t, p))) continue;
        float wd = p->no_decay ? 0.0f : (float)t->optim.weight_decay;
        segs[n++] = (neox_segment){lo - t->state_begin, hi - t->state_begin, wd};
    }
    *count = n;
    return segs;
}

// The gradients of [state_begin, state_end): ZeRO-2 keeps them apart from the flat buffer.
static float *state_grads(const neox_trainer *t) {
    float *partition = neox_grad_exchange_partition_grads(t->exchange);
    return partition ? partition : t->model->grad_buf + t->state_begin;
}

// The sum of squares into sumsq, the guard the update reads (sumsq itself, or with loss_sums the
// loss_guard of both), the unscaling and clipping by the sum, and the guarded update: all queued.
static void queue_device_update(neox_trainer *t, double *sumsq, const double *loss_sums, double *guard,
                                double loss_scale, double lr, int64_t step) {
    int n;
    neox_segment *segs = state_segments(t, 1, &n);
    t->be->sum_squares_segments_into(sumsq, state_grads(t), segs, n);
    free(segs);
    if (loss_sums) t->be->loss_guard(guard, sumsq, loss_sums, t->grad_accum);
    // (a captured step reads its loss scale from the staged step scalars: the fp16 scale moves between replays)
    const double *loss_scale_at = t->model->inputs_staged ? neox_train_step_scalars_loss_scale(t) : NULL;
    t->be->clip_by_norm(state_grads(t), t->state_end - t->state_begin, sumsq, loss_scale, loss_scale_at,
                        t->optim.clip_grad);
    t->optimizer->guard = loss_sums ? guard : sumsq;
    neox_train_update(t, lr, step);
    t->optimizer->guard = NULL;
}

double neox_train_device_update(neox_trainer *t, double loss_scale, double lr, int64_t step) {
    queue_device_update(t, t->step_sumsq, NULL, NULL, loss_scale, lr, step);
    double sum;
    t->be->to_host(&sum, t->step_sumsq, sizeof sum);
    return sum;
}

void neox_train_device_update_guarded(neox_trainer *t, double *sumsq, const double *loss_sums, double *guard,
                                      double loss_scale, double lr, int64_t step) {
    queue_device_update(t, sumsq, loss_sums, guard, loss_scale, lr, step);
}

// Each element once over the whole grid: replicas counted once, partitions summed over their
// group. Under expert parallelism the experts' part is summed over the expert group too (each of
// its ranks holds other experts), the rest (the same on all of them) is not.
double neox_train_grad_norm(const neox_trainer *t) {
    int n;
    neox_segment *segs = state_segments(t, 1, &n);
    size_t experts = t->model->dense_params < t->model->nparams ? t->model->params[t->model->dense_params].offset
                                                                 : t->model->num_floats;
    int dense = 0;  // segments follow the buffer, so the dense ones come first
    while (dense < n && t->state_begin + segs[dense].begin < experts) dense++;
    double sum[2] = {t->be->sum_squares_segments(state_grads(t), segs, dense), 0.0};
    if (dense < n) sum[1] = t->be->sum_squares_segments(state_grads(t), segs + dense, n - dense);
    free(segs);
    neox_grid *g = t->grid;
    if (t->zero_stage > 0) neox_allreduce_sum(neox_train_state_group(t), sum, t->ep_size > 1 ? 2 : 1, NEOX_F64);  // partitions; else replicas
    if (t->ep_size > 1) neox_allreduce_sum(&g->expert, &sum[1], 1, NEOX_F64);
    double total = sum[0] + sum[1];
    if (g->model_size > 1) neox_allreduce_sum(&g->model, &total, 1, NEOX_F64);
    if (g->pipe_size > 1) neox_allreduce_sum(&g->pipe, &total, 1, NEOX_F64);
    return sqrt(total);
}

// The gradients times the clipping coefficient (and 1 / the loss scale): folded into the update
// when the optimizer reads them once anyway (AdamW), which gives the same bits as this pass over
// them; the gradients in memory then stay unclipped, and nothing reads them after the update.
void neox_train_clip(neox_trainer *t, double norm, double unscale) {
    double coef = unscale * neox_clip_coefficient(t->optim.clip_grad, norm);
    if (coef == 1.0) return;
    if (t->optimizer->type->scales_grads) t->optimizer->grad_scale = (float)coef;
    else if (neox_train_offloaded(t)) neox_train_offload_scale_grads(t, coef);  // (its gradients may be on their way already)
    else t->be->scale(state_grads(t), t->state_end - t->state_begin, (float)coef);
}

// Combines the optimizer's partial per-tensor maxima (SM3's accumulators) over the ranks holding
// other parts of the same tensors: the data-parallel partitions under ZeRO, and for the accumulators
// a tensor-parallel split cuts, the model group.
static void reduce_accumulators(void *ctx, float *buf, size_t n, int over_model) {
    neox_trainer *t = ctx;
    if (over_model && t->grid->model_size > 1) neox_allreduce_max(&t->grid->model, buf, n, NEOX_F32);
    if (!over_model && t->zero_stage > 0) neox_allreduce_max(neox_train_state_group(t), buf, n, NEOX_F32);
}

// This rank's tensors as the optimizer's per-tensor accumulators see them: all of the flat
// buffer's (every rank of the data group lays out the same ones, whatever its range). n: their count.
neox_optimizer_tensor *neox_train_optimizer_tensors(const neox_trainer *t, int *n) {
    const neox_model *m = t->model;
    neox_optimizer_tensor *ts = neox_calloc((size_t)m->nparams + 1, sizeof *ts);
    int tp = t->grid->model_size > 1;
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        int matrix = p->ndim == 2;
        ts[i] = (neox_optimizer_tensor){.offset = p->offset, .numel = p->numel, .matrix = matrix,
                                        .rows = matrix ? p->shape[0] : (int64_t)p->numel, .cols = matrix ? p->shape[1] : 1,
                                        .rows_split = tp && p->split == NEOX_SPLIT_ROWS,
                                        .cols_split = tp && p->split == NEOX_SPLIT_COLS};
    }
    *n = m->nparams;
    return ts;
}

int neox_train_setup_accumulators(neox_trainer *t, neox_error *err) {
    if (!t->optimizer->type->per_tensor) return 0;
    // (A layer's experts share one parameter holding matrices of two shapes, where GPT-NeoX's MoE
    // has a tensor per matrix: the accumulators would cover the wrong rows and columns.)
    if (t->model->dense_params < t->model->nparams)
        return neox_fail(err, NEOX_EXIT_USAGE, "optimizer.type %s: not supported with Mixture-of-Experts layers "
                         "(moe_num_experts above 1)", t->optimizer->type->name);
    int n;
    neox_optimizer_tensor *ts = neox_train_optimizer_tensors(t, &n);
    neox_optimizer_set_tensors(t->optimizer, t->state_begin, ts, n);
    free(ts);
    t->optimizer->reduce_max = reduce_accumulators, t->optimizer->reduce_ctx = t;
    return 0;
}

// ZeRO: every data-parallel rank updated its partition; each receives the others', in buckets of
// allgather_bucket_size elements (DeepSpeed's zero_optimization.allgather_bucket_size): bucket
// [s, e) of the flat parameter buffer is one in-place all-gather in which rank r contributes the
// part of its partition inside it. Values are copied, not combined, so results do not depend on it.
static size_t gather_step(const neox_trainer *t) {
    size_t n = t->model->num_floats;
    int64_t b = neox_config_has(t->cfg, zero_allgather_bucket_size) ? neox_config_int(t->cfg, zero_allgather_bucket_size) : 0;
    return b > 0 && (size_t)b < n ? (size_t)b : n;
}

// On the host each all-gather (waited for before the next) goes through a temporary of its size
// (MPICH's recursive doubling, docs/parallel.md "Collectives").
size_t neox_train_gather_scratch_bytes(const neox_trainer *t) {
    if (t->zero_stage == 0 || t->param_partition || t->be->on_device || neox_train_state_group(t)->size < 2) return 0;
    return gather_step(t) * sizeof(float);
}

static void gather_partitions(neox_trainer *t) {
    neox_comm *data = neox_train_state_group(t);
    size_t n = t->model->num_floats;
    size_t step = gather_step(t);
    int *counts = neox_malloc((size_t)data->size * sizeof(int));
    for (size_t s = 0; s < n; s += step) {
        size_t e = s + step < n ? s + step : n;
        for (int r = 0; r < data->size; r++) {
            size_t lo, hi;
            neox_train_partition(t, r, &lo, &hi);
            lo = lo > s ? lo : s, hi = hi < e ? hi : e;
            counts[r] = hi > lo ? (int)(hi - lo) : 0;
        }
        neox_allgatherv_inplace(data, t->model->param_buf + s, counts, NEOX_F32);
    }
    free(counts);
}

void neox_train_update(neox_trainer *t, double lr, int64_t step) {
    neox_model *m = t->model;
    int n;
    neox_segment *segs = state_segments(t, 0, &n);
    float *params = t->param_partition ? t->param_partition : m->param_buf + t->state_begin;
    if (neox_train_offloaded(t)) {
        neox_train_offload_step(t, state_grads(t), segs, n, lr, step);
    } else {
        neox_train_step_scalars_write(t, lr, step);
        t->optimizer->scalars = neox_train_step_scalars_send(t);
        neox_optimizer_step(t->optimizer, params, state_grads(t), segs, n, lr, step);
        t->optimizer->scalars = NULL;
    }
    t->optimizer->grad_scale = 1.0f;
    free(segs);
    if (t->param_partition) neox_train_zero3_after_update(t);  // (the units are gathered when used)
    else if (t->zero_stage > 0) gather_partitions(t);
}
