// validate.c: checks every value a config file sets against its schema entry — type, range, choice —
// and refuses values that select features neox.c does not implement, naming the feature, the key and
// the file:line. Consistency between keys is derive.c's job.
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

// A string that C would read as a number but YAML 1.1 does not (1e-5, 1.0e5): worth a hint.
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
    if (v->kind == NEOX_VALUE_STRING && (k->type == NEOX_TYPE_FLOAT || k->type == NEOX_TYPE_INT) && looks_numeric(v->string))
        return key_fail(err, k, v, "expected %s, got the string '%s' (YAML 1.1 reads a number with an exponent only "
                        "with a '.' and a signed exponent, e.g. 1.0e-5)", wanted[k->type], v->string);
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
// GPT-NeoX and DeepSpeed read them.
static int dict_is_off(const neox_value *v) {
    if (v->kind != NEOX_VALUE_MAP) return 0;
    if (v->count == 0) return 1;
    const neox_value *enabled = neox_value_get(v, "enabled");
    return enabled && enabled->kind == NEOX_VALUE_BOOL && !enabled->boolean;
}

static int check_supported(const neox_key_spec *k, const neox_value *v, const neox_value *def, neox_error *err) {
    char buf[256], text[256];
    if (k->use == NEOX_KEY_UNSUPPORTED && !value_equal(v, def) && !dict_is_off(v))
        return key_fail(err, k, v, "%s is not supported by neox.c (value %s; docs/config.md)", k->feature,
                        neox_value_format(v, text, sizeof text));
    if (k->supported && v->kind == NEOX_VALUE_STRING && !in_list(k->supported, v->string))
        return key_fail(err, k, v, "%s '%s' is not supported by neox.c (supported: %s)", k->feature, v->string,
                        list_text(k->supported, buf, sizeof buf));
    return 0;
}

int neox_config_validate_values(neox_config *cfg, neox_error *err) {
    for (int i = 0; i < neox_key_count; i++) {
        const neox_key_spec *k = &neox_key_specs[i];
        const neox_value *v = cfg->slots[i].set, *def;
        if (!v) continue;
        def = v;  // the default is whatever fill_defaults parsed; find it again for comparison
        if (v->kind == NEOX_VALUE_NULL) {
            if (!k->nullable) return key_fail(err, k, v, "must not be null (default: %s)", k->default_text);
            continue;
        }
        neox_value *parsed = NULL;
        if (k->default_text) {
            parsed = neox_yaml_parse(k->default_text, strlen(k->default_text), "schema", err);
            if (!parsed) return -1;
            def = parsed;
        } else {
            static const neox_value none = {.kind = NEOX_VALUE_NULL};
            def = &none;
        }
        int failed = check_type(k, v, err) < 0 || check_range(k, v, err) < 0 || check_supported(k, v, def, err) < 0;
        neox_value_free(parsed);
        if (failed) return -1;
    }
    return 0;
}
