// compression.c: compressed data-parallel communication in the trainer: the 1-bit compressed
// all-reduce of 1-bit Adam's momentum (the optimizer itself is lib/optim/onebit_adam.c; from
// freeze_step on, gradients stay unreduced and the momentum is averaged instead), and our
// gradient_compression: onebit (the same compressed all-reduce) or powersgd (low rank), applied to
// the gradients of an uncompressed optimizer (AdamW, SGD) from gradient_compression_start on.
// The compressors' state (error buffers, PowerSGD's Q) is checkpointed. adaptive makes both
// compressors and lets adaptive_compression.c pick one (or none) per step window.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "internal.h"

// One segment per parameter (the flat buffer in parameter order).
static neox_onebit *make_compressor(neox_trainer *t) {
    const neox_model *m = t->model;
    size_t *sizes = neox_calloc((size_t)m->nparams + 1, sizeof(size_t));
    for (int i = 0; i < m->nparams; i++) {
        if (m->params[i].offset != (i ? m->params[i - 1].offset + m->params[i - 1].numel : 0))
            neox_die(NEOX_EXIT_FAILURE, "compressed all-reduce: parameter %d does not follow parameter %d", i, i - 1);
        sizes[i] = m->params[i].numel;
    }
    neox_onebit *o = neox_onebit_make(&t->grid->data, sizes, m->nparams);
    free(sizes);
    return o;
}

static neox_powersgd *make_powersgd(neox_trainer *t, int adaptive) {
    const neox_model *m = t->model;
    int *rows = neox_calloc((size_t)m->nparams + 1, sizeof(int)), *cols = neox_calloc((size_t)m->nparams + 1, sizeof(int));
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        rows[i] = p->ndim == 2 ? (int)p->shape[0] : 1;
        cols[i] = p->ndim == 2 ? (int)p->shape[1] : (int)p->numel;
    }
    // Adaptive runs choose the rank per bucket: state for every matrix that pays at the smallest.
    int rank = (int)neox_config_int(t->cfg, gradient_compression_rank), min_rank = adaptive ? neox_train_adaptive_min_rank(rank) : rank;
    neox_powersgd *o = neox_powersgd_make_ranks(&t->grid->data, rows, cols, m->nparams, min_rank, rank);
    free(rows);
    free(cols);
    return o;
}

int neox_train_setup_compression(neox_trainer *t, neox_error *err) {
    const char *gc = neox_config_str(t->cfg, gradient_compression);
    int grad_compress = gc && strcmp(gc, "none") != 0, adaptive = gc && !strcmp(gc, "adaptive");
    int onebit = t->optim.kind == NEOX_OPTIMIZER_ONEBITADAM;
    if (onebit && grad_compress)
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression: onebitadam compresses the momentum already; "
                         "set gradient_compression: none");
    if ((onebit || grad_compress) && t->zero_stage > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "zero_optimization.stage %d: %s needs whole replicas (stage 0), as "
                         "DeepSpeed's 1-bit Adam does", t->zero_stage, onebit ? "onebitadam" : "gradient_compression");
    t->compress_start = neox_config_int(t->cfg, gradient_compression_start);
    if (t->grid->data_size > 1) {
        if (onebit) t->onebit = make_compressor(t), t->optimizer->momentum_allreduce = t->onebit;
        if (grad_compress && (adaptive || !strcmp(gc, "onebit"))) t->grad_onebit = make_compressor(t);
        if (grad_compress && (adaptive || !strcmp(gc, "powersgd"))) t->grad_powersgd = make_powersgd(t, adaptive);
    }
    return neox_train_setup_adaptive(t, adaptive, err);
}

void neox_train_free_compression(neox_trainer *t) {
    neox_train_free_adaptive(t);
    neox_onebit_free(t->onebit);
    neox_onebit_free(t->grad_onebit);
    neox_powersgd_free(t->grad_powersgd);
    t->onebit = t->grad_onebit = NULL, t->grad_powersgd = NULL;
}

// Under adaptive the reducer always runs: it leaves the buckets the plan compresses alone, and
// neox_train_compress_grads reduces those after it.
int neox_train_local_grads(const neox_trainer *t) {
    if (t->adaptive) return 0;
    if (t->grad_onebit || t->grad_powersgd) return t->state.optimizer_steps >= t->compress_start;
    return t->optim.kind == NEOX_OPTIMIZER_ONEBITADAM && t->state.optimizer_steps >= t->optim.freeze_step;
}

void neox_train_compress_grads(neox_trainer *t) {
    if (t->adaptive) {
        if (t->grid->data_size > 1) neox_train_adaptive_compress(t);
        return;
    }
    if (t->grad_onebit) neox_onebit_allreduce(t->grad_onebit, t->model->grad_buf);
    if (t->grad_powersgd) neox_powersgd_allreduce(t->grad_powersgd, t->model->grad_buf);
}

int neox_train_onebit_buffers(const neox_trainer *t, const char **names, float **bufs, size_t *counts) {
    static const char *const what[6] = {"optimizer/onebit_worker_error", "optimizer/onebit_server_error",
                                        "optimizer/gradient_worker_error", "optimizer/gradient_server_error",
                                        "optimizer/powersgd_error", "optimizer/powersgd_q"};
    int n = 0;
    for (int k = 0; k < 6; k++) {
        neox_onebit *o = k < 2 ? t->onebit : k < 4 ? t->grad_onebit : NULL;
        if (o) bufs[n] = neox_onebit_error(o, k % 2, &counts[n]);
        else if (k >= 4 && t->grad_powersgd) bufs[n] = neox_powersgd_state(t->grad_powersgd, k % 2, &counts[n]);
        else continue;
        names[n++] = what[k];
    }
    return n;
}
