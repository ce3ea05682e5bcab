// evaluation.c: the evaluations of a run as GPT-NeoX's evaluate_and_print_results reports them:
// lm_loss and lm_loss_ppl of eval_iters x accumulation micro-batches, with char_level_ppl the
// character-level perplexity lm_loss_char_lvl_ppl, and with eval_tasks the scores of neox-eval's
// task code (lib/eval) on the model being trained, each metric as TASK_METRIC,none (the harness's
// key joined to the task as GPT-NeoX joins them). Tasks read their files from eval_data_dir and
// spread their requests over the data-parallel ranks exactly as neox-eval does, so the scores at
// the last iteration are those `neox-eval --tasks` gives for the final checkpoint. eval_tasks is a
// trainer part (parts.c): its set-up and free.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "generate.h"
#include "internal.h"

enum { MAX_EVAL_VALUES = 1 + 16 * NEOX_EVAL_MAX_METRICS };

// The eval_tasks part's state: the tasks scored with each validation evaluation, and the evaluator
// (lib/eval) over this trainer's model and tokenizer that scores them.
typedef struct neox_eval_tasks {
    const char *names[16];
    int n;
    neox_evaluator *ev;
} neox_eval_tasks;

extern const neox_train_part neox_train_eval_tasks_part;

static neox_eval_tasks *tasks_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_eval_tasks_part); }

// neox-eval's names for the splits, which the run evaluates anyway.
static int is_split_name(const char *name) { return !strcmp(name, "valid") || !strcmp(name, "test"); }

// (nothing unless eval_tasks names a task)
static int setup_eval_tasks(neox_trainer *t, neox_error *err) {
    const neox_value *v = neox_config_has(t->cfg, eval_tasks) ? neox_config_value(t->cfg, eval_tasks) : NULL;
    if (!v || v->kind != NEOX_VALUE_LIST) return 0;
    neox_eval_tasks *tasks = neox_calloc(1, sizeof *tasks);
    *neox_train_part_slot(t, &neox_train_eval_tasks_part) = tasks;
    for (int i = 0; i < v->count; i++) {
        if (v->items[i]->kind != NEOX_VALUE_STRING)
            return neox_fail(err, NEOX_EXIT_USAGE, "eval_tasks: item %d is not a task name", i + 1);
        const char *name = v->items[i]->string;
        if (is_split_name(name)) {
            if (t->rank0 && !t->opts.quiet)
                neox_notice("eval_tasks: '%s' is neox-eval's name for a data split; training evaluates the splits "
                            "(do_valid, do_test) on its own", name);
            continue;
        }
        if (tasks->n == 16) return neox_fail(err, NEOX_EXIT_USAGE, "eval_tasks: at most 16 tasks during training");
        tasks->names[tasks->n++] = name;
    }
    if (tasks->n == 0) return 0;
    if (t->grid->pipe_size > 1 || t->grid->model_size > 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "eval_tasks: tasks are scored with pipe_parallel_size and model_parallel_size "
                         "1 only (neox-eval's task code is data parallel); run neox-eval on the checkpoints instead");
    neox_evaluator *ev = tasks->ev = neox_calloc(1, sizeof *ev);
    ev->cfg = t->cfg, ev->grid = t->grid, ev->rank0 = t->rank0, ev->quiet = 1;
    ev->tokenizer = t->tokenizer, ev->eod_id = t->eod_id, ev->model = t->model;
    ev->seq_length = t->seq_length, ev->micro_batch = t->micro_batch;
    return 0;
}

static void free_eval_tasks(neox_trainer *t) {
    neox_eval_tasks *tasks = tasks_of(t);
    if (!tasks) return;
    if (tasks->ev) neox_generator_free(tasks->ev->scorer);  // the model and tokenizer are the trainer's
    free(tasks->ev);
    free(tasks);
    *neox_train_part_slot(t, &neox_train_eval_tasks_part) = NULL;
}

static int run_tasks(neox_trainer *t, neox_eval_value *values, int *n, neox_error *err) {
    neox_task_options o = {.data_dir = neox_config_str(t->cfg, eval_data_dir),
                           .limit = neox_config_int(t->cfg, eval_task_limit), .bootstrap_iters = 0};
    neox_eval_tasks *tasks = tasks_of(t);
    tasks->ev->iteration = t->state.iteration;
    for (int k = 0; k < tasks->n; k++) {
        neox_task_result r = {0};
        if (neox_eval_task(tasks->ev, tasks->names[k], &o, &r, err) != 0) {
            neox_task_result_release(&r);
            return neox_fail_context(err, "eval_tasks: %s at iteration %lld", tasks->names[k], (long long)t->state.iteration);
        }
        for (int i = 0; i < r.nmetrics && *n < MAX_EVAL_VALUES; i++, (*n)++) {
            snprintf(values[*n].name, sizeof values[*n].name, "%s_%s,none", r.task, r.metrics[i].name);
            values[*n].value = r.metrics[i].value;
        }
        neox_task_result_release(&r);
    }
    return 0;
}

int neox_train_evaluate_and_log(neox_trainer *t, neox_batch_iterator *it, const char *chart, const char *prefix,
                                int with_tasks, neox_error *err) {
    int64_t iters = neox_config_int(t->cfg, eval_iters);
    neox_eval_value values[MAX_EVAL_VALUES];
    int n = 0;
    double tokens_per_char = 0, loss;
    int char_ppl = neox_config_bool(t->cfg, char_level_ppl);
    if (char_ppl && neox_eval_tokens_per_char(t->tokenizer, it, t->seq_length, iters * t->grad_accum, &t->grid->data,
                                              &tokens_per_char, err) != 0)
        return -1;
    neox_train_dpo_begin(t);
    neox_train_rm_begin(t);
    if (neox_train_evaluate(t, it, iters, &loss, err) != 0) return -1;
    n += neox_train_dpo_metrics(t, values + n);
    n += neox_train_rm_metrics(t, values + n);
    if (char_ppl) {
        snprintf(values[n].name, sizeof values[n].name, "lm_loss_char_lvl_ppl");
        values[n++].value = exp(loss * tokens_per_char);
    }
    // (Generation reads the weights without the model's hook: ZeRO-3 gathers the whole model, offload
    // waits for every unit's copy.)
    if (with_tasks && tasks_of(t) && tasks_of(t)->ev) {
        neox_train_zero3_gather_all(t);
        neox_train_offload_settle(t);
        int rc = run_tasks(t, values, &n, err);
        neox_train_zero3_end(t);
        if (rc != 0) return -1;
    }
    return neox_metrics_eval_values(t->metrics, chart, prefix, t->state.iteration, loss, values, n, err);
}

const neox_train_part neox_train_eval_tasks_part = {
    .name = "eval_tasks",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_eval_tasks,
    .free = free_eval_tasks,
};
