// param_norm.c: log_param_norm — the Frobenius norm of every parameter after each step, as
// GPT-NeoX logs parameter_norms/NAME, and the norm of all of them together. Each tensor is counted
// once over the grid: its tensor-parallel blocks summed, replicated tensors taken from
// tensor-parallel rank 0, the tied embedding from the first stage, one data-parallel replica (under
// ZeRO-3, which holds no replica whole, the partitions of all data-parallel ranks; under expert
// parallelism each expert from the first rank holding it).
// Rank 0 gets the values of the whole model (GPT-NeoX logs only rank 0's stage and shards).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int neox_train_setup_param_norms(neox_trainer *t, neox_error *err) {
    if (!neox_config_bool(t->cfg, log_param_norm)) return 0;
    neox_model_desc whole = t->model->desc;
    whole.tp_size = whole.tp_rank = whole.pp_size = whole.pp_rank = whole.layer_begin = whole.layer_end = 0;
    whole.ep_size = whole.ep_rank = 0;
    neox_param *all = neox_model_param_list(&whole, &t->nnorms, err);
    if (!all) return -1;
    t->norm_names = neox_malloc((size_t)t->nnorms * sizeof *t->norm_names);
    for (int i = 0; i < t->nnorms; i++) t->norm_names[i] = neox_strdup(all[i].name);
    free(all);
    t->norms = neox_malloc(((size_t)t->nnorms + 1) * sizeof *t->norms);
    return 0;
}

void neox_train_free_param_norms(neox_trainer *t) {
    for (int i = 0; i < t->nnorms; i++) free(t->norm_names[i]);
    free(t->norm_names);
    free(t->norms);
}

// Whether this rank holds the counted replica of parameter i: data rank 0's, or under expert
// parallelism for an expert the first of the ranks holding it.
static int first_replica(const neox_trainer *t, int i) {
    if (t->ep_size > 1 && i >= t->model->dense_params) return t->grid->expert_data.rank == 0;
    return t->grid->data_rank == 0;
}

// A collective over the world: t->norms[i] gets the norm of the whole model's parameter i (on
// every rank), t->norms[nnorms] the norm of all parameters.
void neox_train_param_norms(neox_trainer *t) {
    const neox_grid *g = t->grid;
    double *sq = neox_calloc((size_t)t->nnorms, sizeof *sq);
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
    if (g->world_size > 1) neox_allreduce_sum(&t->grid->world, sq, t->nnorms, NEOX_F64);
    double total = 0.0;
    for (int i = 0; i < t->nnorms; i++) {
        total += sq[i];
        t->norms[i] = sqrt(sq[i]);
    }
    t->norms[t->nnorms] = sqrt(total);
    free(sq);
}
