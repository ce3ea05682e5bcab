// param_norm.c: log_param_norm — the Frobenius norm of every parameter after each step, as
// GPT-NeoX logs parameter_norms/NAME, and the norm of all of them together. Each tensor is counted
// once over the grid: its tensor-parallel blocks summed, replicated tensors taken from
// tensor-parallel rank 0, the tied embedding from the first stage, one data-parallel replica (under
// ZeRO-3, which holds no replica whole, the partitions of all data-parallel ranks; under expert
// parallelism each expert from the first rank holding it). That counting is this file's
// neox_train_param_sums, which the other per-parameter statistics (grad_stats.c, noise_scale.c) share.
// Rank 0 gets the values of the whole model (GPT-NeoX logs only rank 0's stage and shards).
// A trainer part (parts.c): computed by its log hook when each step is recorded.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// The part's state: the whole model's parameter names and, after each step, their norms
// (norms[n]: of all parameters).
typedef struct neox_param_norms {
    int n;
    char **names;
    double *norms;
} neox_param_norms;

extern const neox_train_part neox_train_param_norm_part;

neox_param *neox_train_whole_params(const neox_trainer *t, int *count, neox_error *err) {
    neox_model_desc whole = t->model->desc;
    whole.tp_size = whole.tp_rank = whole.pp_size = whole.pp_rank = whole.layer_begin = whole.layer_end = 0;
    whole.ep_size = whole.ep_rank = 0;
    return neox_model_param_list(&whole, count, err);
}

static int setup_param_norms(neox_trainer *t, neox_error *err) {
    if (!neox_config_bool(t->cfg, log_param_norm)) return 0;
    neox_param_norms *pn = neox_calloc(1, sizeof *pn);
    *neox_train_part_slot(t, &neox_train_param_norm_part) = pn;
    neox_param *all = neox_train_whole_params(t, &pn->n, err);
    if (!all) return -1;
    pn->names = neox_malloc((size_t)pn->n * sizeof *pn->names);
    for (int i = 0; i < pn->n; i++) pn->names[i] = neox_strdup(all[i].name);
    free(all);
    pn->norms = neox_malloc(((size_t)pn->n + 1) * sizeof *pn->norms);
    return 0;
}

static void free_param_norms(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_param_norm_part);
    neox_param_norms *pn = *slot;
    if (!pn) return;
    for (int i = 0; pn->names && i < pn->n; i++) free(pn->names[i]);
    free(pn->names);
    free(pn->norms);
    free(pn);
    *slot = NULL;
}

// Whether this rank's copy of parameter i is the one counted among the replicas of a buffer that
// every data-parallel rank holds whole: data rank 0's, or under expert parallelism for an expert the
// first of the ranks holding it.
static int first_replica(const neox_trainer *t, int i) {
    if (t->ep_size > 1 && i >= t->model->dense_params) return t->grid->expert_data.rank == 0;
    return t->grid->data_rank == 0;
}

// Whether this rank's piece of parameter i in a ZeRO partition is counted: every partition of the
// state group is, but the dense part under expert parallelism only on the expert group's first rank
// (its partitions are alike on all of them).
static int counted_partition(const neox_trainer *t, int i) {
    return t->ep_size <= 1 || i >= t->model->dense_params || t->grid->expert.rank == 0;
}

// Zero elements of x[0, n) on be: counted on the host, a device's copied through host_piece.
static double count_zeros(const neox_backend *be, const float *x, size_t n, float *host_piece) {
    neox_assert(!be->on_device || host_piece, "counting zeros in device memory needs a host piece");
    double zeros = 0.0;
    for (size_t s = 0; s < n; s += NEOX_FLAT_SHARE_PIECE) {
        size_t len = n - s < NEOX_FLAT_SHARE_PIECE ? n - s : NEOX_FLAT_SHARE_PIECE;
        const float *v = x + s;
        if (be->on_device) be->to_host(host_piece, x + s, len * sizeof *host_piece), v = host_piece;
        for (size_t k = 0; k < len; k++) zeros += v[k] == 0.0f;
    }
    return zeros;
}

static double sum_of(const neox_flat_share *s, neox_param_sum what, size_t lo, size_t hi) {
    const float *x = s->buf + (lo - s->begin);
    if (what == NEOX_PARAM_SUM_SQUARES) return s->be->sum_squares(x, hi - lo);
    return count_zeros(s->be, x, hi - lo, s->host_piece);
}

void neox_train_param_sums(const neox_trainer *t, const neox_flat_share *s, neox_param_sum what, double *sums,
                           int nwhole) {
    const neox_grid *g = t->grid;
    for (int i = 0; i < nwhole; i++) sums[i] = 0.0;
    for (int i = 0; i < t->model->nparams; i++) {
        const neox_param *p = &t->model->params[i];
        if (p->tied_copy || (p->split == NEOX_SPLIT_NONE && g->model_rank != 0)) continue;
        size_t lo, hi;
        if (!neox_overlap(p->offset, p->offset + p->numel, s->begin, s->end, &lo, &hi)) continue;
        if (s->partitioned ? counted_partition(t, i) : first_replica(t, i)) sums[p->index] += sum_of(s, what, lo, hi);
    }
    if (g->world_size > 1) neox_allreduce_sum(&t->grid->world, sums, (size_t)nwhole, NEOX_F64);
}

neox_flat_share neox_train_param_share(const neox_trainer *t) {
    if (t->param_partition)  // ZeRO-3: the flat buffer is not whole; the partitions are the master weights
        return (neox_flat_share){t->be, t->param_partition, t->part_begin, t->part_end, 1, NULL};
    return (neox_flat_share){t->be, t->model->param_buf, 0, t->model->num_floats, 0, NULL};
}

neox_flat_share neox_train_grad_share(const neox_trainer *t) {
    float *partition = neox_grad_exchange_partition_grads(t->exchange);
    const float *grads = partition ? partition : t->model->grad_buf + t->state_begin;
    return (neox_flat_share){t->be, grads, t->state_begin, t->state_end, t->zero_stage > 0, NULL};
}

neox_flat_share neox_train_optimizer_state_share(const neox_trainer *t, int k) {
    return (neox_flat_share){neox_train_optimizer_backend(t), t->optimizer->state[k], t->state_begin, t->state_end,
                             t->zero_stage > 0, NULL};
}

// A collective over the world: pn->norms[i] gets the norm of the whole model's parameter i (on
// every rank), pn->norms[n] the norm of all parameters; the step's log line and metrics show them.
static void param_norms_log(neox_trainer *t, neox_step_stats *stats) {
    neox_param_norms *pn = *neox_train_part_slot(t, &neox_train_param_norm_part);
    if (!pn) return;
    neox_train_offload_settle(t);
    neox_flat_share weights = neox_train_param_share(t);
    neox_train_param_sums(t, &weights, NEOX_PARAM_SUM_SQUARES, pn->norms, pn->n);
    double total = 0.0;
    for (int i = 0; i < pn->n; i++) {
        total += pn->norms[i];
        pn->norms[i] = sqrt(pn->norms[i]);
    }
    pn->norms[pn->n] = sqrt(total);
    stats->param_norms = pn->norms, stats->param_norm_names = pn->names, stats->nparam_norms = pn->n;
}

const neox_train_part neox_train_param_norm_part = {
    .name = "parameter norms",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_param_norms,
    .free = free_param_norms,
    .log = param_norms_log,
};
