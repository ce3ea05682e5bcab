// resume_schedule.c: the LR schedule (t->lr) as a trainer part: read from the config at set-up,
// stored in the run state of checkpoints ("lr_schedule") and applied on resume as GPT-NeoX's
// AnnealingLR.load_state_dict decides it. The checkpoint stores the schedule's values (lr, min_lr, warmup_iters, decay_iters, style);
// with override_lr_scheduler the config's values replace them, with use_checkpoint_lr_scheduler
// the checkpoint's replace the config's, and with neither the two must agree (GPT-NeoX asserts;
// here an error names the value and both keys). The iteration the schedule is at is never reset.
#include <jansson.h>
#include <string.h>

#include "internal.h"

static int read_schedule(const neox_config *cfg, neox_lr_schedule *lr, neox_error *err) {
    neox_lr_style style;
    const char *name = neox_config_str(cfg, lr_decay_style);
    if (!name || neox_lr_style_parse(name, &style) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "lr_decay_style: '%s' is not constant, linear, cosine or exponential",
                         name ? name : "None");
    double start = neox_config_has(cfg, lr) ? neox_config_float(cfg, lr) : 0.001;
    int64_t decay = neox_config_has(cfg, lr_decay_iters) ? neox_config_int(cfg, lr_decay_iters)
                                                           : neox_config_int(cfg, train_iters);
    *lr = neox_lr_schedule_make(start, neox_config_float(cfg, min_lr), neox_config_float(cfg, warmup), decay, style);
    return 0;
}

// The config's schedule; override_lr_scheduler together with use_checkpoint_lr_scheduler is refused.
static int setup_schedule(neox_trainer *t, neox_error *err) {
    const neox_config *cfg = t->cfg;
    if (read_schedule(cfg, &t->lr, err) != 0) return -1;
    if (neox_config_bool(cfg, override_lr_scheduler) && neox_config_bool(cfg, use_checkpoint_lr_scheduler))
        return neox_fail(err, NEOX_EXIT_USAGE, "override_lr_scheduler and use_checkpoint_lr_scheduler are both true: the "
                         "first keeps the config's LR schedule on resume, the second the checkpoint's; set one");
    return 0;
}

static neox_lr_schedule saved_schedule(json_t *lr, const neox_lr_schedule *fallback) {
    neox_lr_style style = fallback->style;
    const char *name = json_string_value(json_object_get(lr, "style"));
    if (name) neox_lr_style_parse(name, &style);
    return (neox_lr_schedule){json_real_value(json_object_get(lr, "lr")), json_real_value(json_object_get(lr, "min_lr")),
                              json_real_value(json_object_get(lr, "warmup_iters")),
                              (int64_t)json_integer_value(json_object_get(lr, "decay_iters")), style};
}

// The first value in which the two schedules differ, described into buf; 0 when they agree.
static int first_difference(const neox_lr_schedule *saved, const neox_lr_schedule *cfg, char *buf, size_t size) {
    if (saved->start_lr != cfg->start_lr)
        snprintf(buf, size, "lr: the checkpoint's LR schedule has %.17g, the config %.17g", saved->start_lr, cfg->start_lr);
    else if (saved->min_lr != cfg->min_lr)
        snprintf(buf, size, "min_lr: the checkpoint's LR schedule has %.17g, the config %.17g", saved->min_lr, cfg->min_lr);
    else if (saved->decay_iters != cfg->decay_iters)
        snprintf(buf, size, "lr_decay_iters: the checkpoint's LR schedule decays over %lld iterations, the config's over "
                 "%lld (lr_decay_iters, or train_iters when it is unset)", (long long)saved->decay_iters,
                 (long long)cfg->decay_iters);
    else if (saved->warmup_iters != cfg->warmup_iters)
        snprintf(buf, size, "warmup: the checkpoint's LR schedule warms up over %.17g iterations, the config's over %.17g",
                 saved->warmup_iters, cfg->warmup_iters);
    else if (saved->style != cfg->style)
        snprintf(buf, size, "lr_decay_style: the checkpoint's LR schedule is %s, the config's %s",
                 neox_lr_style_name(saved->style), neox_lr_style_name(cfg->style));
    else
        return 0;
    return 1;
}

// Applies a checkpoint's stored lr_schedule (NULL: none stored) to t->lr as the two keys say; with
// neither, a schedule that differs from the config's is an error naming the value.
static int resume_schedule(neox_trainer *t, json_t *saved_json, neox_error *err) {
    if (!json_is_object(saved_json)) return 0;  // (checkpoints converted from Hugging Face store none)
    neox_lr_schedule saved = saved_schedule(saved_json, &t->lr);
    char diff[320];
    int differs = first_difference(&saved, &t->lr, diff, sizeof diff);
    if (neox_config_bool(t->cfg, override_lr_scheduler)) {
        if (differs && t->rank0 && !t->opts.quiet)
            neox_notice("override_lr_scheduler: the config's LR schedule replaces the checkpoint's (%s)", diff);
        return 0;
    }
    if (neox_config_bool(t->cfg, use_checkpoint_lr_scheduler)) {
        t->lr = saved;
        return 0;
    }
    if (differs)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s; set override_lr_scheduler: true to train on with the config's "
                         "schedule, or use_checkpoint_lr_scheduler: true to keep the checkpoint's", diff);
    return 0;
}

// num_iters: the iterations the schedule has advanced over (fp16 overflow skips excluded).
static int save_schedule(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    (void)w, (void)err;
    if (!run_state) return 0;
    const neox_lr_schedule *lr = &t->lr;
    json_object_set_new(run_state, "lr_schedule",
                        json_pack("{s:f, s:f, s:f, s:I, s:s, s:I}", "lr", lr->start_lr, "min_lr", lr->min_lr,
                                  "warmup_iters", lr->warmup_iters, "decay_iters", (json_int_t)lr->decay_iters,
                                  "style", neox_lr_style_name(lr->style), "num_iters",
                                  (json_int_t)(t->state.iteration - t->state.overflow_skips)));
    return 0;
}

// As GPT-NeoX, the schedule is part of the optimizer state: loaded (and checked) with it only.
static int load_schedule(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    if (!from->optimizer) return 0;
    return resume_schedule(t, json_object_get(from->state, "lr_schedule"), err);
}

const neox_train_part neox_train_schedule_part = {
    .name = "LR schedule",
    .stage = NEOX_PART_AFTER_MODEL,
    .setup = setup_schedule,
    .save = save_schedule,
    .load = load_schedule,
};
