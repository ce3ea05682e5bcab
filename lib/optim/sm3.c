// sm3.c: SM3 (Anil et al. 2019, "Memory-Efficient Adaptive Optimization") as torch_optimizer.SM3
// steps a dense parameter, which GPT-NeoX's optimizer type sm3 builds: an AdaGrad-like step whose
// second-moment estimate is covered by one accumulator per row and one per column of each matrix
// (a vector keeps one per element), each element reading the smaller of its row's and its column's
// and the accumulators then taking the maxima of the step's estimates. Optional momentum (its
// buffer is the one state buffer as long as the range, kept only with a momentum) and beta (a
// moving average in place of the sums). No weight decay: torch_optimizer's SM3 has none and GPT-NeoX
// passes it none. A tensor split over ranks (ZeRO partitions, tensor parallelism) keeps its
// accumulators whole on each of them: the trainer's reduce_max combines the partial maxima.
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static void read_sm3(const neox_config *cfg, neox_optimizer_settings *s) {
    s->momentum = neox_config_has(cfg, sm3_momentum) ? neox_config_float(cfg, sm3_momentum) : 0.0;
    s->beta = neox_config_has(cfg, sm3_beta) ? neox_config_float(cfg, sm3_beta) : 0.0;
    s->eps = neox_config_has(cfg, sm3_eps) ? neox_config_float(cfg, sm3_eps) : 1e-30;
}

// GPT-NeoX's documentation: SM3 "doesn't work well with fp16 training"; and weight decay set in a
// file reaches no SM3 (GPT-NeoX passes it none), so a run is told rather than left to believe it decays.
static void warn_sm3(const neox_config *cfg, const neox_optimizer_settings *s) {
    const char *precision = neox_config_str(cfg, precision);
    if (precision && !strcmp(precision, "fp16"))
        neox_warn("optimizer.type sm3 with precision fp16: GPT-NeoX documents that SM3 does not work well with fp16 "
                  "training (bfloat16 or fp32 are the precisions it suits)");
    char where[256];
    if (s->weight_decay != 0.0 && strcmp(neox_config_source(cfg, weight_decay, where, sizeof where), "default") != 0)
        neox_warn("%s: weight_decay %g has no effect with optimizer.type sm3 (SM3 has no weight decay, and GPT-NeoX "
                  "passes it none)", where, s->weight_decay);
}

static int sm3_state_count(const neox_optimizer_settings *s) { return s->momentum > 0.0 ? 1 : 0; }

// The tensor holding flat element `at`, searched from *hint on (segments come in buffer order).
static const neox_optimizer_tensor *tensor_at(const neox_optimizer *o, size_t at, int *hint) {
    for (int tries = 0; tries < 2; tries++, *hint = 0)
        for (int i = *hint; i < o->ntensors; i++)
            if (at >= o->tensors[i].offset && at < o->tensors[i].offset + o->tensors[i].numel) return *hint = i, &o->tensors[i];
    neox_bug("sm3: element %zu of the flat buffer is in no tensor given to the optimizer", at);
}

// The kernel's view of each segment: its tensor's shape and accumulators. neox_malloc'ed.
static neox_sm3_segment *sm3_segments(const neox_optimizer *o, const neox_segment *segs, int nseg) {
    neox_sm3_segment *out = neox_malloc(((size_t)nseg + 1) * sizeof *out);
    int hint = 0;
    for (int k = 0; k < nseg; k++) {
        const neox_optimizer_tensor *t = tensor_at(o, o->origin + segs[k].begin, &hint);
        out[k] = (neox_sm3_segment){.begin = segs[k].begin, .end = segs[k].end,
                                    .first = o->origin + segs[k].begin - t->offset,
                                    .cols = t->matrix ? (size_t)t->cols : 1, .row_acc = t->row_acc,
                                    .col_acc = t->matrix ? t->col_acc : NEOX_SM3_NO_COLS};
    }
    return out;
}

static void step_sm3(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg, double lr,
                     int64_t step) {
    (void)step;  // (no bias correction)
    neox_assert(o->tensors, "sm3: a step before neox_optimizer_set_tensors");
    // acc_next gathers maxima: from zero for sums (torch_optimizer copies the maxima), else from acc.
    if (o->s.beta > 0.0) o->be->copy(o->acc_next, o->acc, o->nacc * sizeof(float));
    else o->be->memset_zero(o->acc_next, o->nacc * sizeof(float));
    neox_sm3_segment *ss = sm3_segments(o, segs, nseg);
    o->be->sm3_segments(param, grad, o->nstate ? o->state[0] : NULL, o->acc, o->acc_next, ss, nseg, (float)lr,
                        (float)o->s.momentum, (float)o->s.beta, (float)o->s.eps);
    free(ss);
    if (o->reduce_max) {
        o->reduce_max(o->reduce_ctx, o->acc_next, o->nacc, 0);
        if (o->nacc > o->nacc_local) o->reduce_max(o->reduce_ctx, o->acc_next + o->nacc_local, o->nacc - o->nacc_local, 1);
    }
    float *old = o->acc;
    o->acc = o->acc_next, o->acc_next = old;
}

// Not in DeepSpeed's ZeRO-tested list: under ZeRO it needs zero_allow_untested_optimizer.
const neox_optimizer_type neox_optimizer_sm3 = {
    .name = "sm3", .nstate = 1, .state_names = {"optimizer/momentum_buffer"}, .state_count = sm3_state_count,
    .per_tensor = 1, .accumulator_names = {"optimizer/sm3_rows", "optimizer/sm3_cols"}, .read = read_sm3, .warn = warn_sm3, .step = step_sm3,
};
