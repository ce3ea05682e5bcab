// expert_parallel.c: the trainer's side of expert parallelism (moe_expert_parallel_size,
// docs/parallel.md "Expert parallelism"). Each group of EP consecutive data-parallel ranks shares
// out the experts of every MoE layer (lib/model/moe.c exchanges the token rows by all-to-all); the
// experts sit after every other tensor in the flat buffers, so the dense part is the same on every
// data-parallel rank and reduced over the data group as ever, and the experts' part is the same on
// every rank of an expert-data group (the dp / EP ranks holding the same experts), reduced there.
// ZeRO-1 partitions the whole buffer over the expert-data group: the dense part's updates are then
// computed alike on the EP ranks of each expert group, from the same gradients and state.
#include <string.h>

#include "internal.h"

// What expert parallelism cannot be combined with yet; each refusal names both keys.
static int refuse_combinations(const neox_trainer *t, int ep, neox_error *err) {
    const neox_config *cfg = t->cfg;
    const neox_grid *g = t->grid;
    const char *other = NULL, *why = NULL;
    if (neox_config_int(cfg, moe_num_experts) <= 1)
        other = "moe_num_experts", why = "there are no experts to share out (moe_num_experts must be > 1)";
    else if (g->pipe_size > 1) other = "pipe_parallel_size", why = "not implemented with pipelining; use 1";
    else if (g->model_size > 1) other = "model_parallel_size", why = "not implemented with tensor parallelism; use 1";
    else if (neox_config_int_or(cfg, zero_stage, 0) >= 2)
        other = "zero_optimization.stage", why = "ZeRO stages 2 and 3 are not implemented with it; use 0 or 1";
    else if (strcmp(neox_config_str(cfg, gradient_compression), "none") != 0)
        other = "gradient_compression", why = "compressed reductions cover the whole buffer; use none";
    else if (t->optim.kind == NEOX_OPTIMIZER_ONEBITADAM)
        other = "optimizer.type", why = "1-bit Adam's compressed momentum covers the whole buffer; use Adam";
    else if (strcmp(neox_config_str(cfg, train_impl), "normal") != 0)
        other = "train_impl", why = "only train_impl: normal is implemented with it";
    else if (neox_config_has(cfg, eval_tasks) && neox_config_value(cfg, eval_tasks)->kind == NEOX_VALUE_LIST &&
             neox_config_value(cfg, eval_tasks)->count > 0)
        other = "eval_tasks", why = "task scoring runs ranks apart, so their exchanges would not meet; score "
                                    "the checkpoints with neox-eval";
    if (!other) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "moe_expert_parallel_size %d with %s: %s", ep, other, why);
}

int neox_train_setup_expert_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err) {
    int64_t ep = neox_config_int(t->cfg, moe_expert_parallel_size);
    t->ep_size = 1;
    if (ep <= 1) return 0;
    if (refuse_combinations(t, (int)ep, err) != 0) return -1;
    // (That ep divides moe_num_experts is the model's rule: neox_model_desc_check, lib/model/params.c.)
    if (neox_grid_make_expert(t->grid, (int)ep, err) != 0) return -1;
    t->ep_size = (int)ep;
    desc->ep_size = (int)ep, desc->ep_rank = t->grid->expert.rank;
    return 0;
}

neox_comm *neox_train_state_group(const neox_trainer *t) {
    return t->ep_size > 1 ? &t->grid->expert_data : &t->grid->data;
}

void neox_train_partition(const neox_trainer *t, int r, size_t *begin, size_t *end) {
    if (t->ep_size > 1) neox_even_share(t->model->num_floats, r, t->grid->expert_data.size, begin, end);
    else neox_grad_exchange_partition(t->exchange, r, begin, end);
}

int neox_train_ep_writes(const neox_trainer *t, int i) {
    return t->ep_size <= 1 || i >= t->model->dense_params || t->grid->expert.rank == 0;
}
