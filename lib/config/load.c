// load.c: loads GPT-NeoX config files as deepy.py does — each file a YAML mapping, keys with '-'
// and '_' the same key, files merged with a key set twice (in one file or across files) an error
// naming both places — then fills every schema key of the value store (store.c) with its file value
// or default and runs validation (validate.c) and derivation (derive.c). The top of lib/config's
// calls: nothing in lib/config calls back here.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"

// Parses each default once into a value owned by the config (schema defaults are YAML text).
static int fill_defaults(neox_config *cfg, neox_error *err) {
    for (int i = 0; i < neox_key_count; i++) {
        const neox_key_spec *k = &neox_key_specs[i];
        neox_value *v;
        if (!k->default_text) {
            v = neox_config_new_value(cfg, NEOX_VALUE_NULL);
        } else {
            v = neox_yaml_parse(k->default_text, strlen(k->default_text), "schema", err);
            if (!v) return neox_fail_context(err, "default of key '%s'", k->name);
            v->file = NULL;  // scalar defaults; no default is a container
            neox_config_own_value(cfg, v);
        }
        neox_config_set_default(cfg, (neox_key_id)i, v);
    }
    return 0;
}

// Adds the top-level keys of one file; a key already set (here or in an earlier file) is an error.
static int merge_file(neox_config *cfg, const neox_value *tree, const char *path, neox_error *err) {
    if (tree->kind == NEOX_VALUE_NULL)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: empty config file (expected a mapping of GPT-NeoX keys)", path);
    if (tree->kind != NEOX_VALUE_MAP)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: the top level of a config must be a mapping of keys, not a %s",
                         path, tree->line, tree->kind == NEOX_VALUE_LIST ? "list" : "scalar");
    for (int i = 0; i < tree->count; i++) {
        const char *key = tree->keys[i];
        const neox_value *v = tree->items[i];
        int k = neox_key_index(key);
        if (k < 0) {
            const char *hint = neox_key_suggest(key, neox_key_specs, neox_key_count, "");
            if (hint)
                return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: unknown key '%s'; did you mean '%s'?", path, v->line,
                                 key, hint);
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: unknown key '%s' (keys: docs/config.md)", path, v->line, key);
        }
        const neox_config_slot *s = &cfg->slots[k];
        if (s->set) {
            char first[PATH_MAX + 32];
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: key '%s' is set twice: first at %s", path, v->line,
                             neox_key_specs[k].name, neox_value_where(s->set, first, sizeof first));
        }
        if (neox_key_specs[k].derived)
            return neox_fail(err, NEOX_EXIT_USAGE,
                             "%s:%d: key '%s' is derived from other keys and cannot be set (docs/config.md)", path,
                             v->line, neox_key_specs[k].name);
        neox_config_set_from_file(cfg, (neox_key_id)k, v);
    }
    return 0;
}

// A key typed as a number given a plain exponent without a '.' or a sign (1e-06: YAML 1.1, so PyYAML
// and GPT-NeoX, read it as a string, on which GPT-NeoX's type check then fails) takes it as the number
// YAML 1.2 and JSON read; a key of any other type keeps the string (docs/config.md, "Numbers written
// with an exponent"). Sub-keys by their dotted path, through dicts at any depth.
static void take_number_text(neox_value *v, const neox_key_spec *k) {
    if (!k || k->type != NEOX_TYPE_FLOAT || v->kind != NEOX_VALUE_STRING || !v->number_text) return;
    free(v->string);
    v->string = NULL;
    v->kind = NEOX_VALUE_FLOAT;
}

static void take_number_texts(neox_value *map, const char *path) {
    for (int i = 0; map->kind == NEOX_VALUE_MAP && i < map->count; i++) {
        char full[512];
        const neox_key_spec *k = NULL;
        if (path) {
            snprintf(full, sizeof full, "%s.%s", path, map->keys[i]);
            k = neox_subkey_find(full);
        } else {
            int id = neox_key_index(map->keys[i]);
            k = id >= 0 ? &neox_key_specs[id] : NULL;
            snprintf(full, sizeof full, "%s", k ? k->name : map->keys[i]);
        }
        take_number_text(map->items[i], k);
        take_number_texts(map->items[i], full);
    }
}

static int read_files(neox_config *cfg, const char *const *paths, int npaths, neox_error *err) {
    for (int i = 0; i < npaths; i++) {
        cfg->paths[i] = neox_strdup(paths[i]);
        cfg->npaths = i + 1;
        size_t size;
        char *text = neox_read_file(paths[i], &size, err);
        if (!text) return -1;
        cfg->trees[i] = neox_yaml_parse(text, size, cfg->paths[i], err);
        free(text);
        if (!cfg->trees[i]) return -1;
        take_number_texts(cfg->trees[i], NULL);
        if (merge_file(cfg, cfg->trees[i], cfg->paths[i], err) < 0) return -1;
    }
    return 0;
}

static void append_name(char **list, size_t *len, const char *name) {
    *list = neox_realloc(*list, *len + strlen(name) + 3);
    *len += (size_t)sprintf(*list + *len, "%s%s", *len ? ", " : "", name);
}

// The ignored sub-keys set inside map (at path), depth first. An ignored dict stands for its contents.
static void append_ignored_subkeys(char **list, size_t *len, const char *path, const neox_value *map) {
    for (int i = 0; map && map->kind == NEOX_VALUE_MAP && i < map->count; i++) {
        char full[512];
        snprintf(full, sizeof full, "%s.%s", path, map->keys[i]);
        const neox_key_spec *k = neox_subkey_find(full);
        if (!k) continue;  // (validation refused unknown sub-keys already)
        if (k->use == NEOX_KEY_IGNORED) append_name(list, len, full);
        else append_ignored_subkeys(list, len, full, map->items[i]);
    }
}

// Keys that only mean something under one value of another key: the rotary settings without
// pos_emb rotary. Set beside another position embedding they change nothing, so say so (GPT-NeoX's
// own configs often carry rotary_pct with learned positions).
static void notice_unused_by_choice(const neox_config *cfg) {
    const char *pos = neox_config_str(cfg, pos_emb);
    if (!pos || strcmp(pos, "rotary") == 0) return;
    static const int rotary_keys[] = {NEOX_K_rotary_pct, NEOX_K_rotary_emb_base, NEOX_K_rope_scaling};
    size_t len = 0;
    char *list = NULL;
    for (size_t i = 0; i < sizeof rotary_keys / sizeof *rotary_keys; i++)
        if (cfg->slots[rotary_keys[i]].set) append_name(&list, &len, neox_key_specs[rotary_keys[i]].name);
    if (list) neox_notice("config keys with no effect with pos_emb %s (they configure rotary embeddings): %s", pos, list);
    free(list);
}

// Transformer Engine's FP8 recipe without precision fp8 (GPT-NeoX's 1-3B-transformer-engine.yml sets
// it beside bfloat16, where GPT-NeoX reads it only for te_fp8_mha).
static void notice_fp8_recipe(const neox_config *cfg) {
    const char *precision = neox_config_str(cfg, precision);
    if (precision && strcmp(precision, "fp8") == 0) return;
    static const int fp8_keys[] = {NEOX_K_te_fp8_format, NEOX_K_te_fp8_wgrad, NEOX_K_te_fp8_amax_history_len,
                                   NEOX_K_te_fp8_amax_compute_algo, NEOX_K_te_fp8_margin};
    size_t len = 0;
    char *list = NULL;
    for (size_t i = 0; i < sizeof fp8_keys / sizeof *fp8_keys; i++)
        if (cfg->slots[fp8_keys[i]].set) append_name(&list, &len, neox_key_specs[fp8_keys[i]].name);
    if (list) neox_notice("config keys with no effect with precision %s (they configure precision fp8): %s",
                          precision ? precision : "fp32", list);
    free(list);
}

// ZeRO-3's settings below stage 3: they configure the parameter gathers only stage 3 makes.
static void notice_stage3_keys(const neox_config *cfg) {
    if (neox_config_int_or(cfg, zero_stage, 0) >= 3) {  // stage 3 gathers by layer, not after the update
        if (neox_config_sub(cfg, zero_optimization__allgather_bucket_size))
            neox_notice("config key with no effect at zero_optimization.stage 3 (parameters are gathered layer by layer "
                        "as they are used, not after the update): zero_optimization.allgather_bucket_size");
        return;
    }
    static const int stage3_keys[] = {
        NEOX_SK_zero_optimization__stage3_prefetch_bucket_size, NEOX_SK_zero_optimization__prefetch_bucket_size,
        NEOX_SK_zero_optimization__stage3_param_persistence_threshold, NEOX_SK_zero_optimization__param_persistence_threshold,
        NEOX_SK_zero_optimization__stage3_model_persistence_threshold, NEOX_SK_zero_optimization__model_persistence_threshold,
        NEOX_SK_zero_optimization__stage3_max_live_parameters, NEOX_SK_zero_optimization__max_live_parameters,
        NEOX_SK_zero_optimization__stage3_max_reuse_distance, NEOX_SK_zero_optimization__max_reuse_distance};
    size_t len = 0;
    char *list = NULL;
    for (size_t i = 0; i < sizeof stage3_keys / sizeof *stage3_keys; i++)
        if (neox_config_sub_id(cfg, stage3_keys[i])) append_name(&list, &len, neox_subkey_specs[stage3_keys[i]].name);
    if (list) neox_notice("config keys with no effect below zero_optimization.stage 3 (they configure its parameter gathers): %s", list);
    free(list);
}

// One notice naming every ignored key and sub-key the files set, each once, so users see them
// without a wall of warnings.
static void notice_ignored(const neox_config *cfg) {
    size_t len = 0;
    char *list = NULL;
    for (int i = 0; i < neox_key_count; i++) {
        if (!cfg->slots[i].set) continue;
        if (neox_key_specs[i].use == NEOX_KEY_IGNORED) append_name(&list, &len, neox_key_specs[i].name);
        else append_ignored_subkeys(&list, &len, neox_key_specs[i].name, cfg->slots[i].set);
    }
    if (list) neox_notice("config keys with no effect in neox.c (DeepSpeed, launcher, logging-service, or kernel-fusion settings): %s", list);
    free(list);
    notice_unused_by_choice(cfg);
    notice_fp8_recipe(cfg);
    notice_stage3_keys(cfg);
}

// Opens the NEOX_CONFIG_READS file when the variable is set: here, where a file that cannot be
// written is an error to return, and not at the first key read, which has no error to return.
static int open_reads_record(neox_config *cfg, neox_error *err) {
    const char *path = getenv("NEOX_CONFIG_READS");
    if (!path || !*path) return 0;
    cfg->reads = fopen(path, "ae");  // (e: O_CLOEXEC)
    if (!cfg->reads) return neox_fail(err, NEOX_EXIT_FAILURE, "NEOX_CONFIG_READS=%s: cannot append: %s", path, strerror(errno));
    setvbuf(cfg->reads, NULL, _IOLBF, 0);  // whole lines, so ranks appending to one file do not interleave
    return 0;
}

neox_config *neox_config_load(const char *const *paths, int npaths, const neox_config_options *opts, neox_error *err) {
    if (npaths <= 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "no config file given");
        return NULL;
    }
    neox_config *cfg = neox_config_store_new(npaths);
    cfg->world_size = opts && opts->world_size > 0 ? opts->world_size : 1;
    cfg->data_parallel_only = opts && opts->data_parallel_only;
    if (open_reads_record(cfg, err) < 0 || fill_defaults(cfg, err) < 0 || read_files(cfg, paths, npaths, err) < 0 ||
        neox_config_check_layer_kinds(cfg, err) < 0 || neox_config_validate_values(cfg, err) < 0 || neox_config_derive(cfg, err) < 0) {
        neox_config_free(cfg);
        return NULL;
    }
    if (!(opts && opts->quiet)) notice_ignored(cfg);
    return cfg;
}

int64_t neox_padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t model_parallel_size) {
    int64_t multiple = (divisible_by > 0 ? divisible_by : 1) * (model_parallel_size > 0 ? model_parallel_size : 1);
    return (vocab_size + multiple - 1) / multiple * multiple;
}

// Here rather than in print.c, so that printing (which loading's error messages call) never calls back
// into loading.
int neox_config_print_files(const char *const *paths, int npaths, const neox_config_options *opts, const char *format,
                            FILE *out, neox_error *err) {
    if (strcmp(format, "text") != 0 && strcmp(format, "json") != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--print-config-format: '%s' is not 'text' or 'json'", format);
    neox_config *cfg = neox_config_load(paths, npaths, opts, err);
    if (!cfg) return -1;
    neox_config_print_as(cfg, format, out);
    neox_config_free(cfg);
    return 0;
}
