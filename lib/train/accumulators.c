// accumulators.c: SM3's per-tensor accumulators in training checkpoints (docs/checkpoints.md). Each
// parameter's row accumulators (for a vector, one per element) are the global tensor
// optimizer/sm3_rows/NAME, one float per row of the whole parameter, and a matrix's column ones
// optimizer/sm3_cols/NAME; a rank writes the block of its tensor-parallel piece (a dimension that
// tensor parallelism does not split, and the accumulators of a replicated tensor, by model rank 0
// only) and only data-parallel rank 0 writes, since every rank of the data group holds them whole.
// Any layout reads its blocks back by intersection.
#include <stdlib.h>

#include "ckpt.h"
#include "internal.h"

// One accumulator vector of parameter p: dimension dim's (0: rows, or a vector's elements; 1: columns).
typedef struct {
    char name[160];
    int64_t global, start, n;
    size_t at;   // in the optimizer's accumulators
    int split;   // tensor parallelism splits it: each model rank holds its own block
} acc_piece;

static acc_piece piece_of(const neox_optimizer *o, const neox_param *p, const neox_optimizer_tensor *ts, int dim) {
    acc_piece a;
    snprintf(a.name, sizeof a.name, "%s/%s", o->type->accumulator_names[dim], p->name);
    a.global = p->global_shape[dim], a.start = p->block_offset[dim];
    a.n = dim ? ts->cols : ts->rows;
    a.at = dim ? ts->col_acc : ts->row_acc;
    a.split = p->split == (dim ? NEOX_SPLIT_COLS : NEOX_SPLIT_ROWS);
    return a;
}

static int writes_piece(const neox_trainer *t, const neox_param *p, int i, const acc_piece *a) {
    return t->grid->data_rank == 0 && !p->tied_copy && neox_train_ep_writes(t, i) && (a->split || t->grid->model_rank == 0);
}

// The accumulators on the host (copied from the device when they live there). neox_malloc'ed.
static float *host_accumulators(const neox_optimizer *o) {
    float *host = neox_malloc((o->nacc + 1) * sizeof(float));
    o->be->to_host(host, o->acc, o->nacc * sizeof(float));
    return host;
}

int neox_train_save_accumulators(const neox_trainer *t, neox_ckpt_writer *w, neox_error *err) {
    const neox_optimizer *o = t->optimizer;
    if (!o->type->per_tensor) return 0;
    float *host = host_accumulators(o);
    int rc = 0;
    for (int i = 0; rc == 0 && i < t->model->nparams; i++) {
        const neox_param *p = &t->model->params[i];
        for (int dim = 0; rc == 0 && dim < (o->tensors[i].matrix ? 2 : 1); dim++) {
            acc_piece a = piece_of(o, p, &o->tensors[i], dim);
            if (writes_piece(t, p, i, &a)) rc = neox_ckpt_write_range(w, a.name, 1, &a.global, a.start, a.n, host + a.at, err);
        }
    }
    free(host);
    return rc;
}

int neox_train_load_accumulators(neox_trainer *t, const neox_ckpt_reader *r, neox_error *err) {
    neox_optimizer *o = t->optimizer;
    if (!o->type->per_tensor) return 0;
    float *host = host_accumulators(o);
    int rc = 0;
    for (int i = 0; rc == 0 && i < t->model->nparams; i++)
        for (int dim = 0; rc == 0 && dim < (o->tensors[i].matrix ? 2 : 1); dim++) {
            acc_piece a = piece_of(o, &t->model->params[i], &o->tensors[i], dim);
            rc = neox_ckpt_read_range(r, a.name, a.start, a.n, host + a.at, err);
        }
    if (rc == 0) o->be->to_device(o->acc, host, o->nacc * sizeof(float));
    free(host);
    return rc;
}
