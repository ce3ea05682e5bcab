// param_norm.c: log_param_norm — the Frobenius norm of every parameter after each step, as
// GPT-NeoX logs parameter_norms/NAME, and the norm of all of them together. Each tensor is counted
// once over the grid: its tensor-parallel blocks summed, replicated tensors taken from
// tensor-parallel rank 0, the tied embedding from the first stage, one data-parallel replica (under
// ZeRO-3, which holds no replica whole, the partitions of all data-parallel ranks; under expert
// parallelism each expert from the first rank holding it).
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

static int setup_param_norms(neox_trainer *t, neox_error *err) {
    if (!neox_config_bool(t->cfg, log_param_norm)) return 0;
    neox_model_desc whole = t->model->desc;
    whole.tp_size = whole.tp_rank = whole.pp_size = whole.pp_rank = whole.layer_begin = whole.layer_end = 0;
    whole.ep_size = whole.ep_rank = 0;
    neox_param_norms *pn = neox_calloc(1, sizeof *pn);
    *neox_train_part_slot(t, &neox_train_param_norm_part) = pn;
    neox_param *all = neox_model_param_list(&whole, &pn->n, err);
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

// Whether this rank holds the counted replica of parameter i: data rank 0's, or under expert
// parallelism for an expert the first of the ranks holding it.
static int first_replica(const neox_trainer *t, int i) {
    if (t->ep_size > 1 && i >= t->model->dense_params) return t->grid->expert_data.rank == 0;
    return t->grid->data_rank == 0;
}

// A collective over the world: pn->norms[i] gets the norm of the whole model's parameter i (on
// every rank), pn->norms[n] the norm of all parameters; the step's log line and metrics show them.
static void param_norms_log(neox_trainer *t, neox_step_stats *stats) {
    neox_param_norms *pn = *neox_train_part_slot(t, &neox_train_param_norm_part);
    if (!pn) return;
    const neox_grid *g = t->grid;
    double *sq = neox_calloc((size_t)pn->n, sizeof *sq);
    neox_train_offload_settle(t);
    for (int i = 0; i < t->model->nparams; i++) {
        const neox_param *p = &t->model->params[i];
        if (p->tied_copy || (p->split == NEOX_SPLIT_NONE && g->model_rank != 0)) continue;
        size_t lo, hi;  // ZeRO-3: every data rank adds the part of its partition (the model is not whole)
        if (t->param_partition && neox_overlap(p->offset, p->offset + p->numel, t->part_begin, t->part_end, &lo, &hi))
            sq[p->index] = t->be->sum_squares(t->param_partition + (lo - t->part_begin), hi - lo);
        else if (!t->param_partition && first_replica(t, i))
            sq[p->index] = t->be->sum_squares(t->model->param_buf + p->offset, p->numel);
    }
    if (g->world_size > 1) neox_allreduce_sum(&t->grid->world, sq, pn->n, NEOX_F64);
    double total = 0.0;
    for (int i = 0; i < pn->n; i++) {
        total += sq[i];
        pn->norms[i] = sqrt(sq[i]);
    }
    pn->norms[pn->n] = sqrt(total);
    free(sq);
    stats->param_norms = pn->norms, stats->param_norm_names = pn->names, stats->nparam_norms = pn->n;
}

const neox_train_part neox_train_param_norm_part = {
    .name = "parameter norms",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_param_norms,
    .free = free_param_norms,
    .log = param_norms_log,
};
