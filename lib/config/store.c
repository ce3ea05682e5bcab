// store.c: the value store of a loaded config — one slot per schema key holding its effective
// value, where that came from and what a file set — and everything that reads or writes a slot:
// the loading steps set defaults, file values and derived values through it, and every reader (the
// typed accessors of config.h, validation, derivation, printing) gets values from it. It calls only
// the schema lookup (lookup.c) and the value tree (yaml.c), never the loading steps, so calls between
// the files of lib/config go one way: load.c -> validate.c, derive.c -> store.c -> lookup.c.
#include <stdlib.h>
#include <string.h>

#include "config/store.h"

neox_config *neox_config_store_new(int npaths) {
    neox_config *cfg = neox_calloc(1, sizeof *cfg);
    cfg->slots = neox_calloc((size_t)neox_key_count, sizeof *cfg->slots);
    cfg->paths = neox_calloc((size_t)npaths, sizeof *cfg->paths);
    cfg->trees = neox_calloc((size_t)npaths, sizeof *cfg->trees);
    cfg->read = neox_calloc((size_t)neox_key_count, 1);
    cfg->read_sub = neox_calloc((size_t)neox_subkey_count, 1);
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

const neox_value *neox_value_get(const neox_value *map, const char *key) {
    if (!map || map->kind != NEOX_VALUE_MAP) return NULL;
    for (int i = 0; i < map->count; i++)
        if (neox_key_equal(map->keys[i], key)) return map->items[i];
    return NULL;
}

const char *neox_value_where(const neox_value *v, char *buf, size_t size) {
    if (!v || !v->file) snprintf(buf, size, "default");
    else snprintf(buf, size, "%s:%d", v->file, v->line);
    return buf;
}

neox_value *neox_config_own_value(neox_config *cfg, neox_value *v) {
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
    return neox_config_own_value(cfg, v);
}

void neox_config_set_default(neox_config *cfg, neox_key_id key, neox_value *v) {
    cfg->slots[key].value = v;
    cfg->slots[key].source = NEOX_SOURCE_DEFAULT;
}

void neox_config_set_from_file(neox_config *cfg, neox_key_id key, const neox_value *v) {
    neox_config_slot *s = &cfg->slots[key];
    s->set = v;
    s->value = v;
    s->source = NEOX_SOURCE_FILE;
}

void neox_config_set_derived(neox_config *cfg, const char *key, neox_value *v) {
    neox_config_slot *s = &cfg->slots[neox_key_id_of(key)];
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
    return &cfg->slots[neox_key_id_of(key)];
}

// ---- reading ---------------------------------------------------------------------------------

// Appends name to the NEOX_CONFIG_READS file the first time it is read (flag: its read mark).
static void record_read(const neox_config *cfg, unsigned char *flag, const char *name) {
    if (*flag) return;
    *flag = 1;
    if (cfg->reads) fprintf(cfg->reads, "%s\n", name);
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
