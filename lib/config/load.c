// load.c: loads GPT-NeoX config files as deepy.py does — each file a YAML mapping, keys with '-'
// and '_' the same key, files merged with a key set twice (in one file or across files) an error
// naming both places — then fills every schema key (file value or default) and runs validation
// (validate.c) and derivation (derive.c). Also the read accessors of a loaded config.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"

int neox_key_equal(const char *a, const char *b) {
    for (;; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) return 0;
        if (!x) return 1;
    }
}

int neox_key_index(const char *name) {
    for (int i = 0; i < neox_key_count; i++)
        if (neox_key_equal(neox_key_specs[i].name, name)) return i;
    return -1;
}

const neox_key_spec *neox_key_find(const char *name) {
    int i = neox_key_index(name);
    return i < 0 ? NULL : &neox_key_specs[i];
}

const neox_value *neox_value_get(const neox_value *map, const char *key) {
    if (!map || map->kind != NEOX_VALUE_MAP) return NULL;
    for (int i = 0; i < map->count; i++)
        if (neox_key_equal(map->keys[i], key)) return map->items[i];
    return NULL;
}

// Levenshtein distance with '-' == '_', for "did you mean" suggestions.
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    int *row = neox_malloc((m + 1) * sizeof *row);
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            char x = a[i - 1] == '-' ? '_' : a[i - 1], y = b[j - 1] == '-' ? '_' : b[j - 1];
            int best = diag + (x != y);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = row[j];
            row[j] = best;
        }
    }
    int d = row[m];
    free(row);
    return d;
}

const char *neox_key_suggest(const char *name, const neox_key_spec *specs, int count, const char *prefix) {
    const char *best = NULL;
    int best_d = INT_MAX;
    size_t skip = strlen(prefix);
    for (int i = 0; i < count; i++) {
        if (strncmp(specs[i].name, prefix, skip) != 0 || strchr(specs[i].name + skip, '.')) continue;
        int d = edit_distance(name, specs[i].name + skip);
        if (d < best_d) best_d = d, best = specs[i].name;
    }
    int limit = (int)strlen(name) / 3 + 1;
    return best_d <= limit ? best : NULL;
}

static int subkey_index(const char *path) {
    for (int i = 0; i < neox_subkey_count; i++)
        if (strcmp(neox_subkey_specs[i].name, path) == 0) return i;
    return -1;
}

const neox_key_spec *neox_subkey_find(const char *path) {
    int i = subkey_index(path);
    return i < 0 ? NULL : &neox_subkey_specs[i];
}

const char *neox_value_where(const neox_value *v, char *buf, size_t size) {
    if (!v || !v->file) snprintf(buf, size, "default");
    else snprintf(buf, size, "%s:%d", v->file, v->line);
    return buf;
}

// Hands v to the config, which frees it with itself.
static neox_value *own(neox_config *cfg, neox_value *v) {
    if (cfg->nowned == cfg->owned_cap) {
        cfg->owned_cap = cfg->owned_cap ? cfg->owned_cap * 2 : 64;
        cfg->owned = neox_realloc(cfg->owned, (size_t)cfg->owned_cap * sizeof *cfg->owned);
    }
    cfg->owned[cfg->nowned++] = v;
    return v;
}

neox_value *neox_config_new_value(neox_config *cfg, neox_value_kind kind) {
    neox_value *v = neox_calloc(1, sizeof *v);
    v->kind = kind;
    return own(cfg, v);
}

static int slot_index(const char *key) {
    int i = neox_key_index(key);
    neox_assert(i >= 0, "configuration key '%s' is not in the schema", key);
    return i;
}

void neox_config_set_derived(neox_config *cfg, const char *key, neox_value *v) {
    neox_config_slot *s = &cfg->slots[slot_index(key)];
    s->value = v;
    s->source = NEOX_SOURCE_DERIVED;
}

void neox_config_set_derived_int(neox_config *cfg, const char *key, int64_t x) {
    neox_value *v = neox_config_new_value(cfg, NEOX_VALUE_INT);
    v->integer = x;
    v->number = (double)x;
    neox_config_set_derived(cfg, key, v);
}

void neox_config_set_derived_float(neox_config *cfg, const char *key, double x) {
    neox_value *v = neox_config_new_value(cfg, NEOX_VALUE_FLOAT);
    v->number = x;
    neox_config_set_derived(cfg, key, v);
}

void neox_config_set_derived_bool(neox_config *cfg, const char *key, int b) {
    neox_value *v = neox_config_new_value(cfg, NEOX_VALUE_BOOL);
    v->boolean = b != 0;
    v->number = v->boolean;
    neox_config_set_derived(cfg, key, v);
}

void neox_config_set_derived_str(neox_config *cfg, const char *key, const char *s) {
    neox_value *v = neox_config_new_value(cfg, s ? NEOX_VALUE_STRING : NEOX_VALUE_NULL);
    if (s) v->string = neox_strdup(s);
    neox_config_set_derived(cfg, key, v);
}

const neox_config_slot *neox_config_slot_of(const neox_config *cfg, const char *key) {
    return &cfg->slots[slot_index(key)];
}

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
            own(cfg, v);
        }
        cfg->slots[i].value = v;
        cfg->slots[i].source = NEOX_SOURCE_DEFAULT;
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
        neox_config_slot *s = &cfg->slots[k];
        if (s->set) {
            char first[PATH_MAX + 32];
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: key '%s' is set twice: first at %s", path, v->line,
                             neox_key_specs[k].name, neox_value_where(s->set, first, sizeof first));
        }
        if (neox_key_specs[k].derived)
            return neox_fail(err, NEOX_EXIT_USAGE,
                             "%s:%d: key '%s' is derived from other keys and cannot be set (docs/config.md)", path,
                             v->line, neox_key_specs[k].name);
        s->set = v;
        s->value = v;
        s->source = NEOX_SOURCE_FILE;
    }
    return 0;
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
    if (list) neox_notice("config keys with no effect in neox.c (DeepSpeed, launcher, logging-service or kernel-fusion settings): %s", list);
    free(list);
    notice_unused_by_choice(cfg);
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
    neox_config *cfg = neox_calloc(1, sizeof *cfg);
    cfg->slots = neox_calloc((size_t)neox_key_count, sizeof *cfg->slots);
    cfg->paths = neox_calloc((size_t)npaths, sizeof *cfg->paths);
    cfg->trees = neox_calloc((size_t)npaths, sizeof *cfg->trees);
    cfg->world_size = opts && opts->world_size > 0 ? opts->world_size : 1;
    cfg->data_parallel_only = opts && opts->data_parallel_only;
    cfg->read = neox_calloc((size_t)neox_key_count, 1);
    cfg->read_sub = neox_calloc((size_t)neox_subkey_count, 1);
    if (open_reads_record(cfg, err) < 0 || fill_defaults(cfg, err) < 0 || read_files(cfg, paths, npaths, err) < 0 ||
        neox_config_check_layer_kinds(cfg, err) < 0 || neox_config_validate_values(cfg, err) < 0 || neox_config_derive(cfg, err) < 0) {
        neox_config_free(cfg);
        return NULL;
    }
    if (!(opts && opts->quiet)) notice_ignored(cfg);
    return cfg;
}

void neox_config_free(neox_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->npaths; i++) {
        neox_value_free(cfg->trees[i]);
        free(cfg->paths[i]);
    }
    for (int i = 0; i < cfg->nowned; i++) neox_value_free(cfg->owned[i]);
    free(cfg->owned);
    free(cfg->trees);
    free(cfg->paths);
    free(cfg->slots);
    free(cfg->read);
    free(cfg->read_sub);
    if (cfg->reads) fclose(cfg->reads);
    free(cfg);
}

// ---- reading ---------------------------------------------------------------------------------

// Appends name to the NEOX_CONFIG_READS file the first time it is read (flag: its read mark).
static void record_read(const neox_config *cfg, unsigned char *flag, const char *name) {
    if (*flag) return;
    *flag = 1;
    if (cfg->reads) fprintf(cfg->reads, "%s\n", name);
}

neox_key_id neox_key_id_of(const char *name) { return (neox_key_id)slot_index(name); }

static neox_value *parse_spec_default(const neox_key_spec *k) {
    const char *text = k->default_text;
    neox_error err = {0};
    neox_value *v = text ? neox_yaml_parse(text, strlen(text), "schema", &err) : NULL;
    neox_assert(!text || v, "default of key '%s': %s", k->name, err.message);
    return v;
}

static neox_value *parse_default(neox_key_id key) { return parse_spec_default(&neox_key_specs[key]); }

char *neox_key_default_str(neox_key_id key) {
    neox_value *v = parse_default(key);
    char *s = v && v->kind == NEOX_VALUE_STRING ? neox_strdup(v->string) : NULL;
    neox_assert(!v || v->kind == NEOX_VALUE_STRING, "default of key '%s' read as a string", neox_key_specs[key].name);
    neox_value_free(v);
    return s;
}

int64_t neox_key_default_int(neox_key_id key) {
    neox_value *v = parse_default(key);
    neox_assert(!v || v->kind == NEOX_VALUE_INT, "default of key '%s' read as an integer", neox_key_specs[key].name);
    int64_t x = v ? v->integer : 0;
    neox_value_free(v);
    return x;
}

int64_t neox_subkey_default_int(neox_subkey_id path, int64_t fallback) {
    neox_value *v = parse_spec_default(&neox_subkey_specs[path]);
    neox_assert(!v || v->kind == NEOX_VALUE_INT, "default of sub-key '%s' read as an integer",
                neox_subkey_specs[path].name);
    int64_t x = v ? v->integer : fallback;
    neox_value_free(v);
    return x;
}

neox_subkey_id neox_subkey_id_of(const char *path) {
    int i = subkey_index(path);
    neox_assert(i >= 0, "configuration sub-key '%s' is not in the schema", path);
    return (neox_subkey_id)i;
}

// The slot of a key read through an accessor, recorded as read.
static const neox_config_slot *read_slot(const neox_config *cfg, neox_key_id key) {
    record_read(cfg, &cfg->read[key], neox_key_specs[key].name);
    return &cfg->slots[key];
}

const neox_value *neox_config_sub_id(const neox_config *cfg, neox_subkey_id id) {
    const char *path = neox_subkey_specs[id].name;
    record_read(cfg, &cfg->read_sub[id], path);
    char top[256];
    size_t n = strcspn(path, ".");
    snprintf(top, sizeof top, "%.*s", (int)n, path);
    const neox_value *v = read_slot(cfg, neox_key_id_of(top))->value;
    // Sub-key names match exactly (not neox_value_get's '-' == '_'): DeepSpeed reads them so.
    for (const char *p = path + n; v && *p == '.';) {
        size_t len = strcspn(p + 1, ".");
        char part[256];
        snprintf(part, sizeof part, "%.*s", (int)len, p + 1);
        const neox_value *next = NULL;
        for (int j = 0; v->kind == NEOX_VALUE_MAP && j < v->count; j++)
            if (strcmp(v->keys[j], part) == 0) next = v->items[j];
        v = next;
        p += len + 1;
    }
    return v;
}

static const neox_value *typed(const neox_config *cfg, neox_key_id key, neox_value_kind want, const char *what) {
    const neox_value *v = read_slot(cfg, key)->value;
    if (v->kind == NEOX_VALUE_NULL) return v;
    // Validation checked every value against the schema's type, so a mismatch is the reader's mistake.
    neox_assert(v->kind == want || (want == NEOX_VALUE_FLOAT && v->kind == NEOX_VALUE_INT),
                "configuration key '%s' read as %s", neox_key_specs[key].name, what);
    return v;
}

int neox_config_has_id(const neox_config *cfg, neox_key_id key) {
    return read_slot(cfg, key)->value->kind != NEOX_VALUE_NULL;
}

int neox_config_bool_id(const neox_config *cfg, neox_key_id key) {
    return typed(cfg, key, NEOX_VALUE_BOOL, "a bool")->boolean;
}

int64_t neox_config_int_id(const neox_config *cfg, neox_key_id key) {
    return typed(cfg, key, NEOX_VALUE_INT, "an integer")->integer;
}

int64_t neox_config_int_or_id(const neox_config *cfg, neox_key_id key, int64_t fallback) {
    return neox_config_has_id(cfg, key) ? neox_config_int_id(cfg, key) : fallback;
}

double neox_config_float_id(const neox_config *cfg, neox_key_id key) {
    return typed(cfg, key, NEOX_VALUE_FLOAT, "a number")->number;
}

const char *neox_config_str_id(const neox_config *cfg, neox_key_id key) {
    return typed(cfg, key, NEOX_VALUE_STRING, "a string")->string;
}

const neox_value *neox_config_value_id(const neox_config *cfg, neox_key_id key) {
    return read_slot(cfg, key)->value;
}

const char *neox_config_source_id(const neox_config *cfg, neox_key_id key, char *buf, size_t size) {
    const neox_config_slot *s = &cfg->slots[key];
    if (s->source == NEOX_SOURCE_DERIVED) snprintf(buf, size, "derived");
    else return neox_value_where(s->source == NEOX_SOURCE_FILE ? s->value : NULL, buf, size);
    return buf;
}

int neox_config_file_count(const neox_config *cfg) { return cfg->npaths; }

const char *neox_config_file_path(const neox_config *cfg, int i) {
    return i >= 0 && i < cfg->npaths ? cfg->paths[i] : NULL;
}

int64_t neox_padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t model_parallel_size) {
    int64_t multiple = (divisible_by > 0 ? divisible_by : 1) * (model_parallel_size > 0 ? model_parallel_size : 1);
    return (vocab_size + multiple - 1) / multiple * multiple;
}
