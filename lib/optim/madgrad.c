// madgrad.c: GPT-NeoX's madgrad_wd (megatron/optimizers.py): MADGRAD (Defazio and Jelassi 2021, a
// momentumized dual-averaging method with a cube-root denominator) with the weight decay applied
// AdamW-style (p *= 1 - lr * wd) instead of MADGRAD's L2 term. Its quirks are kept: the step's lr
// has eps added before anything uses it, and the dual-averaging weight is lamb = lr * sqrt(k + 1)
// for the k-th update from 0. State: the weighted sums of squared gradients and of gradients, and
// x0 (the parameters before the first update, which only momentum reads; the buffer is kept
// either way, so the state has one shape for every setting).
#include <math.h>

#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_madgrad(const neox_config *cfg, neox_optimizer_settings *s) {
    s->momentum = neox_config_has(cfg, madgrad_momentum) ? neox_config_float(cfg, madgrad_momentum) : 0.9;
    s->eps = neox_config_has(cfg, madgrad_eps) ? neox_config_float(cfg, madgrad_eps) : 1e-6;
}

static void step_madgrad(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                         double lr, int64_t step) {
    double lr_eps = lr + o->s.eps, lamb = lr_eps * sqrt((double)step);
    o->be->madgrad_segments(param, grad, o->state[0], o->state[1], o->state[2], segs, nseg, (float)lr_eps, (float)lamb,
                            (float)o->s.momentum, (float)o->s.eps, step == 1);
}

// Not in DeepSpeed's ZeRO-tested list: under ZeRO it needs zero_allow_untested_optimizer.
const neox_optimizer_type neox_optimizer_madgrad_wd = {
    .name = "madgrad_wd", .nstate = 3, .state_names = {"optimizer/grad_sum_sq", "optimizer/s", "optimizer/x0"},
    .read = read_madgrad, .step = step_madgrad,
};
