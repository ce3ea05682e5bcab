// sparse_embedding.c: the trainer's side of sparse_gradients (GPT-NeoX/DeepSpeed key): the input
// embedding's gradient leaves the dense data-parallel buckets and the gradient exchange averages it
// as (row ids, rows) for the rows the step's tokens touched (lib/gradient/sparse_grad.c). Combinations that would
// break the equality with dense reduction are refused by name, or fall back to dense with a notice.
#include <string.h>

#include "internal.h"

// Refuses what sparse_gradients cannot serve: ZeRO (the embedding would need its own partition),
// pipelining (the embedding's stage has its own buckets and a tied copy), compressed communication
// (which replaces the reduction altogether).
static int refuse_unsupported(const neox_trainer *t, neox_error *err) {
    const char *gc = neox_config_str(t->cfg, gradient_compression);
    if (t->zero_stage > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "zero_optimization.stage %d: sparse_gradients needs stage 0 (the "
                         "embedding's rows would cross ZeRO partitions); set sparse_gradients: false or stage 0",
                         t->zero_stage);
    if (t->grid->pipe_size > 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "pipe_parallel_size %d: sparse_gradients is not supported with pipelining",
                         t->grid->pipe_size);
    if (t->optim.kind == NEOX_OPTIMIZER_ONEBITADAM)
        return neox_fail(err, NEOX_EXIT_USAGE,
                         "optimizer onebitadam: sparse_gradients cannot be combined with 1-bit Adam's compressed all-reduce");
    if (gc && strcmp(gc, "none") != 0)
        return neox_fail(err, NEOX_EXIT_USAGE,
                         "gradient_compression %s: sparse_gradients cannot be combined with compressed gradients", gc);
    return 0;
}

int neox_train_sparse_settings(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err) {
    if (!neox_config_bool(t->cfg, sparse_gradients) || t->grid->data_size <= 1) return 0;
    if (refuse_unsupported(t, err) != 0) return -1;
    const neox_model *m = t->model;
    if (m->desc.tied) {
        // The output layer's gradient (logits x hidden) reaches every row: nothing is sparse.
        if (t->rank0 && !t->opts.quiet)
            neox_notice("sparse_gradients: the embedding is tied to the output layer, whose gradient touches every "
                        "row; it is reduced densely");
        return 0;
    }
    const neox_param *wte = &m->params[0];
    s->sparse = 1, s->sparse_rows = wte->shape[0], s->sparse_width = wte->shape[1];
    s->sparse_row_begin = wte->block_offset[0];
    return 0;
}
