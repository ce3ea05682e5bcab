// onebit_adam.c: 1-bit Adam as DeepSpeed's OnebitAdam steps (optimizer.type onebitadam): update 1
// only creates the state; updates 2 .. freeze_step are Adam without bias correction on the
// all-reduced gradient; from then on the variance is frozen, each rank folds its own gradient into
// the momentum, and the momentum is averaged by the 1-bit compressed all-reduce (gradient.h)
// instead of the gradients being reduced. The moments and the update are the parameters' backend's
// ops, and the compressor runs on the same backend.
#include "config.h"
#include "gradient.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_onebit_adam(const neox_config *cfg, neox_optimizer_settings *s) {
    neox_optimizer_adamw.read(cfg, s);  // Adam's betas and eps
    s->freeze_step = neox_config_int(cfg, onebitadam_freeze_step);
    // DeepSpeed builds 1-bit Adam from optimizer.params; GPT-NeoX's decay group sets no decay of
    // its own (so params.weight_decay applies), and with weight_decay 0 every parameter is in the
    // no-decay group (so none does).
    if (s->weight_decay != 0.0) s->weight_decay = neox_config_float(cfg, onebitadam_weight_decay);
}

static void step_onebit_adam(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                             double lr, int64_t step) {
    // DeepSpeed's first OnebitAdam step initialises its buffers and returns before any update.
    if (step == 1) return;
    const neox_optimizer_settings *s = &o->s;
    float *m = o->state[0], *v = o->state[1];
    int compressing = step - 1 >= s->freeze_step;
    o->be->adam_moments(m, compressing ? NULL : v, grad, o->n, (float)s->beta1, (float)s->beta2);
    if (compressing && o->momentum_allreduce) neox_onebit_allreduce(o->momentum_allreduce, m);
    for (int i = 0; i < nseg; i++) {
        size_t b = segs[i].begin;
        o->be->onebit_adam_apply(param + b, m + b, v + b, segs[i].end - b, (float)lr, (float)s->eps,
                                 segs[i].weight_decay);
    }
}

const neox_optimizer_type neox_optimizer_onebit_adam = {
    .name = "onebitadam", .nstate = 2, .state_names = {"optimizer/exp_avg", "optimizer/exp_avg_sq"},
    .read = read_onebit_adam, .step = step_onebit_adam,
};
