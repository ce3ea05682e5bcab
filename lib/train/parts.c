// parts.c: the trainer's parts — the one table of the features that hook into set-up, the step,
// the model's passes, checkpoints, the memory plan and the communication report — and the walks
// over it. The trainer calls these walks at fixed points and names no feature; a feature is its
// own file (its hooks and its private state) plus one line in the table below.
//
// The table's order is the order the hooks run in (free and end_pass run in reverse). Where it matters:
// set-up errors come in the order preference, reward model, schedule (tests name which is
// reported first); zero3 starts before preference (the reference copies the policy, which ZeRO-3 gathers whole)
// and before offload (which copies the weights the partition holds).
#include "internal.h"

extern const neox_train_part neox_train_loss_scaler_part;   // loss_scaler.c
extern const neox_train_part neox_train_fp8_part;           // fp8.c
extern const neox_train_part neox_train_reward_model_part;  // reward_model.c
extern const neox_train_part neox_train_schedule_part;      // resume_schedule.c
extern const neox_train_part neox_train_zero3_part;         // zero3.c
extern const neox_train_part neox_train_preference_part;    // preference.c (DPO, KTO)
extern const neox_train_part neox_train_offload_part;       // offload.c
extern const neox_train_part neox_train_exchange_part;      // grad_exchange.c
extern const neox_train_part neox_train_comm_log_part;      // comm_log.c
extern const neox_train_part neox_train_param_norm_part;    // param_norm.c
extern const neox_train_part neox_train_grad_stats_part;    // grad_stats.c
extern const neox_train_part neox_train_noise_scale_part;   // noise_scale.c
extern const neox_train_part neox_train_eval_tasks_part;    // evaluation.c
extern const neox_train_part neox_train_profile_part;       // profile.c

static const neox_train_part *const parts[] = {
    &neox_train_loss_scaler_part,
    &neox_train_fp8_part,
    &neox_train_zero3_part,
    &neox_train_preference_part,
    &neox_train_reward_model_part,
    &neox_train_schedule_part,
    &neox_train_offload_part,
    &neox_train_exchange_part,
    &neox_train_comm_log_part,
    &neox_train_param_norm_part,
    &neox_train_grad_stats_part,
    &neox_train_noise_scale_part,
    &neox_train_eval_tasks_part,
    &neox_train_profile_part,
};
enum { NPARTS = sizeof parts / sizeof parts[0] };
_Static_assert((int)NPARTS <= (int)NEOX_TRAIN_MAX_PARTS, "a state slot for every part");

void **neox_train_part_slot(const neox_trainer *t, const neox_train_part *part) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i] == part) return (void **)&t->part_state[i];
    neox_bug("trainer part %s is not in the table of parts.c", part->name);
}

// The part that replaces the language-model loss in this run, or NULL; *count says how many do.
static const neox_train_part *loss_part(const neox_trainer *t, int *count) {
    const neox_train_part *found = NULL;
    *count = 0;
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->replaces_loss && parts[i]->replaces_loss(t) && (*count)++ == 0) found = parts[i];
    return found;
}

int neox_train_parts_allow_late_log(const neox_trainer *t) {
    int count;
    if (loss_part(t, &count)) return 0;
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->log && t->part_state[i]) return 0;
    return 1;
}

// One loss per micro-batch: two parts that would each replace it cannot both run.
static int check_one_loss(const neox_trainer *t, neox_error *err) {
    int count;
    const neox_train_part *first = loss_part(t, &count);
    if (count <= 1) return 0;
    for (int i = 0; i < NPARTS; i++)
        if (parts[i] != first && parts[i]->replaces_loss && parts[i]->replaces_loss(t))
            return neox_fail(err, NEOX_EXIT_USAGE, "the trainer's %s and %s would both replace the language-model loss; "
                             "a run trains one of them", first->name, parts[i]->name);
    return 0;
}

int neox_train_parts_setup(neox_trainer *t, neox_part_stage stage, neox_error *err) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->stage == stage && parts[i]->setup && parts[i]->setup(t, err) != 0) return -1;
    return check_one_loss(t, err);
}

int neox_train_parts_check_data(const neox_trainer *t, neox_error *err) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->check_data && parts[i]->check_data(t, err) != 0) return -1;
    return 0;
}

void neox_train_parts_start(neox_trainer *t) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->start) parts[i]->start(t);
}

void neox_train_parts_free(neox_trainer *t) {
    for (int i = NPARTS - 1; i >= 0; i--)
        if (parts[i]->free) parts[i]->free(t);
}

int neox_train_parts_save(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->save && parts[i]->save(t, w, run_state, err) != 0) return -1;
    return 0;
}

int neox_train_parts_load(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->load && parts[i]->load(t, from, err) != 0) return -1;
    return 0;
}

void neox_train_parts_memory(const neox_trainer *t, neox_memory_owner_fn fn, void *ctx) {
    for (int i = 0; i < NPARTS; i++) {
        if (!parts[i]->memory) continue;
        neox_memory_plan mine = {0};
        parts[i]->memory(t, &mine);
        fn(ctx, parts[i]->name, &mine);
    }
}

void neox_train_parts_report(neox_trainer *t, json_t *doc) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->report) parts[i]->report(t, doc);
}

void neox_train_parts_begin_step(neox_trainer *t) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->begin_step) parts[i]->begin_step(t);
}

void neox_train_parts_begin_micro_batches(neox_trainer *t) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->begin_micro_batches) parts[i]->begin_micro_batches(t);
}

void neox_train_parts_end_micro_batches(neox_trainer *t) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->end_micro_batches) parts[i]->end_micro_batches(t);
}

int neox_train_parts_after_update(neox_trainer *t, neox_step_result *r, neox_error *err) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->after_update && parts[i]->after_update(t, r, err) != 0) return -1;
    return 0;
}

void neox_train_parts_end_step(neox_trainer *t) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->end_step) parts[i]->end_step(t);
}

void neox_train_parts_log(neox_trainer *t, neox_step_stats *stats) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->log) parts[i]->log(t, stats);
}

neox_model *neox_train_parts_reference_model(const neox_trainer *t, double **token_logprobs) {
    for (int i = 0; i < NPARTS; i++) {
        neox_model *ref = parts[i]->reference_model ? parts[i]->reference_model(t, token_logprobs) : NULL;
        if (ref) return ref;
    }
    return NULL;
}

void neox_train_parts_begin_pass(neox_trainer *t, neox_train_pass pass) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->begin_pass) parts[i]->begin_pass(t, pass);
}

void neox_train_parts_end_pass(neox_trainer *t) {
    for (int i = NPARTS - 1; i >= 0; i--)
        if (parts[i]->end_pass) parts[i]->end_pass(t);
}

int neox_train_parts_loss(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err) {
    int count;
    const neox_train_part *part = loss_part(t, &count);
    return part ? part->loss(t, b, training, loss, err) : 0;
}

int neox_train_parts_replace_loss(const neox_trainer *t) {
    int count;
    return loss_part(t, &count) != NULL;
}

void neox_train_parts_grads_ready(neox_trainer *t, int begin, int end) {
    for (int i = 0; i < NPARTS; i++)
        if (parts[i]->grads_ready) parts[i]->grads_ready(t, begin, end);
}

void *neox_train_gather_rank_stats(neox_trainer *t, const void *mine, size_t size, json_t *doc, json_t **ranks) {
    void *all = neox_malloc((size_t)t->grid->world_size * size);
    neox_gather_bytes_uncounted(&t->grid->world, mine, (int)size, all);  // (bookkeeping)
    *ranks = doc ? json_object_get(doc, "ranks") : NULL;
    return all;
}
