// context_parallel.c: the trainer's side of context parallelism (context_parallel_size,
// docs/parallel.md "Context parallel"). Each group of cp consecutive data-parallel ranks reads the
// same samples and shares out every sequence (lib/model/context_parallel.c); batches are dealt to
// the data ranks / cp groups (neox_grid_sample_ways), while the gradients are reduced over the whole
// data group as ever: the context ranks act as more data-parallel ways for the weights' gradients,
// each holding its share of the whole sequences' mean (the model scales its loss so).
#include <string.h>

#include "internal.h"

// What context parallelism is not implemented with in the trainer (the model refuses the rest:
// neox_model_cp_check); each refusal names both keys.
static int refuse_combinations(const neox_trainer *t, int cp, neox_error *err) {
    const neox_config *cfg = t->cfg;
    const char *other = NULL, *why = NULL;
    if (strcmp(neox_config_str(cfg, train_impl), "normal") != 0)
        other = "train_impl", why = "only train_impl: normal is implemented with it";
    else if (neox_config_int(cfg, moe_expert_parallel_size) > 1)
        other = "moe_expert_parallel_size", why = "not implemented together; use 1";
    else if (neox_config_has(cfg, eval_tasks) && neox_config_value(cfg, eval_tasks)->kind == NEOX_VALUE_LIST &&
             neox_config_value(cfg, eval_tasks)->count > 0)
        other = "eval_tasks", why = "task scoring runs whole sequences on each rank; score the checkpoints with neox-eval";
    if (!other) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "key 'context_parallel_size' %d with %s: %s", cp, other, why);
}

int neox_train_setup_context_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err) {
    int64_t cp = neox_config_int(t->cfg, context_parallel_size);
    if (cp > 1 && refuse_combinations(t, (int)cp, err) != 0) return -1;
    if (neox_grid_make_context(t->grid, (int)cp, err) != 0) return -1;
    desc->cp_size = t->grid->cp_size, desc->cp_rank = t->grid->cp_rank;
    return 0;
}
