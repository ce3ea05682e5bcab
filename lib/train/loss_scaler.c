// loss_scaler.c: the fp16 loss scaler as a trainer part (t->scaler; static 1 in other precisions):
// DeepSpeed's dynamic scaler read from the fp16 dict, its state in the run state of checkpoints
// ("loss_scaler"), and its decision after each update: gradients of a scaled loss that overflowed
// (a non-finite norm) skip the step and lower the scale; the LR schedule does not advance over such
// a step (state.overflow_skips), as DeepSpeed steps its scheduler only after an update.
#include <math.h>

#include "internal.h"

// The fp16 dict (lib/optim/loss_scaler.c reads it); a static 1 in other precisions.
static int setup_scaler(neox_trainer *t, neox_error *err) {
    t->scaler = neox_loss_scaler_static(1.0);
    if (t->precision != NEOX_PRECISION_FP16) return 0;
    return neox_loss_scaler_fp16_from_config(t->cfg, &t->scaler, err);
}

// Every checkpoint stores the scaler, so a resumed fp16 run scales and skips exactly as the straight one.
static int save_scaler(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    (void)w, (void)err;
    if (!run_state) return 0;
    const neox_loss_scaler *ls = &t->scaler;
    json_object_set_new(run_state, "loss_scaler",
                        json_pack("{s:f, s:I, s:I, s:I}", "scale", ls->scale, "hysteresis_left", (json_int_t)ls->hysteresis_left,
                                  "iteration", (json_int_t)ls->iteration, "last_overflow", (json_int_t)ls->last_overflow));
    return 0;
}

// A dynamic scaler continues where it stopped (not when fine-tuning, which starts the run afresh).
static int load_scaler(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    (void)err;
    json_t *ls = json_object_get(from->state, "loss_scaler");
    if (from->finetune || t->scaler.window <= 0 || !json_is_object(ls)) return 0;
    t->scaler.scale = json_real_value(json_object_get(ls, "scale"));
    t->scaler.hysteresis_left = (int)json_integer_value(json_object_get(ls, "hysteresis_left"));
    t->scaler.iteration = (int64_t)json_integer_value(json_object_get(ls, "iteration"));
    t->scaler.last_overflow = (int64_t)json_integer_value(json_object_get(ls, "last_overflow"));
    return 0;
}

static int scaler_after_update(neox_trainer *t, neox_step_result *out, neox_error *err) {
    if (t->precision != NEOX_PRECISION_FP16) return 0;
    int overflow = !isfinite(out->grad_norm);
    if (overflow) out->skipped = 1, t->state.overflow_skips++;
    if (neox_loss_scaler_update(&t->scaler, overflow))
        return neox_fail(err, NEOX_EXIT_FAILURE, "iteration %lld: the fp16 gradients overflowed with the loss scale "
                         "already at min_loss_scale (%g); lower the learning rate or train in bfloat16",
                         (long long)(out->iteration - 1), t->scaler.min_scale);
    return 0;
}

const neox_train_part neox_train_loss_scaler_part = {
    .name = "loss scaler",
    .stage = NEOX_PART_AFTER_PRECISION,
    .setup = setup_scaler,
    .save = save_scaler,
    .load = load_scaler,
    .after_update = scaler_after_update,
};
