// validate.c: checks every value a config file sets against its schema entry — type, range, choice —
// and refuses values that select features neox.c does not implement, naming the feature, the key and
// the file:line; inside the dicts GPT-NeoX hands to DeepSpeed, every sub-key the same way against the
// sub-key schema (an unknown one is an error with the closest known one). Consistency between keys is
// derive.c's job.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/internal.h"

static const char *kind_name(neox_value_kind kind) {
    switch (kind) {
    case NEOX_VALUE_NULL: return "null";
    case NEOX_VALUE_BOOL: return "a bool";
    case NEOX_VALUE_INT: return "an integer";
    case NEOX_VALUE_FLOAT: return "a float";
    case NEOX_VALUE_STRING: return "a string";
    case NEOX_VALUE_LIST: return "a list";
    case NEOX_VALUE_MAP: return "a mapping";
    }
    return "a value";
}

// "FILE:LINE: key 'name': <message>".
static int key_fail(neox_error *err, const neox_key_spec *k, const neox_value *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int key_fail(neox_error *err, const neox_key_spec *k, const neox_value *v, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: key '%s': %s", v->file, v->line, k->name, what);
}

// Is word one of the '|'-separated values of list (case-insensitive, as GPT-NeoX compares choices)?
static int in_list(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncasecmp(p, word, n) == 0) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

// "a, b, c" from "a|b|c".
static const char *list_text(const char *list, char *buf, size_t size) {
    size_t j = 0;
    for (const char *p = list; *p && j + 3 < size; p++) {
        if (*p == '|') buf[j++] = ',', buf[j++] = ' ';
        else buf[j++] = *p;
    }
    buf[j] = 0;
    return buf;
}

// A string that C would read as a number (a quoted "1e-5", "0.1"): worth a hint.
static int looks_numeric(const char *s) {
    char *end;
    strtod(s, &end);
    return *s && *end == 0;
}

static int check_type(const neox_key_spec *k, const neox_value *v, neox_error *err) {
    char buf[512], text[256];
    int ok;
    switch (k->type) {
    case NEOX_TYPE_BOOL: ok = v->kind == NEOX_VALUE_BOOL; break;
    case NEOX_TYPE_INT: ok = v->kind == NEOX_VALUE_INT; break;
    case NEOX_TYPE_FLOAT: ok = v->kind == NEOX_VALUE_INT || v->kind == NEOX_VALUE_FLOAT; break;
    case NEOX_TYPE_STR: ok = v->kind == NEOX_VALUE_STRING; break;
    case NEOX_TYPE_CHOICE:
        if (v->kind != NEOX_VALUE_STRING || !in_list(k->choices, v->string))
            return key_fail(err, k, v, "'%s' is not one of: %s", neox_value_format(v, text, sizeof text),
                            list_text(k->choices, buf, sizeof buf));
        return 0;
    case NEOX_TYPE_LIST: ok = v->kind == NEOX_VALUE_LIST; break;
    case NEOX_TYPE_DICT: ok = v->kind == NEOX_VALUE_MAP; break;
    default: return 0;
    }
    if (ok) return 0;
    static const char *const wanted[] = {"true or false", "an integer", "a number", "a string", "a string",
                                         "a list", "a mapping", "a value"};
    neox_value_format(v, text, sizeof text);
    // (a plain 1e-06 reaches here only for an integer key: a number key has taken it as the number)
    if (v->kind == NEOX_VALUE_STRING && k->type == NEOX_TYPE_INT && v->number_text)
        return key_fail(err, k, v, "expected an integer, got '%s' (a number with an exponent, which YAML 1.1 reads as "
                        "a string and GPT-NeoX's integer keys refuse: write the integer's digits)", v->string);
    if (v->kind == NEOX_VALUE_STRING && (k->type == NEOX_TYPE_FLOAT || k->type == NEOX_TYPE_INT) && looks_numeric(v->string))
        return key_fail(err, k, v, "expected %s, got the string '%s' (quoted, or not a number YAML reads: write the "
                        "number without quotes)", wanted[k->type], v->string);
    return key_fail(err, k, v, "expected %s, got %s (%s)", wanted[k->type], kind_name(v->kind), text);
}

static int check_range(const neox_key_spec *k, const neox_value *v, neox_error *err) {
    if (k->min > k->max || (v->kind != NEOX_VALUE_INT && v->kind != NEOX_VALUE_FLOAT)) return 0;
    if (isnan(v->number) || v->number < k->min || v->number > k->max) {
        char text[64];
        if (isinf(k->max))
            return key_fail(err, k, v, "%s is out of range (must be >= %g)", neox_value_format(v, text, sizeof text), k->min);
        return key_fail(err, k, v, "%s is out of range (must be between %g and %g)",
                        neox_value_format(v, text, sizeof text), k->min, k->max);
    }
    return 0;
}

// Values equal as config values (numbers compare by value, strings exactly, containers item by item).
static int value_equal(const neox_value *a, const neox_value *b) {
    int a_num = a->kind == NEOX_VALUE_INT || a->kind == NEOX_VALUE_FLOAT;
    int b_num = b->kind == NEOX_VALUE_INT || b->kind == NEOX_VALUE_FLOAT;
    if (a_num && b_num) return a->number == b->number;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case NEOX_VALUE_NULL: return 1;
    case NEOX_VALUE_BOOL: return a->boolean == b->boolean;
    case NEOX_VALUE_STRING: return strcmp(a->string, b->string) == 0;
    default:
        if (a->count != b->count) return 0;
        for (int i = 0; i < a->count; i++)
            if (!value_equal(a->items[i], b->items[i]) || (a->keys && strcmp(a->keys[i], b->keys[i]) != 0)) return 0;
        return 1;
    }
}

// A dict-valued feature switch counts as off when empty or when its "enabled" is false, as
// GPT-NeoX and DeepSpeed read them; DeepSpeed's offload dicts are off with `device: none`.
int neox_dict_is_off(const neox_value *v) {
    if (v->kind != NEOX_VALUE_MAP) return 0;
    if (v->count == 0) return 1;
    const neox_value *enabled = neox_value_get(v, "enabled"), *device = neox_value_get(v, "device");
    if (device && device->kind == NEOX_VALUE_STRING && strcasecmp(device->string, "none") == 0) return 1;
    return enabled && enabled->kind == NEOX_VALUE_BOOL && !enabled->boolean;
}

static int check_supported(const neox_key_spec *k, const neox_value *v, const neox_value *def, neox_error *err) {
    char buf[256], text[256];
    if (k->use == NEOX_KEY_UNSUPPORTED && !value_equal(v, def) && !neox_dict_is_off(v))
        return key_fail(err, k, v, "%s is not supported by neox.c (value %s; docs/config.md)", k->feature,
                        neox_value_format(v, text, sizeof text));
    // (an INT key's supported values are its decimal texts: zero_optimization.stage)
    const char *word = v->kind == NEOX_VALUE_STRING ? v->string
                       : v->kind == NEOX_VALUE_INT ? neox_value_format(v, text, sizeof text) : NULL;
    if (k->supported && word && !in_list(k->supported, word))
        return key_fail(err, k, v, "%s '%s' is not supported by neox.c (supported: %s)", k->feature, word,
                        list_text(k->supported, buf, sizeof buf));
    return 0;
}

// The schema default of k as a value (None when it has none); free with neox_value_free.
static neox_value *parse_default(const neox_key_spec *k, neox_error *err) {
    if (!k->default_text) return neox_calloc(1, sizeof(neox_value));  // a NULL-kind value
    return neox_yaml_parse(k->default_text, strlen(k->default_text), "schema", err);
}

// Checks one value against its entry: null-ness, type, range, and (unless a dict around it is switched
// off, which makes its contents moot) whether it selects a refused feature.
static int check_value(const neox_key_spec *k, const neox_value *v, int inside_off, neox_error *err) {
    if (v->kind == NEOX_VALUE_NULL) {
        if (!k->nullable) return key_fail(err, k, v, "must not be null (default: %s)", k->default_text);
        return 0;
    }
    neox_value *def = parse_default(k, err);
    if (!def) return -1;
    int failed = check_type(k, v, err) < 0 || check_range(k, v, err) < 0 ||
                 (!inside_off && check_supported(k, v, def, err) < 0);
    neox_value_free(def);
    return failed ? -1 : 0;
}

static int has_subkeys(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < neox_subkey_count; i++)
        if (strncmp(neox_subkey_specs[i].name, path, n) == 0 && neox_subkey_specs[i].name[n] == '.') return 1;
    return 0;
}

// Every sub-key of the dict map at path, recursively: known (exactly as DeepSpeed spells it), then
// checked like a top-level key. A dict without sub-key entries is not looked into.
static int check_subkeys(const char *path, const neox_value *map, int inside_off, neox_error *err) {
    if (map->kind != NEOX_VALUE_MAP || !has_subkeys(path)) return 0;
    inside_off |= neox_dict_is_off(map);
    char prefix[512], full[512];
    snprintf(prefix, sizeof prefix, "%s.", path);
    for (int i = 0; i < map->count; i++) {
        const neox_value *v = map->items[i];
        snprintf(full, sizeof full, "%s%s", prefix, map->keys[i]);
        const neox_key_spec *k = neox_subkey_find(full);
        if (!k) {
            const char *hint = neox_key_suggest(map->keys[i], neox_subkey_specs, neox_subkey_count, prefix);
            if (hint)
                return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: unknown key '%s'; did you mean '%s'?", v->file, v->line,
                                 full, hint);
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: unknown key '%s' (the keys of '%s': docs/config.md)", v->file,
                             v->line, full, path);
        }
        if (check_subkeys(full, v, inside_off, err) < 0 || check_value(k, v, inside_off, err) < 0) return -1;
    }
    return 0;
}

int neox_config_validate_values(neox_config *cfg, neox_error *err) {
    for (int i = 0; i < neox_key_count; i++) {
        const neox_key_spec *k = &neox_key_specs[i];
        const neox_value *v = cfg->slots[i].set;
        if (!v) continue;
        // Sub-keys first: a misspelt sub-key is named even inside a dict that is refused as a whole.
        if (check_subkeys(k->name, v, 0, err) < 0 || check_value(k, v, 0, err) < 0) return -1;
    }
    return 0;
}
