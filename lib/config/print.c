// print.c: the effective configuration as text (neox-train --print-config: every key, its value and
// where it came from, grouped as GPT-NeoX groups its arguments) and as JSON (for tools and tests),
// and the compact YAML flow text of one value used in both and in error messages.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/internal.h"

// A bounded string builder: appends until full, then marks the cut with "...".
typedef struct sink {
    char *buf;
    size_t size, len;   // size > 0; buf[len] == 0
    int full;
} sink;

static void put(sink *s, const char *text) {
    if (s->full) return;
    size_t n = strlen(text), room = s->size - s->len - 1;
    if (n <= room) {
        memcpy(s->buf + s->len, text, n + 1);
        s->len += n;
        return;
    }
    size_t keep = room >= 3 ? room - 3 : 0;
    memcpy(s->buf + s->len, text, keep);
    memcpy(s->buf + s->len + keep, "...", room - keep);
    s->len += room;
    s->buf[s->len] = 0;
    s->full = 1;
}

// The shortest "%.Ng" that reads back as the same double, with a '.' so YAML reads it as a float.
static void format_float(double x, char *out, size_t size) {
    if (isnan(x)) { snprintf(out, size, ".nan"); return; }
    if (isinf(x)) { snprintf(out, size, x > 0 ? ".inf" : "-.inf"); return; }
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(out, size, "%.*g", digits, x);
        if (strtod(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".eEn")) strncat(out, ".0", size - strlen(out) - 1);
}

// Would a plain scalar with this text read back as something other than the string? Then quote it.
static int needs_quotes(const char *s) {
    static const char *const words[] = {"yes", "no", "true", "false", "on", "off", "null", "y", "n", "~"};
    if (!*s || strchr("-+.0123456789~ ", s[0]) || s[strlen(s) - 1] == ' ') return 1;
    if (strpbrk(s, ":#,[]{}&*!|>'\"%@`\n\t\\")) return 1;
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (strcasecmp(s, words[i]) == 0) return 1;
    return 0;
}

static void put_string(sink *s, const char *text) {
    if (!needs_quotes(text)) { put(s, text); return; }
    char one[8];
    put(s, "\"");
    for (const char *p = text; *p && !s->full; p++) {
        if (*p == '"' || *p == '\\') snprintf(one, sizeof one, "\\%c", *p);
        else if (*p == '\n') snprintf(one, sizeof one, "\\n");
        else if ((unsigned char)*p < 0x20) snprintf(one, sizeof one, "\\x%02x", (unsigned char)*p);
        else one[0] = *p, one[1] = 0;
        put(s, one);
    }
    put(s, "\"");
}

static void put_value(sink *s, const neox_value *v) {
    char num[64];
    switch (v->kind) {
    case NEOX_VALUE_NULL: put(s, "null"); break;
    case NEOX_VALUE_BOOL: put(s, v->boolean ? "true" : "false"); break;
    case NEOX_VALUE_INT: snprintf(num, sizeof num, "%lld", (long long)v->integer); put(s, num); break;
    case NEOX_VALUE_FLOAT: format_float(v->number, num, sizeof num); put(s, num); break;
    case NEOX_VALUE_STRING: put_string(s, v->string); break;
    case NEOX_VALUE_LIST:
    case NEOX_VALUE_MAP:
        put(s, v->kind == NEOX_VALUE_LIST ? "[" : "{");
        for (int i = 0; i < v->count && !s->full; i++) {
            if (i) put(s, ", ");
            if (v->keys) {
                put_string(s, v->keys[i]);
                put(s, ": ");
            }
            put_value(s, v->items[i]);
        }
        put(s, v->kind == NEOX_VALUE_LIST ? "]" : "}");
        break;
    }
}

const char *neox_value_format(const neox_value *v, char *buf, size_t size) {
    if (!size) return buf;
    sink s = {buf, size, 0, 0};
    buf[0] = 0;
    put_value(&s, v);
    return buf;
}

static const char *use_name(neox_key_use use) {
    return use == NEOX_KEY_USED ? "used" : use == NEOX_KEY_IGNORED ? "ignored" : "unsupported";
}

void neox_config_print(const neox_config *cfg, FILE *out) {
    enum { VALUE_MAX = 4096 };
    char *value = neox_malloc(VALUE_MAX), where[4096];
    const char *group = NULL;
    // Groups in the order the schema lists them; each group's keys follow the schema order.
    for (int g = 0; g < neox_key_count; g++) {
        const char *this_group = neox_key_specs[g].group;
        int first = 1;
        for (int j = 0; j < g; j++)
            if (strcmp(neox_key_specs[j].group, this_group) == 0) first = 0;
        if (!first) continue;
        group = this_group;
        fprintf(out, "# %s\n", group);
        for (int i = 0; i < neox_key_count; i++) {
            const neox_key_spec *k = &neox_key_specs[i];
            if (strcmp(k->group, group) != 0) continue;
            neox_value_format(cfg->slots[i].value, value, VALUE_MAX);
            neox_config_source_id(cfg, (neox_key_id)(k - neox_key_specs), where, sizeof where);
            fprintf(out, "%-42s = %s  # %s%s\n", k->name, value, where,
                    k->use == NEOX_KEY_USED ? "" : k->use == NEOX_KEY_IGNORED ? " (ignored)" : " (unsupported)");
        }
    }
    free(value);
}

static json_t *to_json(const neox_value *v) {
    switch (v->kind) {
    case NEOX_VALUE_NULL: return json_null();
    case NEOX_VALUE_BOOL: return json_boolean(v->boolean);
    case NEOX_VALUE_INT: return json_integer((json_int_t)v->integer);
    case NEOX_VALUE_FLOAT:
        if (isfinite(v->number)) return json_real(v->number);
        return json_string(isnan(v->number) ? "nan" : v->number > 0 ? "inf" : "-inf");
    case NEOX_VALUE_STRING: return json_stringn(v->string, strlen(v->string));
    case NEOX_VALUE_LIST: {
        json_t *a = json_array();
        for (int i = 0; i < v->count; i++) json_array_append_new(a, to_json(v->items[i]));
        return a;
    }
    case NEOX_VALUE_MAP: {
        json_t *o = json_object();
        for (int i = 0; i < v->count; i++) json_object_set_new(o, v->keys[i], to_json(v->items[i]));
        return o;
    }
    }
    return json_null();
}

void neox_config_print_json(const neox_config *cfg, FILE *out) {
    json_t *root = json_object();
    char where[4096];
    for (int i = 0; i < neox_key_count; i++) {
        const neox_key_spec *k = &neox_key_specs[i];
        const neox_config_slot *s = &cfg->slots[i];
        json_t *entry = json_object();
        json_object_set_new(entry, "value", to_json(s->value));
        json_object_set_new(entry, "source", json_string(neox_config_source_id(cfg, (neox_key_id)(k - neox_key_specs), where, sizeof where)));
        json_object_set_new(entry, "group", json_string(k->group));
        json_object_set_new(entry, "use", json_string(use_name(k->use)));
        if (s->set) {
            json_t *set = json_object();
            json_object_set_new(set, "value", to_json(s->set));
            json_object_set_new(set, "at", json_string(neox_value_where(s->set, where, sizeof where)));
            json_object_set_new(entry, "set", set);
        }
        json_object_set_new(root, k->name, entry);
    }
    json_dumpf(root, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    fputc('\n', out);
    json_decref(root);
}

int neox_config_print_as(const neox_config *cfg, const char *format, FILE *out) {
    if (strcmp(format, "text") == 0) neox_config_print(cfg, out);
    else if (strcmp(format, "json") == 0) neox_config_print_json(cfg, out);
    else return -1;
    return 0;
}
