// adamw.c: AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias-corrected
// moments), which is what GPT-NeoX's Adam is; the backend's segmented kernel does the work.
#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_adamw(const neox_config *cfg, neox_optimizer_settings *s) {
    s->beta1 = neox_config_has(cfg, adam_beta1) ? neox_config_float(cfg, adam_beta1) : 0.9;
    s->beta2 = neox_config_has(cfg, adam_beta2) ? neox_config_float(cfg, adam_beta2) : 0.999;
    s->eps = neox_config_has(cfg, adam_eps) ? neox_config_float(cfg, adam_eps) : 1e-8;
}

static void step_adamw(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                       double lr, int64_t step) {
    const neox_optimizer_settings *s = &o->s;
    neox_step_scalars given = {.lr = (float)lr, .step = step};
    neox_assert(o->scalars || !o->be->on_device, "AdamW on a device without its step scalars in device memory");
    o->be->adamw_segments(param, grad, o->state[0], o->state[1], segs, nseg, o->scalars ? o->scalars : &given,
                          (float)s->beta1, (float)s->beta2, (float)s->eps, o->grad_scale, o->guard);
}

const neox_optimizer_type neox_optimizer_adamw = {
    .name = "adam", .nstate = 2, .state_names = {"optimizer/exp_avg", "optimizer/exp_avg_sq"},
    .scales_grads = 1, .zero_tested = 1, .read = read_adamw, .step = step_adamw,
};
