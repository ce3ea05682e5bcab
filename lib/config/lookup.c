// lookup.c: finding keys in the schema (schema_gen.c): by name with '-' and '_' the same, by dotted
// sub-key path, the closest known name for an unknown one, and each key's default parsed from its
// schema text. It knows nothing of a loaded config; the store (store.c) and the loading steps call it.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "config/lookup.h"

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

neox_key_id neox_key_id_of(const char *name) {
    int i = neox_key_index(name);
    neox_assert(i >= 0, "configuration key '%s' is not in the schema", name);
    return (neox_key_id)i;
}

neox_subkey_id neox_subkey_id_of(const char *path) {
    int i = subkey_index(path);
    neox_assert(i >= 0, "configuration sub-key '%s' is not in the schema", path);
    return (neox_subkey_id)i;
}

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
