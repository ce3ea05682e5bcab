// run_state.c: the one writer of a checkpoint's run state's common part and its one reader
// (state/train.json, written by the trainer and by neox-convert from-hf): parsed and every field checked for its type and range before the
// trainer, the evaluator, verify or a conversion uses it, so a damaged or hand-edited state is
// refused naming the field instead of resuming with a negative step count or position.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt.h"

typedef enum { FIELD_INT, FIELD_NUMBER, FIELD_STRING, FIELD_OBJECT, FIELD_ARRAY } field_type;

typedef struct field_rule {
    const char *key;
    field_type type;
    int required;
    double min;              // FIELD_INT and FIELD_NUMBER: the smallest value allowed
    const char *const *one_of;  // FIELD_STRING: the values allowed (NULL-terminated), NULL for any
} field_rule;

static const char *const optimizers[] = {"adam", "sgd", "onebitadam", "lion", "madgrad_wd", "sm3", NULL};
static const char *const lr_styles[] = {"constant", "linear", "cosine", "exponential", NULL};

static const field_rule top_rules[] = {
    {"iteration", FIELD_INT, 1, 0, NULL},          {"optimizer_steps", FIELD_INT, 1, 0, NULL},
    {"train_position", FIELD_INT, 1, 0, NULL},     {"valid_position", FIELD_INT, 1, 0, NULL},
    {"seed", FIELD_INT, 0, 0, NULL},  // absent (and dropout_rows): saved with no_save_rng
    {"dropout_rows", FIELD_INT, 0, 0, NULL},
    {"dropout_draws", FIELD_INT, 0, 0, NULL},  // older checkpoints' counter (micro-batches; unused)
    {"skipped_total", FIELD_INT, 1, 0, NULL},      {"nonfinite_in_a_row", FIELD_INT, 1, 0, NULL},
    {"train_samples", FIELD_INT, 0, 0, NULL},      {"overflow_skips", FIELD_INT, 0, 0, NULL},
    {"optimizer", FIELD_STRING, 0, 0, optimizers}, {"model", FIELD_OBJECT, 1, 0, NULL},
    {"config_files", FIELD_ARRAY, 1, 0, NULL},     {"lr_schedule", FIELD_OBJECT, 0, 0, NULL},
    {"loss_scaler", FIELD_OBJECT, 0, 0, NULL},     {"gradient_compression", FIELD_OBJECT, 0, 0, NULL},
};

static const field_rule lr_rules[] = {
    {"lr", FIELD_NUMBER, 1, 0, NULL},           {"min_lr", FIELD_NUMBER, 1, 0, NULL},
    {"warmup_iters", FIELD_NUMBER, 1, 0, NULL}, {"decay_iters", FIELD_INT, 1, 0, NULL},
    {"style", FIELD_STRING, 1, 0, lr_styles},   {"num_iters", FIELD_INT, 0, 0, NULL},
};

// DeepSpeed's scaler starts with last_overflow = -1 (no overflow yet).
static const field_rule scaler_rules[] = {
    {"scale", FIELD_NUMBER, 1, 0, NULL},     {"hysteresis_left", FIELD_INT, 1, 0, NULL},
    {"iteration", FIELD_INT, 1, 0, NULL},    {"last_overflow", FIELD_INT, 1, -1, NULL},
};

static const field_rule model_rules[] = {
    {"num_layers", FIELD_INT, 1, 1, NULL},          {"hidden_size", FIELD_INT, 1, 1, NULL},
    {"num_attention_heads", FIELD_INT, 1, 1, NULL}, {"num_kv_heads", FIELD_INT, 1, 1, NULL},
    {"intermediate_size", FIELD_INT, 1, 1, NULL},   {"padded_vocab_size", FIELD_INT, 1, 1, NULL},
};

static const char *type_name(field_type t) {
    static const char *names[] = {"an integer", "a finite number", "a string", "an object", "an array"};
    return names[t];
}

static int type_ok(json_t *v, field_type t) {
    switch (t) {
    case FIELD_INT: return json_is_integer(v);
    case FIELD_NUMBER: return json_is_number(v) && isfinite(json_number_value(v));
    case FIELD_STRING: return json_is_string(v);
    case FIELD_OBJECT: return json_is_object(v);
    default: return json_is_array(v);
    }
}

static int one_of(const char *s, const char *const *allowed) {
    for (int i = 0; allowed[i]; i++)
        if (!strcmp(s, allowed[i])) return 1;
    return 0;
}

// Checks obj's fields against rules; where names the object ("" for the top level, "model." ...).
static int check_fields(json_t *obj, const field_rule *rules, size_t n, const char *file, const char *where,
                        neox_error *err) {
    for (size_t i = 0; i < n; i++) {
        const field_rule *r = &rules[i];
        json_t *v = json_object_get(obj, r->key);
        if (!v) {
            if (r->required) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s%s is missing", file, where, r->key);
            continue;
        }
        if (!type_ok(v, r->type))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s%s must be %s", file, where, r->key, type_name(r->type));
        if ((r->type == FIELD_INT || r->type == FIELD_NUMBER) && json_number_value(v) < r->min)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s%s = %g must be >= %g", file, where, r->key,
                             json_number_value(v), r->min);
        if (r->type == FIELD_STRING && r->one_of && !one_of(json_string_value(v), r->one_of))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s%s '%s' is not one this version writes", file, where, r->key,
                             json_string_value(v));
    }
    return 0;
}

// The model shape: the sizes above, and every other field (enumerations, flags) a small integer.
static int check_model(json_t *model, const char *file, neox_error *err) {
    if (check_fields(model, model_rules, sizeof model_rules / sizeof *model_rules, file, "model.", err) != 0) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(model, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model.%s must be an integer in [0, 2^30]", file, key);
    }
    return 0;
}

static int check_config_files(json_t *files, const char *file, neox_error *err) {
    if (json_array_size(files) == 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: config_files is empty", file);
    for (size_t i = 0; i < json_array_size(files); i++)
        if (!json_is_string(json_array_get(files, i)))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: config_files[%zu] must be a string", file, i);
    return 0;
}

int neox_ckpt_check_run_state(struct json_t *state, const char *file, neox_error *err) {
    if (!json_is_object(state)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a JSON object", file);
    if (check_fields(state, top_rules, sizeof top_rules / sizeof *top_rules, file, "", err) != 0) return -1;
    json_t *lr = json_object_get(state, "lr_schedule"), *ls = json_object_get(state, "loss_scaler");
    if (lr && check_fields(lr, lr_rules, sizeof lr_rules / sizeof *lr_rules, file, "lr_schedule.", err) != 0) return -1;
    if (ls && check_fields(ls, scaler_rules, sizeof scaler_rules / sizeof *scaler_rules, file, "loss_scaler.", err) != 0)
        return -1;
    if (check_model(json_object_get(state, "model"), file, err) != 0) return -1;
    return check_config_files(json_object_get(state, "config_files"), file, err);
}

int neox_ckpt_read_run_state(const neox_ckpt_reader *r, const char *dir, struct json_t **state, neox_error *err) {
    *state = NULL;
    void *data;
    size_t size;
    if (neox_ckpt_read_bytes(r, "state/train.json", &data, &size, err) != 0) return neox_fail_context(err, "%s", dir);
    char *file = neox_asprintf("%s: state/train.json", dir);
    json_error_t jerr;
    json_t *root = json_loadb(data, size, JSON_REJECT_DUPLICATES, &jerr);
    free(data);
    int rc = root ? neox_ckpt_check_run_state(root, file, err)
                  : neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d:%d: %s", file, jerr.line, jerr.column, jerr.text);
    free(file);
    if (rc != 0) json_decref(root);
    else *state = root;
    return rc;
}

json_t *neox_ckpt_run_state_json(const neox_run_counters *c, const neox_model_desc *d, json_t *config_files) {
    json_t *s = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}",
                          "iteration", (json_int_t)c->iteration, "optimizer_steps", (json_int_t)c->optimizer_steps,
                          "train_samples", (json_int_t)c->train_samples, "train_position", (json_int_t)c->train_position,
                          "valid_position", (json_int_t)c->valid_position, "skipped_total", (json_int_t)c->skipped_total,
                          "nonfinite_in_a_row", (json_int_t)c->nonfinite_in_a_row,
                          "overflow_skips", (json_int_t)c->overflow_skips, "model", neox_ckpt_model_shape_json(d),
                          "config_files", config_files);
    if (c->has_rng) {
        json_object_set_new(s, "seed", json_integer(c->seed));
        json_object_set_new(s, "dropout_rows", json_integer(c->dropout_rows));
    }
    return s;
}
