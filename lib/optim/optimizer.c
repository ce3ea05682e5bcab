// optimizer.c: the optimizer interface of optim.h — the table of optimizer types, reading the
// settings GPT-NeoX configs give them, the state buffers, and one update (DeepSpeed's clipping
// coefficient is kernels.h's neox_clip_coefficient, for the host and the device).
#include <stdlib.h>
#include <strings.h>

#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static const neox_optimizer_type *const types[NEOX_OPTIMIZER_COUNT] = {
    [NEOX_OPTIMIZER_ADAM] = &neox_optimizer_adamw,
    [NEOX_OPTIMIZER_SGD] = &neox_optimizer_sgd,
    [NEOX_OPTIMIZER_ONEBITADAM] = &neox_optimizer_onebit_adam,
};

const neox_optimizer_type *neox_optimizer_type_of(neox_optimizer_kind kind) { return types[kind]; }

const neox_optimizer_type *neox_optimizer_type_named(const char *name) {
    for (int k = 0; name && k < NEOX_OPTIMIZER_COUNT; k++)
        if (!strcasecmp(name, types[k]->name)) return types[k];
    return NULL;
}

int neox_optimizer_read_settings(const neox_config *cfg, neox_optimizer_settings *s, neox_error *err) {
    const char *name = neox_config_str(cfg, optimizer_type);
    *s = (neox_optimizer_settings){.kind = NEOX_OPTIMIZER_COUNT};
    // GPT-NeoX's cpu_adam is DeepSpeed's CPU Adam (AdamW, as its adam) with the optimizer offloaded.
    if (name && !strcasecmp(name, "cpu_adam")) name = "adam", s->host = 1;
    for (int k = 0; k < NEOX_OPTIMIZER_COUNT; k++)
        if (types[k] == (name ? neox_optimizer_type_named(name) : &neox_optimizer_adamw)) s->kind = (neox_optimizer_kind)k;
    if (s->kind == NEOX_OPTIMIZER_COUNT)
        return neox_fail(err, NEOX_EXIT_USAGE, "optimizer.type: '%s' is not supported by neox-train (adam, cpu_adam, onebitadam, sgd)", name);
    s->weight_decay = neox_config_float(cfg, weight_decay);
    s->clip_grad = neox_config_has(cfg, clip_grad) ? neox_config_float(cfg, clip_grad) : 0.0;
    types[s->kind]->read(cfg, s);
    return 0;
}

neox_optimizer *neox_optimizer_make(const neox_optimizer_settings *s, const neox_backend *be, size_t n) {
    neox_optimizer *o = neox_calloc(1, sizeof *o);
    o->type = types[s->kind], o->s = *s, o->be = be, o->n = n;
    o->grad_scale = 1.0f;
    for (int i = 0; i < o->type->nstate; i++) {
        o->state[i] = be->alloc((n + 1) * sizeof(float));  // + 1: never a zero-byte allocation
        be->memset_zero(o->state[i], (n + 1) * sizeof(float));
    }
    return o;
}

void neox_optimizer_free(neox_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->type->nstate; i++) o->be->free(o->state[i]);
    free(o);
}

void neox_optimizer_step(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                         double lr, int64_t step) {
    o->type->step(o, param, grad, segs, nseg, lr, step);
}

size_t neox_optimizer_state_bytes_per_element(const neox_optimizer_settings *s) {
    return (size_t)types[s->kind]->nstate * sizeof(float);
}
