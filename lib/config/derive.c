// derive.c: the values GPT-NeoX computes from the others (megatron/neox_arguments/arguments.py
// calculate_derived, calculate_batch_parameters, check_batch_parameters, validate_values, and the
// LR schedule length of training.py), reimplemented here, with the same consistency checks. Where
// GPT-NeoX silently overwrites a value a file set (lr, optimizer_type, clip_grad) a conflicting
// value is an error instead. docs/config.md lists every derived key.
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/internal.h"

// Where a key's value came from, for messages: its file:line, or "the default".
static const char *where_key(const neox_config *cfg, const char *key, char *buf, size_t size) {
    const neox_config_slot *s = neox_config_slot_of(cfg, key);
    if (s->set) return neox_value_where(s->set, buf, size);
    snprintf(buf, size, "%s", cfg->npaths ? cfg->paths[cfg->npaths - 1] : "config");
    return buf;
}

static int derive_fail(const neox_config *cfg, neox_error *err, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int derive_fail(const neox_config *cfg, neox_error *err, const char *key, const char *fmt, ...) {
    char what[1024], where[PATH_MAX + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: key '%s': %s", where_key(cfg, key, where, sizeof where), key, what);
}

// The layer that owns the table may name keys at run time (every load runs these paths).
static const neox_value *val(const neox_config *cfg, const char *key) { return neox_config_value_id(cfg, neox_key_id_of(key)); }
static int is_none(const neox_config *cfg, const char *key) { return val(cfg, key)->kind == NEOX_VALUE_NULL; }
static int64_t int_of(const neox_config *cfg, const char *key) { return val(cfg, key)->integer; }

// ---- parallel sizes and batch sizes ------------------------------------------------------------

static int derive_parallel(neox_config *cfg, neox_error *err, int64_t *dp) {
    int64_t pp = int_of(cfg, "pipe_parallel_size"), mp = int_of(cfg, "model_parallel_size");
    if (pp < 1) pp = 1;
    if (mp < 1) {
        mp = 1;
        neox_config_set_derived_int(cfg, "model_parallel_size", 1);
    }
    if (cfg->data_parallel_only) pp = mp = 1;  // the sizes describe the checkpoint, not this job
    if (cfg->world_size % (pp * mp) != 0)
        return derive_fail(cfg, err, "model_parallel_size",
                           "world size %d is not divisible by pipe_parallel_size x model_parallel_size (%lld x %lld)",
                           cfg->world_size, (long long)pp, (long long)mp);
    *dp = cfg->world_size / (pp * mp);
    // Context-parallel ranks share each sample: the data-parallel ways that batches are cut into are
    // what remains (docs/parallel.md, "Context parallel").
    int64_t cp = cfg->data_parallel_only ? 1 : int_of(cfg, "context_parallel_size");
    if (*dp % cp != 0)
        return derive_fail(cfg, err, "context_parallel_size",
                           "%lld does not divide the %lld ranks of the data-parallel dimension (world size %d / "
                           "(pipe_parallel_size x model_parallel_size))", (long long)cp, (long long)*dp,
                           cfg->world_size);
    *dp /= cp;
    if (!cfg->data_parallel_only && !is_none(cfg, "global_num_gpus") && int_of(cfg, "global_num_gpus") != cfg->world_size)
        return derive_fail(cfg, err, "global_num_gpus", "%lld does not match the world size %d (ranks launched)",
                           (long long)int_of(cfg, "global_num_gpus"), cfg->world_size);
    if (is_none(cfg, "global_num_gpus")) neox_config_set_derived_int(cfg, "global_num_gpus", cfg->world_size);
    neox_config_set_derived_int(cfg, "data_parallel_size", *dp);
    neox_config_set_derived_bool(cfg, "is_pipe_parallel", int_of(cfg, "pipe_parallel_size") >= 2);
    return 0;
}

// Any two of train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps give
// the third (GPT-NeoX's calculate_batch_parameters, with floor division), then all three must agree.
static int derive_batch(neox_config *cfg, neox_error *err, int64_t dp) {
    int has_tb = !is_none(cfg, "train_batch_size"), has_mb = !is_none(cfg, "train_micro_batch_size_per_gpu");
    // GPT-NeoX's default of 1 counts as given; here only a value set in a file does, so train_batch_size
    // with train_micro_batch_size_per_gpu derives the accumulation steps (GPT-NeoX would demand 1).
    int has_ga = neox_config_slot_of(cfg, "gradient_accumulation_steps")->set != NULL && !is_none(cfg, "gradient_accumulation_steps");
    int64_t tb = has_tb ? int_of(cfg, "train_batch_size") : 0;
    int64_t mb = has_mb ? int_of(cfg, "train_micro_batch_size_per_gpu") : 0;
    int64_t ga = has_ga ? int_of(cfg, "gradient_accumulation_steps") : 1;
    if (has_tb && has_mb && !has_ga) ga = tb / mb / dp;
    else if (has_tb && !has_mb) mb = tb / dp / ga;
    else if (!has_tb && has_mb) tb = mb * ga * dp;
    else if (!has_tb && !has_mb)
        return derive_fail(cfg, err, "train_micro_batch_size_per_gpu",
                           "not set; set train_micro_batch_size_per_gpu or train_batch_size");
    const char *zero = !has_mb && mb <= 0 ? "train_micro_batch_size_per_gpu" : !has_ga && ga <= 0 ? "gradient_accumulation_steps" : NULL;
    if (zero)
        return derive_fail(cfg, err, "train_batch_size",
                           "%lld is too small for a data-parallel size of %lld (%s would be 0)", (long long)tb,
                           (long long)dp, zero);
    if (tb != mb * ga * dp)
        return derive_fail(cfg, err, "train_batch_size",
                           "inconsistent batch sizes: train_batch_size %lld != train_micro_batch_size_per_gpu %lld x "
                           "gradient_accumulation_steps %lld x data-parallel size %lld",
                           (long long)tb, (long long)mb, (long long)ga, (long long)dp);
    if (!has_tb) neox_config_set_derived_int(cfg, "train_batch_size", tb);
    if (!has_mb) neox_config_set_derived_int(cfg, "train_micro_batch_size_per_gpu", mb);
    if (!has_ga && ga != int_of(cfg, "gradient_accumulation_steps")) neox_config_set_derived_int(cfg, "gradient_accumulation_steps", ga);
    neox_config_set_derived_int(cfg, "batch_size", mb);
    return 0;
}

// ---- precision, ZeRO, optimizer ----------------------------------------------------------------

// A boolean sub-key set true (the schema has checked its type).
static int sub_true(const neox_config *cfg, neox_subkey_id path) {
    const neox_value *v = neox_config_sub_id(cfg, path);
    return v && v->kind == NEOX_VALUE_BOOL && v->boolean;
}

static int derive_precision(neox_config *cfg, neox_error *err) {
    const char *precision = neox_config_str(cfg, precision), *wanted = NULL, *by = NULL;
    const neox_value *type = neox_config_sub(cfg, fp16__type);
    if (type && type->kind == NEOX_VALUE_STRING && strcasecmp(type->string, "bfloat16") == 0) wanted = "bfloat16", by = "fp16";
    else if (sub_true(cfg, NEOX_SK_fp16__enabled)) wanted = "fp16", by = "fp16";
    if (sub_true(cfg, NEOX_SK_bf16__enabled)) {
        if (wanted && strcmp(wanted, "bfloat16") != 0)
            return derive_fail(cfg, err, "bf16", "bf16 and fp16 are both enabled; enable one");
        wanted = "bfloat16", by = "bf16";
    }
    // precision fp8 runs what is not FP8 as bfloat16 does, so the bf16 dict may stand beside it.
    int fp8_over_bf16 = precision && strcmp(precision, "fp8") == 0 && by && strcmp(by, "bf16") == 0;
    if (wanted && precision && strcasecmp(precision, wanted) != 0 && !fp8_over_bf16)
        return derive_fail(cfg, err, "precision", "'%s' conflicts with the %s dict, which selects %s", precision, by, wanted);
    if (!precision) neox_config_set_derived_str(cfg, "precision", wanted ? wanted : "fp32");
    return 0;
}

// GPT-NeoX's zero_* keys from the zero_optimization dict, with DeepSpeed's defaults (the sub-key
// schema's); the dict's own refusals (NVMe and parameter offload, ZeRO++) are the schema's too.
static int derive_zero(neox_config *cfg, neox_error *err) {
    static const struct { const char *key, *path; } map[] = {
        {"zero_stage", "zero_optimization.stage"},
        {"zero_reduce_scatter", "zero_optimization.reduce_scatter"},
        {"zero_contiguous_gradients", "zero_optimization.contiguous_gradients"},
        {"zero_reduce_bucket_size", "zero_optimization.reduce_bucket_size"},
        {"zero_allgather_bucket_size", "zero_optimization.allgather_bucket_size"},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        const neox_value *v = neox_config_sub_id(cfg, neox_subkey_id_of(map[i].path));
        if (v) {
            neox_config_set_derived(cfg, map[i].key, (neox_value *)v);  // the file's value, shown as derived
            continue;
        }
        const char *fallback = neox_subkey_find(map[i].path)->default_text;
        neox_value *d = neox_yaml_parse(fallback, strlen(fallback), "default", err);
        if (!d) return -1;
        d->file = NULL;
        neox_value *owned = neox_config_new_value(cfg, d->kind);
        *owned = *d;
        free(d);
        neox_config_set_derived(cfg, map[i].key, owned);
    }
    return 0;
}

// The optimizer params neox.c reads, per optimizer type; anything else is refused, not ignored.
static const char *const ADAM_PARAMS[] = {"lr", "betas", "eps", NULL};
static const char *const SGD_PARAMS[] = {"lr", "momentum", NULL};
static const char *const LION_PARAMS[] = {"lr", "betas", NULL};
static const char *const MADGRAD_PARAMS[] = {"lr", "momentum", "eps", NULL};
static const char *const SM3_PARAMS[] = {"lr", "momentum", "beta", "eps", NULL};
// DeepSpeed's OnebitAdam arguments. bias_correction, eps_inside_sqrt and max_grad_norm are stored
// but unused by its step; cuda_aware and comm_backend_name choose a transport (here always MPI).
static const char *const ONEBIT_PARAMS[] = {"lr", "betas", "eps", "weight_decay", "freeze_step", "cuda_aware",
                                            "comm_backend_name", "bias_correction", "eps_inside_sqrt",
                                            "max_grad_norm", "amsgrad", NULL};

static int check_number(const neox_config *cfg, neox_error *err, const neox_value *v, const char *what, double lo, double hi) {
    char text[128];
    if (v->kind != NEOX_VALUE_INT && v->kind != NEOX_VALUE_FLOAT)
        return derive_fail(cfg, err, "optimizer", "%s must be a number, not %s%s", what, neox_value_format(v, text, sizeof text),
                           v->kind == NEOX_VALUE_STRING ? " (a string: YAML 1.1 reads 1.0e-8 as a number, not 1e-8 or 1.0e_8)" : "");
    if (!(v->number >= lo && v->number <= hi))
        return derive_fail(cfg, err, "optimizer", "%s = %g is out of range [%g, %g]", what, v->number, lo, hi);
    return 0;
}

// A number sub-key (type and range checked by the schema), or fallback when unset.
static double sub_number(const neox_config *cfg, neox_subkey_id path, double fallback) {
    const neox_value *v = neox_config_sub_id(cfg, path);
    return v && v->kind != NEOX_VALUE_NULL ? v->number : fallback;
}

// 1-bit Adam's own params: freeze_step (DeepSpeed's default 100000) and weight_decay, which
// DeepSpeed takes from these params (GPT-NeoX's decay parameter group does not set its own).
static int derive_onebit(neox_config *cfg, neox_error *err) {
    if (sub_true(cfg, NEOX_SK_optimizer__params__amsgrad))
        return derive_fail(cfg, err, "optimizer", "params.amsgrad: 1-bit Adam does not support the AMSGrad variant");
    neox_config_set_derived_int(cfg, "onebitadam_freeze_step", (int64_t)sub_number(cfg, NEOX_SK_optimizer__params__freeze_step, 100000));
    neox_config_set_derived_float(cfg, "onebitadam_weight_decay", sub_number(cfg, NEOX_SK_optimizer__params__weight_decay, 0.0));
    return 0;
}

// SM3's params with torch_optimizer.SM3's defaults (momentum 0, beta 0, eps 1e-30), and its refusals
// of a momentum or beta of 1 or more.
static int derive_sm3(neox_config *cfg, neox_error *err) {
    double momentum = sub_number(cfg, NEOX_SK_optimizer__params__momentum, 0.0);
    double beta = sub_number(cfg, NEOX_SK_optimizer__params__beta, 0.0);
    if (momentum >= 1.0)
        return derive_fail(cfg, err, "optimizer", "params.momentum = %g: sm3 needs a momentum in [0, 1)", momentum);
    if (beta >= 1.0) return derive_fail(cfg, err, "optimizer", "params.beta = %g: sm3 needs a beta in [0, 1)", beta);
    neox_config_set_derived_float(cfg, "sm3_momentum", momentum);
    neox_config_set_derived_float(cfg, "sm3_beta", beta);
    neox_config_set_derived_float(cfg, "sm3_eps", sub_number(cfg, NEOX_SK_optimizer__params__eps, 1e-30));
    return 0;
}

// The params the optimizer type takes: anything else (known to the schema) is refused, not ignored.
static int check_params_for_type(const neox_config *cfg, neox_error *err, const neox_value *params, const char *type,
                                 int onebit, const char *const *allowed) {
    for (int i = 0; params && i < params->count; i++) {
        int ok = 0;
        for (int j = 0; allowed[j]; j++) ok |= strcmp(params->keys[i], allowed[j]) == 0;
        if (strcmp(params->keys[i], "weight_decay") == 0 && !onebit)
            return derive_fail(cfg, err, "optimizer", "params.weight_decay: set the top-level key 'weight_decay' instead "
                               "(GPT-NeoX passes both to the optimizer and fails)");
        if (!ok)
            return derive_fail(cfg, err, "optimizer", "params.%s is not supported for optimizer '%s' by neox.c", params->keys[i], type);
    }
    return 0;
}

// params.betas (a list of two numbers in [0, 1]) into b, which holds the defaults when unset.
static int derive_betas(const neox_config *cfg, neox_error *err, double b[2]) {
    const neox_value *betas = neox_config_sub(cfg, optimizer__params__betas);
    if (!betas) return 0;
    if (betas->kind != NEOX_VALUE_LIST || betas->count != 2)
        return derive_fail(cfg, err, "optimizer", "params.betas must be a list of two numbers");
    if (check_number(cfg, err, betas->items[0], "params.betas[0]", 0, 1) < 0 ||
        check_number(cfg, err, betas->items[1], "params.betas[1]", 0, 1) < 0)
        return -1;
    b[0] = betas->items[0]->number, b[1] = betas->items[1]->number;
    return 0;
}

static int derive_optimizer(neox_config *cfg, neox_error *err) {
    const neox_value *opt = val(cfg, "optimizer");
    const char *type = "Adam";  // (optimizer.type's choices and supported values are the schema's)
    if (opt->kind == NEOX_VALUE_MAP) {
        const neox_value *t = neox_config_sub(cfg, optimizer__type), *params = neox_config_sub(cfg, optimizer__params);
        if (!t || t->kind != NEOX_VALUE_STRING) return derive_fail(cfg, err, "optimizer", "must contain a string 'type'");
        if (!params || params->kind != NEOX_VALUE_MAP) return derive_fail(cfg, err, "optimizer", "must contain a mapping 'params'");
        type = t->string;
    }
    // (cpu_adam and cpu_torch_adam are Adam run on the host: Adam's parameters)
    const int onebit = strcasecmp(type, "onebitadam") == 0, lion = strcasecmp(type, "lion") == 0,
              madgrad = strcasecmp(type, "madgrad_wd") == 0, sm3 = strcasecmp(type, "sm3") == 0,
              adam = strcasecmp(type, "adam") == 0 || strcasecmp(type, "cpu_adam") == 0 ||
                     strcasecmp(type, "cpu_torch_adam") == 0 || onebit;
    const neox_config_slot *set_type = neox_config_slot_of(cfg, "optimizer_type");
    if (set_type->set && strcasecmp(set_type->set->string, type) != 0)
        return derive_fail(cfg, err, "optimizer_type", "'%s' conflicts with optimizer.type '%s' (GPT-NeoX takes optimizer.type)",
                           set_type->set->string, type);
    neox_config_set_derived_str(cfg, "optimizer_type", type);
    const neox_value *params = opt->kind == NEOX_VALUE_MAP ? neox_config_sub(cfg, optimizer__params) : NULL;
    const char *const *allowed = onebit ? ONEBIT_PARAMS : adam ? ADAM_PARAMS : lion ? LION_PARAMS
                               : madgrad ? MADGRAD_PARAMS : sm3 ? SM3_PARAMS : SGD_PARAMS;
    if (check_params_for_type(cfg, err, params, type, onebit, allowed) < 0) return -1;
    double lr_value = sub_number(cfg, NEOX_SK_optimizer__params__lr, 0.001);  // GPT-NeoX's default optimizer params
    const neox_config_slot *set_lr = neox_config_slot_of(cfg, "lr");
    if (set_lr->set && set_lr->set->kind != NEOX_VALUE_NULL && set_lr->set->number != lr_value)
        return derive_fail(cfg, err, "lr", "GPT-NeoX takes the learning rate from optimizer.params.lr (%g); set it there", lr_value);
    neox_config_set_derived_float(cfg, "lr", lr_value);
    if (adam || lion) {
        // Adam's defaults are torch's (0.9, 0.999), Lion's the Lion paper's and lion-pytorch's (0.9, 0.99).
        double b[2] = {0.9, adam ? 0.999 : 0.99};
        if (derive_betas(cfg, err, b) < 0) return -1;
        neox_config_set_derived_float(cfg, adam ? "adam_beta1" : "lion_beta1", b[0]);
        neox_config_set_derived_float(cfg, adam ? "adam_beta2" : "lion_beta2", b[1]);
    }
    if (adam) {
        neox_config_set_derived_float(cfg, "adam_eps", sub_number(cfg, NEOX_SK_optimizer__params__eps, 1e-8));
        if (onebit && derive_onebit(cfg, err) < 0) return -1;
    } else if (madgrad) {  // GPT-NeoX's madgrad_wd defaults
        double momentum = sub_number(cfg, NEOX_SK_optimizer__params__momentum, 0.9);
        if (momentum >= 1.0)  // (its p = momentum * p + (1 - momentum) * z would never move)
            return derive_fail(cfg, err, "optimizer", "params.momentum = %g: madgrad_wd needs a momentum in [0, 1)", momentum);
        neox_config_set_derived_float(cfg, "madgrad_momentum", momentum);
        neox_config_set_derived_float(cfg, "madgrad_eps", sub_number(cfg, NEOX_SK_optimizer__params__eps, 1e-6));
    } else if (sm3) {
        if (derive_sm3(cfg, err) < 0) return -1;
    } else if (!lion) {
        neox_config_set_derived_float(cfg, "sgd_momentum", sub_number(cfg, NEOX_SK_optimizer__params__momentum, 0.0));
    }
    if (neox_config_float(cfg, min_lr) > lr_value)
        return derive_fail(cfg, err, "min_lr", "min_lr (%g) must not exceed lr (%g)", neox_config_float(cfg, min_lr), lr_value);
    return 0;
}

// ---- schedule, checkpoints, model shape ----------------------------------------------------------

// The LR schedule length as GPT-NeoX's get_learning_rate_scheduler computes it, and the warmup.
static int derive_schedule(neox_config *cfg, neox_error *err) {
    int has_iters = !is_none(cfg, "lr_decay_iters"), has_fraction = !is_none(cfg, "lr_decay_fraction");
    if (has_iters && has_fraction)
        return derive_fail(cfg, err, "lr_decay_fraction", "set lr_decay_iters or lr_decay_fraction, not both");
    if (!has_iters && !is_none(cfg, "train_iters")) {
        int64_t train = int_of(cfg, "train_iters");
        int64_t n = has_fraction ? (int64_t)floor((double)train * neox_config_float(cfg, lr_decay_fraction)) : train;
        neox_config_set_derived_int(cfg, "lr_decay_iters", n < 1 ? 1 : n);
    }
    if (!is_none(cfg, "lr_decay_iters")) {
        int64_t n = int_of(cfg, "lr_decay_iters");
        neox_config_set_derived_float(cfg, "warmup_iters", neox_config_float(cfg, warmup) * (double)(n < 1 ? 1 : n));
    }
    neox_config_set_derived_bool(cfg, "dynamic_loss_scale", is_none(cfg, "loss_scale"));
    const neox_config_slot *clip = neox_config_slot_of(cfg, "clip_grad");
    double clipping = neox_config_float(cfg, gradient_clipping);
    if (clip->set && clip->set->number != clipping)
        return derive_fail(cfg, err, "clip_grad", "GPT-NeoX replaces clip_grad with gradient_clipping (%g); set gradient_clipping", clipping);
    neox_config_set_derived_float(cfg, "clip_grad", clipping);
    return 0;
}

static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// The iterations at which checkpoints are saved: checkpoint_factor steps (linear or log scale) below
// train_iters, plus extra_save_iters, sorted and unique.
static int derive_save_iters(neox_config *cfg, neox_error *err) {
    const neox_value *extra = val(cfg, "extra_save_iters");
    int has_factor = !is_none(cfg, "checkpoint_factor");
    if (!is_none(cfg, "save") && !has_factor && extra->kind == NEOX_VALUE_NULL)
        return derive_fail(cfg, err, "save", "checkpoint_factor or extra_save_iters must be set when save is set");
    if (!has_factor && extra->kind == NEOX_VALUE_NULL) return 0;
    int log_scale = strcasecmp(neox_config_str(cfg, checkpoint_scale), "log") == 0;
    int64_t factor = has_factor ? int_of(cfg, "checkpoint_factor") : 0;
    if (log_scale && has_factor && factor < 2)
        return derive_fail(cfg, err, "checkpoint_factor", "must be at least 2 with checkpoint_scale 'log'");
    int64_t train = is_none(cfg, "train_iters") ? 0 : int_of(cfg, "train_iters");
    size_t n = 0, cap = 16;
    int64_t *iters = neox_malloc(cap * sizeof *iters);
    for (int i = 0; i < extra->count; i++) {
        if (extra->items[i]->kind != NEOX_VALUE_INT) {
            free(iters);
            return derive_fail(cfg, err, "extra_save_iters", "must be a list of integers");
        }
        if (n == cap) iters = neox_realloc(iters, (cap *= 2) * sizeof *iters);
        iters[n++] = extra->items[i]->integer;
    }
    for (int64_t step = factor; has_factor && step < train; step = log_scale ? step * factor : step + factor) {
        if (n == cap) iters = neox_realloc(iters, (cap *= 2) * sizeof *iters);
        iters[n++] = step;
    }
    qsort(iters, n, sizeof *iters, cmp_int64);
    neox_value *list = neox_config_new_value(cfg, NEOX_VALUE_LIST);
    list->items = neox_malloc((n ? n : 1) * sizeof *list->items);
    for (size_t i = 0; i < n; i++) {
        if (i && iters[i] == iters[i - 1]) continue;
        neox_value *v = neox_calloc(1, sizeof *v);
        v->kind = NEOX_VALUE_INT;
        v->integer = iters[i];
        v->number = (double)iters[i];
        list->items[list->count++] = v;
    }
    free(iters);
    neox_config_set_derived(cfg, "save_iters", list);
    return 0;
}

static neox_value *new_string_item(const char *s) {
    neox_value *v = neox_calloc(1, sizeof *v);
    v->kind = NEOX_VALUE_STRING;
    v->string = neox_strdup(s);
    return v;
}

// attention_config: [[["global"], 12]] or [[["flash"], "all"]] or an already expanded list of names,
// expanded to one attention type per layer as GPT-NeoX's expand_attention_types does.
static int derive_attention(neox_config *cfg, neox_error *err, int64_t layers) {
    const neox_value *spec = val(cfg, "attention_config");
    neox_value *list = neox_config_new_value(cfg, NEOX_VALUE_LIST);
    list->items = neox_malloc((size_t)layers * sizeof *list->items);
    static const char *const bad_form = "must be a list of [[types...], count] pairs (count an integer or \"all\")";
    if (spec->kind == NEOX_VALUE_NULL) {
        for (int64_t i = 0; i < layers; i++) list->items[list->count++] = new_string_item("global");
    } else if (spec->kind != NEOX_VALUE_LIST) {
        return derive_fail(cfg, err, "attention_config", "%s", bad_form);
    } else {
        int all_strings = 1;
        for (int i = 0; i < spec->count; i++) all_strings &= spec->items[i]->kind == NEOX_VALUE_STRING;
        if (all_strings && spec->count == 1 && strcmp(spec->items[0]->string, "flash") == 0) {
            for (int64_t i = 0; i < layers; i++) list->items[list->count++] = new_string_item("flash");
        } else if (all_strings) {
            for (int i = 0; i < spec->count && list->count < layers; i++) list->items[list->count++] = new_string_item(spec->items[i]->string);
            if (spec->count != layers)
                return derive_fail(cfg, err, "attention_config", "lists %d attention types for %lld layers", spec->count, (long long)layers);
        } else {
            int64_t total = 0;
            for (int i = 0; i < spec->count; i++) {
                const neox_value *pair = spec->items[i];
                if (pair->kind != NEOX_VALUE_LIST || pair->count != 2 || pair->items[0]->kind != NEOX_VALUE_LIST ||
                    pair->items[0]->count == 0)
                    return derive_fail(cfg, err, "attention_config", "%s", bad_form);
                const neox_value *types = pair->items[0], *count = pair->items[1];
                for (int t = 0; t < types->count; t++)
                    if (types->items[t]->kind != NEOX_VALUE_STRING) return derive_fail(cfg, err, "attention_config", "%s", bad_form);
                int64_t repeat;
                if (count->kind == NEOX_VALUE_STRING && strcmp(count->string, "all") == 0) {
                    if (layers % types->count != 0)
                        return derive_fail(cfg, err, "attention_config", "num_layers %lld is not divisible by the pattern length %d",
                                           (long long)layers, types->count);
                    repeat = layers / types->count;
                    total = 0, list->count = 0;  // "all" replaces the whole list, as in GPT-NeoX
                    for (int64_t r = 0; r < repeat; r++)
                        for (int t = 0; t < types->count; t++) list->items[list->count++] = new_string_item(types->items[t]->string);
                    total = layers;
                    break;
                }
                if (count->kind != NEOX_VALUE_INT || count->integer < 0) return derive_fail(cfg, err, "attention_config", "%s", bad_form);
                repeat = count->integer;
                total += repeat * types->count;
                if (total > layers)
                    return derive_fail(cfg, err, "attention_config", "covers more than num_layers (%lld) layers", (long long)layers);
                for (int64_t r = 0; r < repeat; r++)
                    for (int t = 0; t < types->count; t++) list->items[list->count++] = new_string_item(types->items[t]->string);
            }
            if (total != layers)
                return derive_fail(cfg, err, "attention_config", "covers %lld layers, but num_layers is %lld", (long long)total, (long long)layers);
        }
    }
    static const char *const known = "|global|local|sparse_fixed|sparse_variable|bigbird|bslongformer|gmlp|amlp|flash|rwkv|mamba|";
    for (int i = 0; i < list->count; i++) {
        const char *t = list->items[i]->string;
        char probe[80];
        snprintf(probe, sizeof probe, "|%.70s|", t);
        if (!strstr(known, probe)) return derive_fail(cfg, err, "attention_config", "attention type '%s' is not recognized", t);
        if (strcmp(t, "global") != 0 && strcmp(t, "flash") != 0)
            return derive_fail(cfg, err, "attention_config", "attention type '%s' is not supported by neox.c (supported: global, flash)", t);
    }
    neox_config_set_derived(cfg, "attention_config", list);
    return 0;
}

// The first string anywhere in v naming a non-transformer layer kind, or NULL.
static const char *non_transformer_kind(const neox_value *v) {
    if (!v) return NULL;
    if (v->kind == NEOX_VALUE_STRING)
        return !strcmp(v->string, "mamba") || !strcmp(v->string, "rwkv") ? v->string : NULL;
    for (int i = 0; (v->kind == NEOX_VALUE_LIST || v->kind == NEOX_VALUE_MAP) && i < v->count; i++) {
        const char *kind = non_transformer_kind(v->items[i]);
        if (kind) return kind;
    }
    return NULL;
}

int neox_config_check_layer_kinds(const neox_config *cfg, neox_error *err) {
    const char *kind = non_transformer_kind(val(cfg, "attention_config"));
    if (!kind) return 0;
    return derive_fail(cfg, err, "attention_config", "layer type '%s' (%s) is not supported by neox.c: it builds "
                       "transformer layers (attention types global, flash)", kind,
                       !strcmp(kind, "mamba") ? "a Mamba selective state-space block" : "an RWKV time-mixing block");
}

static int derive_model(neox_config *cfg, neox_error *err) {
    static const char *const required[] = {"num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (is_none(cfg, required[i])) return derive_fail(cfg, err, required[i], "is not set (a model needs it)");
    int64_t hidden = int_of(cfg, "hidden_size"), heads = int_of(cfg, "num_attention_heads");
    if (hidden % heads != 0)
        return derive_fail(cfg, err, "num_attention_heads", "hidden_size %lld is not divisible by num_attention_heads %lld",
                           (long long)hidden, (long long)heads);
    if (!is_none(cfg, "num_kv_heads") && heads % int_of(cfg, "num_kv_heads") != 0)
        return derive_fail(cfg, err, "num_kv_heads", "num_attention_heads %lld is not divisible by num_kv_heads %lld",
                           (long long)heads, (long long)int_of(cfg, "num_kv_heads"));
    if (!is_none(cfg, "seq_length") && int_of(cfg, "max_position_embeddings") < int_of(cfg, "seq_length"))
        return derive_fail(cfg, err, "max_position_embeddings", "%lld is less than seq_length %lld",
                           (long long)int_of(cfg, "max_position_embeddings"), (long long)int_of(cfg, "seq_length"));
    if (is_none(cfg, "sparsity_config")) neox_config_set_derived(cfg, "sparsity_config", neox_config_new_value(cfg, NEOX_VALUE_MAP));
    return derive_attention(cfg, err, int_of(cfg, "num_layers"));
}

// Data paths: data_path or all three of train/valid/test_data_paths; weights default to 1.0 each.
static int derive_data(neox_config *cfg, neox_error *err) {
    static const char *const splits[] = {"train", "valid", "test"};
    int given = 0;
    for (int s = 0; s < 3; s++) {
        char paths[32], weights[32];
        snprintf(paths, sizeof paths, "%s_data_paths", splits[s]);
        snprintf(weights, sizeof weights, "%s_data_weights", splits[s]);
        const neox_value *p = val(cfg, paths), *w = val(cfg, weights);
        if (p->kind == NEOX_VALUE_NULL) continue;
        given++;
        if (w->kind == NEOX_VALUE_NULL) {
            neox_value *list = neox_config_new_value(cfg, NEOX_VALUE_LIST);
            list->items = neox_malloc((size_t)(p->count ? p->count : 1) * sizeof *list->items);
            for (int i = 0; i < p->count; i++) {
                neox_value *one = neox_calloc(1, sizeof *one);
                one->kind = NEOX_VALUE_FLOAT;
                one->number = 1.0;
                list->items[list->count++] = one;
            }
            neox_config_set_derived(cfg, weights, list);
        } else if (w->count != p->count) {
            return derive_fail(cfg, err, weights, "has %d weights for %d paths", w->count, p->count);
        }
    }
    if (given != 0 && given != 3)
        return derive_fail(cfg, err, "train_data_paths", "set all of train_data_paths, valid_data_paths and test_data_paths, or none");
    if (given == 3 && !is_none(cfg, "data_path"))
        return derive_fail(cfg, err, "data_path", "set either data_path or train/valid/test_data_paths, not both");
    // Checked here so --print-config fails on a bad split (with file:line), not the first training step.
    double split_weights[3];
    neox_error split_err = {0};
    if (!is_none(cfg, "split") && neox_split_weights(neox_config_str(cfg, split), split_weights, &split_err) != 0)
        return derive_fail(cfg, err, "split", "%s", split_err.message);
    if (is_none(cfg, "text_gen_type"))
        neox_config_set_derived_str(cfg, "text_gen_type", is_none(cfg, "sample_input_file") ? "unconditional" : "input-file");
    return 0;
}

int neox_config_derive(neox_config *cfg, neox_error *err) {
    int64_t dp = 1;
    // The model first, so an unsupported attention type is reported before any batch-size complaint.
    if (derive_model(cfg, err) < 0 || derive_parallel(cfg, err, &dp) < 0 || derive_batch(cfg, err, dp) < 0 ||
        derive_precision(cfg, err) < 0 || derive_zero(cfg, err) < 0 || derive_optimizer(cfg, err) < 0 ||
        derive_schedule(cfg, err) < 0 || derive_save_iters(cfg, err) < 0 || derive_data(cfg, err) < 0)
        return -1;
    return 0;
}
