// sgd.c: torch.optim.SGD as GPT-NeoX configures it (weight decay added to the gradient,
// heavy-ball momentum whose buffer starts as the first gradient); the backend's segmented kernel.
#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_sgd(const neox_config *cfg, neox_optimizer_settings *s) {
    s->momentum = neox_config_has(cfg, sgd_momentum) ? neox_config_float(cfg, sgd_momentum) : 0.0;
}

static void step_sgd(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg, double lr,
                     int64_t step) {
    neox_step_scalars given = {.lr = (float)lr, .step = step};
    neox_assert(o->scalars || !o->be->on_device, "SGD on a device without its step scalars in device memory");
    o->be->sgd_segments(param, grad, o->state[0], segs, nseg, o->scalars ? o->scalars : &given, (float)o->s.momentum,
                        o->guard);
}

const neox_optimizer_type neox_optimizer_sgd = {
    .name = "sgd", .nstate = 1, .state_names = {"optimizer/momentum_buffer"},
    .read = read_sgd, .step = step_sgd,
};
