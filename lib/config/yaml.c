// yaml.c: YAML text -> neox_value tree, through libyaml's event parser. Plain scalars are resolved as
// YAML 1.1 resolves them (PyYAML's implicit resolvers: bool, null, int, float, else string) so that
// a GPT-NeoX config means here what it means to GPT-NeoX. Every value keeps its file:line:column.
// The tree is built with an explicit stack whose depth is bounded, so hostile nesting cannot
// overflow the C stack; duplicate keys and aliases are errors rather than silent choices.
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/internal.h"

// PyYAML's implicit resolver patterns (YAML 1.1), as POSIX extended regular expressions.
static const char *const BOOL_RE = "^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$";
static const char *const NULL_RE = "^(~|null|Null|NULL|)$";
static const char *const INT_RE =
    "^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$";
static const char *const FLOAT_RE =
    "^([-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9][0-9_]*([eE][-+][0-9]+)?"
    "|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$";

// A number YAML 1.2's core schema (and JSON, and strtod) reads that the YAML 1.1 patterns above do not:
// an exponent without a '.' in the mantissa or without a sign.
static const char *const YAML12_FLOAT_RE = "^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)$";

typedef struct resolver {
    regex_t is_bool, is_null, is_int, is_float, is_yaml12_float;
} resolver;

static void resolver_init(resolver *r) {
    // The patterns are constants known to compile; a failure here is a broken build, not bad input.
    if (regcomp(&r->is_bool, BOOL_RE, REG_EXTENDED | REG_NOSUB) || regcomp(&r->is_null, NULL_RE, REG_EXTENDED | REG_NOSUB) ||
        regcomp(&r->is_int, INT_RE, REG_EXTENDED | REG_NOSUB) || regcomp(&r->is_float, FLOAT_RE, REG_EXTENDED | REG_NOSUB) ||
        regcomp(&r->is_yaml12_float, YAML12_FLOAT_RE, REG_EXTENDED | REG_NOSUB))
        neox_bug("cannot compile the YAML 1.1 scalar patterns");
}

// Compiled once per process (schema defaults alone are hundreds of small parses) and kept.
static resolver shared_resolver;
static pthread_once_t shared_resolver_once = PTHREAD_ONCE_INIT;
static void shared_resolver_init(void) { resolver_init(&shared_resolver); }

static int matches(const regex_t *re, const char *s) { return regexec(re, s, 0, NULL, 0) == 0; }

// Copies s without '_' (YAML 1.1 allows them as digit separators) and splits off the sign.
static char *strip_number(const char *s, int *negative) {
    *negative = 0;
    if (*s == '-' || *s == '+') *negative = *s++ == '-';
    char *out = neox_malloc(strlen(s) + 1), *o = out;
    for (; *s; s++)
        if (*s != '_') *o++ = *s;
    *o = 0;
    return out;
}

// Base-60 value of "a:b:c" parts, as YAML 1.1 sexagesimal numbers.
static double sexagesimal(const char *digits) {
    double value = 0;
    const char *p = digits;
    while (*p) {
        value = value * 60 + strtod(p, (char **)&p);
        if (*p == ':') p++;
    }
    return value;
}

static int resolve_int(neox_value *v, const char *text, neox_error *err, const char *where) {
    int negative;
    char *digits = strip_number(text, &negative);
    int base = 10;
    const char *start = digits;
    if (strncmp(digits, "0b", 2) == 0) base = 2, start += 2;
    else if (strncmp(digits, "0x", 2) == 0) base = 16, start += 2;
    else if (strchr(digits, ':')) {
        double x = sexagesimal(digits);
        free(digits);
        if (x > 9.2e18) return neox_fail(err, NEOX_EXIT_USAGE, "%s: integer '%s' is out of range", where, text);
        v->kind = NEOX_VALUE_INT;
        v->integer = (int64_t)x * (negative ? -1 : 1);
        v->number = (double)v->integer;
        return 0;
    } else if (digits[0] == '0' && digits[1]) base = 8, start += 1;
    errno = 0;
    char *end;
    unsigned long long magnitude = strtoull(start, &end, base);
    int bad = errno == ERANGE || *end || *start == 0 || magnitude > (unsigned long long)INT64_MAX + (negative ? 1 : 0);
    free(digits);
    if (bad) return neox_fail(err, NEOX_EXIT_USAGE, "%s: integer '%s' is out of range (or malformed)", where, text);
    v->kind = NEOX_VALUE_INT;
    v->integer = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    v->number = (double)v->integer;
    return 0;
}

static void resolve_float(neox_value *v, const char *text) {
    int negative;
    char *digits = strip_number(text, &negative);
    for (char *p = digits; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    double x;
    if (strcmp(digits, ".inf") == 0) x = INFINITY;
    else if (strcmp(digits, ".nan") == 0) x = NAN;
    else if (strchr(digits, ':')) x = sexagesimal(digits);
    else x = strtod(digits, NULL);
    free(digits);
    v->kind = NEOX_VALUE_FLOAT;
    v->number = negative ? -x : x;
}

// Resolves a scalar the way PyYAML's SafeLoader does. Quoted scalars and !!str are strings.
static int resolve_scalar(neox_value *v, const resolver *r, const yaml_event_t *ev, const char *where, neox_error *err) {
    const char *text = (const char *)ev->data.scalar.value;
    const char *tag = (const char *)ev->data.scalar.tag;
    if (tag && strcmp(tag, YAML_STR_TAG) != 0 && strcmp(tag, "!") != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: YAML tag '%s' is not supported in configs", where, tag);
    if (tag || !ev->data.scalar.plain_implicit) {
        v->kind = NEOX_VALUE_STRING;
        v->string = neox_strndup(text, ev->data.scalar.length);
        return 0;
    }
    if (matches(&r->is_null, text)) {
        v->kind = NEOX_VALUE_NULL;
    } else if (matches(&r->is_bool, text)) {
        v->kind = NEOX_VALUE_BOOL;
        v->boolean = strchr("yYtT", text[0]) || (text[1] == 'n' || text[1] == 'N');
        v->number = v->boolean;
    } else if (matches(&r->is_int, text)) {
        return resolve_int(v, text, err, where);
    } else if (matches(&r->is_float, text)) {
        resolve_float(v, text);
    } else {
        v->kind = NEOX_VALUE_STRING;
        v->string = neox_strndup(text, ev->data.scalar.length);
        if (matches(&r->is_yaml12_float, text)) v->number_text = 1, v->number = strtod(text, NULL);
    }
    return 0;
}

void neox_value_free(neox_value *v) {
    if (!v) return;
    for (int i = 0; i < v->count; i++) {
        neox_value_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

static void container_add(neox_value *c, char *key, neox_value *item) {
    if ((c->count & (c->count - 1)) == 0) {  // grow at powers of two
        size_t cap = c->count ? (size_t)c->count * 2 : 4;
        c->items = neox_realloc(c->items, cap * sizeof *c->items);
        if (c->kind == NEOX_VALUE_MAP) c->keys = neox_realloc(c->keys, cap * sizeof *c->keys);
    }
    if (c->kind == NEOX_VALUE_MAP) c->keys[c->count] = key;
    c->items[c->count++] = item;
}

// The parse in progress: the stack of open containers and, per open map, the key awaiting its value.
typedef struct builder {
    const char *name;
    const resolver *res;
    neox_value *root;
    neox_value *stack[NEOX_YAML_MAX_DEPTH];
    char *pending_key[NEOX_YAML_MAX_DEPTH];   // for maps: the key read, value not yet read
    const neox_value *pending_key_at[NEOX_YAML_MAX_DEPTH];
    int depth;
    int documents;
} builder;

static neox_value *new_value(const builder *b, const yaml_mark_t *mark) {
    neox_value *v = neox_calloc(1, sizeof *v);
    v->file = b->name;
    v->line = (int)mark->line + 1;
    v->column = (int)mark->column + 1;
    return v;
}

// Places a finished value (scalar, or a container just opened) into the container on top of the stack.
static int place(builder *b, neox_value *v, const char *key_text, neox_error *err) {
    if (b->depth == 0) {
        b->root = v;
        return 0;
    }
    neox_value *top = b->stack[b->depth - 1];
    if (top->kind == NEOX_VALUE_LIST) {
        container_add(top, NULL, v);
        return 0;
    }
    char **pending = &b->pending_key[b->depth - 1];
    if (!*pending) {  // v is a key
        if (!key_text) {
            neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: a mapping key must be a scalar, not a list or mapping", b->name,
                      v->line, v->column);
            neox_value_free(v);
            return -1;
        }
        for (int i = 0; i < top->count; i++)
            if (strcmp(top->keys[i], key_text) == 0) {
                neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: duplicate key '%s' (first set at line %d)", b->name, v->line,
                          key_text, top->items[i]->line);
                neox_value_free(v);
                return -1;
            }
        *pending = neox_strdup(key_text);
        neox_value_free(v);
        return 0;
    }
    container_add(top, *pending, v);
    *pending = NULL;
    return 0;
}

static int push(builder *b, neox_value *v, neox_error *err) {
    if (b->depth >= NEOX_YAML_MAX_DEPTH) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: lists and mappings nested deeper than %d levels", b->name, v->line,
                  v->column, NEOX_YAML_MAX_DEPTH);
        neox_value_free(v);
        return -1;
    }
    if (place(b, v, NULL, err) < 0) return -1;
    b->pending_key[b->depth] = NULL;
    b->stack[b->depth++] = v;
    return 0;
}

static int on_event(builder *b, const yaml_event_t *ev, neox_error *err) {
    char where[64];
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->documents > 1)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: a config file holds one YAML document, found a second",
                             b->name, (int)ev->start_mark.line + 1);
        return 0;
    case YAML_ALIAS_EVENT:
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: YAML aliases (*%s) are not supported in configs", b->name,
                         (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1, ev->data.alias.anchor);
    case YAML_SCALAR_EVENT: {
        neox_value *v = new_value(b, &ev->start_mark);
        snprintf(where, sizeof where, "%d:%d", v->line, v->column);
        char loc[sizeof where + 256];
        snprintf(loc, sizeof loc, "%.200s:%s", b->name, where);
        if (resolve_scalar(v, b->res, ev, loc, err) < 0) {
            neox_value_free(v);
            return -1;
        }
        int is_key = b->depth > 0 && b->stack[b->depth - 1]->kind == NEOX_VALUE_MAP && !b->pending_key[b->depth - 1];
        if (is_key && strcmp((const char *)ev->data.scalar.value, "<<") == 0 && ev->data.scalar.plain_implicit) {
            neox_value_free(v);
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: YAML merge keys (<<) are not supported in configs", loc);
        }
        return place(b, v, is_key ? (const char *)ev->data.scalar.value : NULL, err);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        const char *tag = (const char *)(ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.tag
                                                                               : ev->data.mapping_start.tag);
        if (tag && strcmp(tag, YAML_SEQ_TAG) != 0 && strcmp(tag, YAML_MAP_TAG) != 0)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: YAML tag '%s' is not supported in configs", b->name,
                             (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1, tag);
        neox_value *v = new_value(b, &ev->start_mark);
        v->kind = ev->type == YAML_SEQUENCE_START_EVENT ? NEOX_VALUE_LIST : NEOX_VALUE_MAP;
        return push(b, v, err);
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        b->depth--;
        return 0;
    default:
        return 0;
    }
}

static int parser_error(const yaml_parser_t *p, const char *name, neox_error *err) {
    const yaml_mark_t *m = &p->problem_mark;
    if (p->error == YAML_MEMORY_ERROR) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: out of memory parsing YAML", name);
    if (p->context)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: malformed YAML: %s (%s at line %d)", name, (int)m->line + 1,
                         (int)m->column + 1, p->problem ? p->problem : "error", p->context, (int)p->context_mark.line + 1);
    return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d:%d: malformed YAML: %s", name, (int)m->line + 1, (int)m->column + 1,
                     p->problem ? p->problem : "error");
}

neox_value *neox_yaml_parse(const char *text, size_t size, const char *name, neox_error *err) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot initialise the YAML parser", name);
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, size);
    builder *b = neox_calloc(1, sizeof *b);
    b->name = name;
    pthread_once(&shared_resolver_once, shared_resolver_init);
    b->res = &shared_resolver;
    int failed = 0, done = 0;
    while (!done && !failed) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            parser_error(&parser, name, err);
            failed = 1;
            break;
        }
        failed = on_event(b, &ev, err) < 0;
        done = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    for (int i = 0; i < NEOX_YAML_MAX_DEPTH; i++) free(b->pending_key[i]);
    neox_value *root = b->root;
    free(b);
    if (failed) {
        neox_value_free(root);
        return NULL;
    }
    if (!root) {  // an empty stream is None, as PyYAML reads it
        yaml_mark_t start = {0, 0, 0};
        builder empty = {.name = name};
        root = new_value(&empty, &start);
        root->kind = NEOX_VALUE_NULL;
    }
    return root;
}
