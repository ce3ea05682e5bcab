// optimizer.c: the optimizer interface of optim.h — the table of optimizer types, reading the
// settings GPT-NeoX configs give them, the state buffers, and one update (DeepSpeed's clipping
// coefficient is kernels.h's neox_clip_coefficient, for the host and the device).
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "kernels/backend.h"
#include "optim.h"

static const neox_optimizer_type *const types[NEOX_OPTIMIZER_COUNT] = {
    [NEOX_OPTIMIZER_ADAM] = &neox_optimizer_adamw,
    [NEOX_OPTIMIZER_SGD] = &neox_optimizer_sgd,
    [NEOX_OPTIMIZER_ONEBITADAM] = &neox_optimizer_onebit_adam,
    [NEOX_OPTIMIZER_LION] = &neox_optimizer_lion,
    [NEOX_OPTIMIZER_MADGRAD_WD] = &neox_optimizer_madgrad_wd,
    [NEOX_OPTIMIZER_SM3] = &neox_optimizer_sm3,
};

const neox_optimizer_type *neox_optimizer_type_of(neox_optimizer_kind kind) { return types[kind]; }

const neox_optimizer_type *neox_optimizer_type_named(const char *name) {
    for (int k = 0; name && k < NEOX_OPTIMIZER_COUNT; k++)
        if (!strcasecmp(name, types[k]->name)) return types[k];
    return NULL;
}

// DeepSpeed's engine: under ZeRO an optimizer outside ZERO_SUPPORTED_OPTIMIZERS is refused unless
// zero_allow_untested_optimizer is set (it checks the stage, not the data-parallel size).
static int check_zero_tested(const neox_config *cfg, const neox_optimizer_type *type, const char *name,
                             neox_error *err) {
    const neox_value *allow = neox_config_sub(cfg, deepspeed_extra_args__zero_allow_untested_optimizer);
    int64_t stage = neox_config_int_or(cfg, zero_stage, 0);
    // (1-bit Adam under ZeRO meets DeepSpeed's earlier refusal, "not compatible with ZeRO": the
    // gradient exchange's, lib/train/grad_exchange.c.)
    if (stage == 0 || type == &neox_optimizer_onebit_adam || type->zero_tested || (allow && allow->kind == NEOX_VALUE_BOOL && allow->boolean)) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE,
                     "optimizer.type: '%s' is untested with ZeRO (zero_optimization.stage %lld): DeepSpeed refuses it "
                     "unless deepspeed_extra_args.zero_allow_untested_optimizer is true (tested: adam, cpu_adam, "
                     "cpu_torch_adam, lion)", name, (long long)stage);
}

int neox_optimizer_read_settings(const neox_config *cfg, neox_optimizer_settings *s, neox_error *err) {
    const char *name = neox_config_str(cfg, optimizer_type), *given = name ? name : "adam";
    *s = (neox_optimizer_settings){.kind = NEOX_OPTIMIZER_COUNT};
    // GPT-NeoX's cpu_adam is DeepSpeed's CPU Adam (AdamW, as its adam) with the optimizer offloaded;
    // so is its cpu_torch_adam, which it means to be torch.optim.Adam but tests as
    // `neox_args.optimizer == "cpu_torch_adam"`, the optimizer dict, which is never equal to it.
    if (name && (!strcasecmp(name, "cpu_adam") || !strcasecmp(name, "cpu_torch_adam"))) name = "adam", s->host = 1;
    for (int k = 0; k < NEOX_OPTIMIZER_COUNT; k++)
        if (types[k] == (name ? neox_optimizer_type_named(name) : &neox_optimizer_adamw)) s->kind = (neox_optimizer_kind)k;
    if (s->kind == NEOX_OPTIMIZER_COUNT)
        return neox_fail(err, NEOX_EXIT_USAGE, "optimizer.type: '%s' is not supported by neox-train (adam, cpu_adam, "
                         "cpu_torch_adam, lion, madgrad_wd, onebitadam, sgd, sm3)", name);
    if (check_zero_tested(cfg, types[s->kind], given, err) != 0) return -1;
    s->weight_decay = neox_config_float(cfg, weight_decay);
    s->clip_grad = neox_config_has(cfg, clip_grad) ? neox_config_float(cfg, clip_grad) : 0.0;
    types[s->kind]->read(cfg, s);
    return 0;
}

void neox_optimizer_warn(const neox_config *cfg, const neox_optimizer_settings *s) {
    if (types[s->kind]->warn) types[s->kind]->warn(cfg, s);
}

neox_optimizer *neox_optimizer_make(const neox_optimizer_settings *s, const neox_backend *be, size_t n) {
    neox_optimizer *o = neox_calloc(1, sizeof *o);
    o->type = types[s->kind], o->s = *s, o->be = be, o->n = n;
    o->grad_scale = 1.0f;
    o->nstate = neox_optimizer_state_count(s);
    for (int i = 0; i < o->nstate; i++) {
        o->state[i] = be->alloc((n + 1) * sizeof(float));  // + 1: never a zero-byte allocation
        be->memset_zero(o->state[i], (n + 1) * sizeof(float));
    }
    return o;
}

// Row and column accumulators of a matrix: those no other tensor-parallel rank shares first (local
// 1), then those it does (local 0); one per element of a vector, never shared.
static size_t place_accumulators(neox_optimizer_tensor *t, int n, int local, size_t at) {
    for (int i = 0; i < n; i++) {
        if (!t[i].matrix) {
            if (local) t[i].row_acc = at, at += t[i].numel;
            t[i].col_acc = NEOX_SM3_NO_COLS;
            continue;
        }
        int rows_local = !t[i].cols_split, cols_local = !t[i].rows_split;  // (a row spans the columns)
        if (rows_local == local) t[i].row_acc = at, at += (size_t)t[i].rows;
        if (cols_local == local) t[i].col_acc = at, at += (size_t)t[i].cols;
    }
    return at;
}

size_t neox_optimizer_accumulator_floats(const neox_optimizer_settings *s, const neox_optimizer_tensor *tensors,
                                         int n) {
    if (!types[s->kind]->per_tensor) return 0;
    size_t floats = 0;
    for (int i = 0; i < n; i++)
        floats += tensors[i].matrix ? (size_t)(tensors[i].rows + tensors[i].cols) : tensors[i].numel;
    return floats;
}

void neox_optimizer_set_tensors(neox_optimizer *o, size_t origin, const neox_optimizer_tensor *tensors, int n) {
    if (!o->type->per_tensor) return;
    neox_assert(!o->tensors, "neox_optimizer_set_tensors: the tensors are set once");
    o->tensors = neox_malloc(((size_t)n + 1) * sizeof *o->tensors);
    memcpy(o->tensors, tensors, (size_t)n * sizeof *tensors);
    o->ntensors = n, o->origin = origin;
    o->nacc_local = place_accumulators(o->tensors, n, 1, 0);
    o->nacc = place_accumulators(o->tensors, n, 0, o->nacc_local);
    for (int k = 0; k < 2; k++) {
        float **buf = k ? &o->acc_next : &o->acc;
        *buf = o->be->alloc((o->nacc + 1) * sizeof(float));
        o->be->memset_zero(*buf, (o->nacc + 1) * sizeof(float));
    }
}

void neox_optimizer_free(neox_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->nstate; i++) o->be->free(o->state[i]);
    if (o->acc) o->be->free(o->acc), o->be->free(o->acc_next);
    free(o->tensors);
    free(o);
}

void neox_optimizer_step(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                         double lr, int64_t step) {
    o->type->step(o, param, grad, segs, nseg, lr, step);
}

int neox_optimizer_state_count(const neox_optimizer_settings *s) {
    const neox_optimizer_type *type = types[s->kind];
    return type->state_count ? type->state_count(s) : type->nstate;
}

size_t neox_optimizer_state_bytes_per_element(const neox_optimizer_settings *s) {
    return (size_t)neox_optimizer_state_count(s) * sizeof(float);
}
