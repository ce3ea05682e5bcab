// lion.c: Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") as lion-pytorch
// and DeepSpeed's FusedLion step it, which GPT-NeoX's optimizer type lion builds: the sign of an
// interpolation of momentum and gradient is the update, weight decay is decoupled (p *= 1 - lr*wd),
// and one state buffer (the momentum) is kept. The backend's segmented kernel does the work.
#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_lion(const neox_config *cfg, neox_optimizer_settings *s) {
    s->beta1 = neox_config_has(cfg, lion_beta1) ? neox_config_float(cfg, lion_beta1) : 0.9;
    s->beta2 = neox_config_has(cfg, lion_beta2) ? neox_config_float(cfg, lion_beta2) : 0.99;
}

static void step_lion(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                      double lr, int64_t step) {
    neox_step_scalars given = {.lr = (float)lr, .step = step};  // (Lion reads only its learning rate)
    neox_assert(o->scalars || !o->be->on_device, "Lion on a device without its step scalars in device memory");
    o->be->lion_segments(param, grad, o->state[0], segs, nseg, o->scalars ? o->scalars : &given, (float)o->s.beta1,
                         (float)o->s.beta2, o->guard);
}

// GPT-NeoX builds DeepSpeed's FusedLion under ZeRO, which DeepSpeed's ZeRO lists as tested.
const neox_optimizer_type neox_optimizer_lion = {
    .name = "lion", .nstate = 1, .state_names = {"optimizer/exp_avg"}, .zero_tested = 1,
    .read = read_lion, .step = step_lion,
};
