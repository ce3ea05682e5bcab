// chat_template_render.c: renders a parsed chat template (chat_template_ast.h) with Jinja2's
// semantics as transformers runs it: values are jansson values (NULL is Jinja's Undefined, which
// prints as nothing, iterates as empty and fails when used in arithmetic or subscripted), Python's
// truthiness, equality and str(), a fresh scope for each loop iteration (a `set` inside a loop does
// not outlive it), and raise_exception ending the render with the template's message.
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat_template_ast.h"
#include "tokenizer_internal.h"

typedef struct scope {
    json_t *vars;               // an object
    struct scope *outer;
} scope;

typedef struct {
    const neox_chat_template *tmpl;
    neox_error *err;
    char *out;
    size_t len, cap;
} renderer;

static int render_fail(renderer *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int render_fail(renderer *r, int line, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return neox_fail(r->err, NEOX_EXIT_FAILURE, "%s: line %d: %s", r->tmpl->name, line, what);
}

static void emit(renderer *r, const char *s, size_t n) {
    if (r->len + n + 1 > r->cap) {
        while (r->len + n + 1 > r->cap) r->cap = r->cap ? r->cap * 2 : 256;
        r->out = neox_realloc(r->out, r->cap);
    }
    memcpy(r->out + r->len, s, n);
    r->len += n;
    r->out[r->len] = 0;
}

// Python's type names, for error messages.
static const char *type_name(const json_t *v) {
    if (!v) return "undefined";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "dict";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE:
    case JSON_FALSE: return "bool";
    default: return "NoneType";
    }
}

static int truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static int is_number(const json_t *v) { return v && (json_is_integer(v) || json_is_boolean(v)); }
static long long number_of(const json_t *v) { return json_is_integer(v) ? json_integer_value(v) : json_is_true(v); }

// Python's ==: True == 1, Undefined == Undefined.
static int py_equal(const json_t *a, const json_t *b) {
    if (!a || !b) return !a && !b;
    if (is_number(a) && is_number(b)) return number_of(a) == number_of(b);
    return json_equal(a, b);
}

// Python's str(), as {{ }} and ~ print a value. Returns a new string, or NULL for what str() would
// print as a Python repr (lists, dicts, floats): those are refused rather than guessed.
static char *py_str(const json_t *v, size_t *size) {
    char *s = NULL;
    if (!v) s = strdup("");
    else if (json_is_string(v)) {
        *size = json_string_length(v);
        s = malloc(*size + 1);
        memcpy(s, json_string_value(v), *size + 1);
        return s;
    } else if (json_is_null(v)) s = strdup("None");
    else if (json_is_true(v)) s = strdup("True");
    else if (json_is_false(v)) s = strdup("False");
    else if (json_is_integer(v)) s = neox_asprintf("%lld", (long long)json_integer_value(v));
    if (s) *size = strlen(s);
    return s;
}

static json_t *string_value(const char *s, size_t n) { return json_stringn_nocheck(s, n); }

static json_t *eval(renderer *r, scope *sc, const ct_expr *e, int *failed);

static json_t *lookup(scope *sc, const char *name) {
    for (; sc; sc = sc->outer) {
        json_t *v = json_object_get(sc->vars, name);
        if (v) return json_incref(v);
    }
    return NULL;
}

// Python's str.strip(): whitespace is what str.isspace() accepts (Unicode Zs, and the bidi classes
// WS, B and S, which cover \t \n \v \f \r \x1c-\x1f \x85).
static int py_isspace(utf8proc_int32_t cp) {
    const utf8proc_property_t *prop = utf8proc_get_property(cp);
    return prop->category == UTF8PROC_CATEGORY_ZS || prop->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           prop->bidi_class == UTF8PROC_BIDI_CLASS_B || prop->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static json_t *py_strip(const char *s, size_t n) {
    size_t start = 0, end = n;
    while (start < end) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(end - start), &cp);
        if (k <= 0 || !py_isspace(cp)) break;
        start += (size_t)k;
    }
    while (end > start) {
        size_t back = end - 1;
        while (back > start && ((unsigned char)s[back] & 0xC0) == 0x80) back--;
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + back, (utf8proc_ssize_t)(end - back), &cp);
        if (k <= 0 || !py_isspace(cp)) break;
        end = back;
    }
    return string_value(s + start, end - start);
}

static size_t code_points(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += ((unsigned char)s[i] & 0xC0) != 0x80;
    return count;
}

static json_t *apply_filter(renderer *r, const ct_expr *e, json_t *v, int *failed) {
    if (!strcmp(e->name, "trim")) {
        size_t n;
        char *s = py_str(v, &n);
        if (!s) {
            *failed = render_fail(r, e->line, "trim of a %s", type_name(v));
            return NULL;
        }
        json_t *out = py_strip(s, n);
        free(s);
        return out;
    }
    // length
    if (!v) return json_integer(0);
    if (json_is_string(v)) return json_integer((json_int_t)code_points(json_string_value(v), json_string_length(v)));
    if (json_is_array(v)) return json_integer((json_int_t)json_array_size(v));
    if (json_is_object(v)) return json_integer((json_int_t)json_object_size(v));
    *failed = render_fail(r, e->line, "object of type '%s' has no length", type_name(v));
    return NULL;
}

static json_t *apply_test(const ct_expr *e, const json_t *v) {
    int result = !strcmp(e->name, "defined")     ? v != NULL
                 : !strcmp(e->name, "undefined") ? v == NULL
                 : !strcmp(e->name, "none")      ? v && json_is_null(v)
                                                 : v && json_is_string(v);
    return json_boolean(result != e->negated);
}

// Python's index normalisation: negative counts from the end; -1 when out of range.
static long long list_index(long long i, size_t size) {
    if (i < 0) i += (long long)size;
    return i >= 0 && i < (long long)size ? i : -1;
}

static json_t *subscript(renderer *r, const ct_expr *e, json_t *target, json_t *key, int *failed) {
    if (!target) {
        *failed = render_fail(r, e->line, "subscript of an undefined value");
        return NULL;
    }
    if (json_is_object(target) && json_is_string(key)) return json_incref(json_object_get(target, json_string_value(key)));
    if (json_is_array(target) && is_number(key)) {
        long long i = list_index(number_of(key), json_array_size(target));
        return i < 0 ? NULL : json_incref(json_array_get(target, (size_t)i));
    }
    if (json_is_string(target) && is_number(key)) {
        *failed = render_fail(r, e->line, "unsupported Jinja feature: subscript of a string");
        return NULL;
    }
    return NULL;  // Jinja gives Undefined for a missing key or attribute
}

// Python's slice bounds for a[start:stop] of a sequence of size n.
static size_t slice_bound(const json_t *v, size_t n, size_t dflt) {
    if (!v || json_is_null(v)) return dflt;
    long long i = number_of(v);
    if (i < 0) i += (long long)n;
    return i < 0 ? 0 : (size_t)i > n ? n : (size_t)i;
}

static json_t *slice(renderer *r, const ct_expr *e, json_t *target, json_t *start, json_t *stop, int *failed) {
    if (!target || !json_is_array(target) || (start && !is_number(start) && !json_is_null(start)) ||
        (stop && !is_number(stop) && !json_is_null(stop))) {
        *failed = render_fail(r, e->line, "unsupported slice of a %s", type_name(target));
        return NULL;
    }
    size_t n = json_array_size(target), a = slice_bound(start, n, 0), b = slice_bound(stop, n, n);
    json_t *out = json_array();
    for (size_t i = a; i < b; i++) json_array_append(out, json_array_get(target, i));
    return out;
}

static json_t *concat_strings(const char *a, size_t na, const char *b, size_t nb) {
    char *s = malloc(na + nb + 1);
    memcpy(s, a, na);
    memcpy(s + na, b, nb);
    json_t *out = string_value(s, na + nb);
    free(s);
    return out;
}

static long long py_mod(long long a, long long b) {
    long long m = a % b;
    return m != 0 && ((m < 0) != (b < 0)) ? m + b : m;
}

static json_t *arithmetic(renderer *r, const ct_expr *e, json_t *a, json_t *b, int *failed) {
    static const char *const spelling[] = {[CT_OP_ADD] = "+", [CT_OP_SUB] = "-", [CT_OP_MUL] = "*", [CT_OP_MOD] = "%"};
    if (is_number(a) && is_number(b)) {
        // Python's integers do not overflow; 64-bit ones that would are refused, not wrapped.
        long long x = number_of(a), y = number_of(b), z = 0;
        int overflow = e->op == CT_OP_ADD   ? __builtin_add_overflow(x, y, &z)
                       : e->op == CT_OP_SUB ? __builtin_sub_overflow(x, y, &z)
                       : e->op == CT_OP_MUL ? __builtin_mul_overflow(x, y, &z)
                                            : y == -1 && x == LLONG_MIN;
        if (e->op == CT_OP_MOD && y == 0) *failed = render_fail(r, e->line, "integer modulo by zero");
        else if (overflow) *failed = render_fail(r, e->line, "integer overflow in '%s'", spelling[e->op]);
        else return json_integer(e->op == CT_OP_MOD ? py_mod(x, y) : z);
        return NULL;
    }
    if (e->op == CT_OP_ADD && a && b && json_is_string(a) && json_is_string(b))
        return concat_strings(json_string_value(a), json_string_length(a), json_string_value(b), json_string_length(b));
    if (e->op == CT_OP_ADD && a && b && json_is_array(a) && json_is_array(b)) {
        json_t *out = json_copy(a);
        json_array_extend(out, b);
        return out;
    }
    if (!a || !b) *failed = render_fail(r, e->line, "an undefined value used with '%s'", spelling[e->op]);
    else *failed = render_fail(r, e->line, "unsupported operand types for %s: '%s' and '%s'", spelling[e->op], type_name(a), type_name(b));
    return NULL;
}

static json_t *concat(renderer *r, const ct_expr *e, json_t *a, json_t *b, int *failed) {
    size_t na, nb;
    char *sa = py_str(a, &na), *sb = py_str(b, &nb);
    json_t *out = NULL;
    if (sa && sb) out = concat_strings(sa, na, sb, nb);
    else *failed = render_fail(r, e->line, "'~' of a %s", type_name(sa ? b : a));
    free(sa);
    free(sb);
    return out;
}

static json_t *compare(renderer *r, const ct_expr *e, json_t *a, json_t *b, int *failed) {
    if (e->op == CT_OP_EQ || e->op == CT_OP_NE) return json_boolean(py_equal(a, b) == (e->op == CT_OP_EQ));
    if (e->op == CT_OP_IN || e->op == CT_OP_NOT_IN) {
        int found;
        if (b && json_is_string(b) && a && json_is_string(a))
            found = memmem(json_string_value(b), json_string_length(b), json_string_value(a), json_string_length(a)) != NULL;
        else if (b && json_is_array(b)) {
            found = 0;
            for (size_t i = 0; i < json_array_size(b) && !found; i++) found = py_equal(a, json_array_get(b, i));
        } else if (b && json_is_object(b) && a && json_is_string(a)) found = json_object_get(b, json_string_value(a)) != NULL;
        else {
            *failed = render_fail(r, e->line, "'in' of a %s in a %s", type_name(a), type_name(b));
            return NULL;
        }
        return json_boolean(found == (e->op == CT_OP_IN));
    }
    int order;
    if (is_number(a) && is_number(b)) order = (number_of(a) > number_of(b)) - (number_of(a) < number_of(b));
    else if (a && b && json_is_string(a) && json_is_string(b)) {
        size_t na = json_string_length(a), nb = json_string_length(b);
        int c = memcmp(json_string_value(a), json_string_value(b), na < nb ? na : nb);
        order = c ? c : (na > nb) - (na < nb);
    } else {
        *failed = render_fail(r, e->line, "ordering comparison of a %s with a %s", type_name(a), type_name(b));
        return NULL;
    }
    int result = e->op == CT_OP_LT ? order < 0 : e->op == CT_OP_LE ? order <= 0 : e->op == CT_OP_GT ? order > 0 : order >= 0;
    return json_boolean(result);
}

static json_t *eval_binary(renderer *r, scope *sc, const ct_expr *e, int *failed) {
    json_t *a = eval(r, sc, e->a, failed);
    if (*failed) return NULL;
    if (e->op == CT_OP_AND || e->op == CT_OP_OR) {
        // Python's and/or return an operand, evaluating the second only when needed.
        if (truthy(a) == (e->op == CT_OP_OR)) return a;
        json_decref(a);
        return eval(r, sc, e->b, failed);
    }
    json_t *b = eval(r, sc, e->b, failed), *out = NULL;
    if (!*failed) {
        if (e->op == CT_OP_CONCAT) out = concat(r, e, a, b, failed);
        else if (e->op >= CT_OP_ADD) out = arithmetic(r, e, a, b, failed);
        else out = compare(r, e, a, b, failed);
    }
    json_decref(a);
    json_decref(b);
    return out;
}

static json_t *eval_call(renderer *r, scope *sc, const ct_expr *e, int *failed) {
    // raise_exception(message): the template refuses its input.
    json_t *msg = e->n_items ? eval(r, sc, e->items[0], failed) : NULL;
    if (*failed) return NULL;
    size_t n;
    char *text = py_str(msg, &n);
    *failed = render_fail(r, e->line, "the chat template raised an exception: %s", text ? text : type_name(msg));
    free(text);
    json_decref(msg);
    return NULL;
}

static json_t *eval(renderer *r, scope *sc, const ct_expr *e, int *failed) {
    json_t *a = NULL, *b = NULL, *c = NULL, *out = NULL;
    switch (e->kind) {
    case CT_EXPR_LITERAL: return json_incref(e->value);
    case CT_EXPR_NAME: return lookup(sc, e->name);
    case CT_EXPR_LIST:
        out = json_array();
        for (size_t i = 0; i < e->n_items && !*failed; i++) json_array_append_new(out, eval(r, sc, e->items[i], failed));
        return out;
    case CT_EXPR_BINARY: return eval_binary(r, sc, e, failed);
    case CT_EXPR_CALL: return eval_call(r, sc, e, failed);
    case CT_EXPR_COND:
        b = eval(r, sc, e->b, failed);
        if (!*failed) out = truthy(b) ? eval(r, sc, e->a, failed) : e->c ? eval(r, sc, e->c, failed) : NULL;
        json_decref(b);
        return out;
    default: break;
    }
    a = eval(r, sc, e->a, failed);
    if (!*failed && e->b) b = eval(r, sc, e->b, failed);
    if (!*failed && e->c) c = eval(r, sc, e->c, failed);
    if (!*failed) {
        if (e->kind == CT_EXPR_NOT) out = json_boolean(!truthy(a));
        else if (e->kind == CT_EXPR_TEST) out = apply_test(e, a);
        else if (e->kind == CT_EXPR_FILTER) out = apply_filter(r, e, a, failed);
        else if (e->kind == CT_EXPR_SUBSCRIPT) out = subscript(r, e, a, b, failed);
        else if (e->kind == CT_EXPR_SLICE) out = slice(r, e, a, b, c, failed);
        else if (is_number(a) && number_of(a) != LLONG_MIN) out = json_integer(-number_of(a));
        else *failed = render_fail(r, e->line, "unary '-' of a %s", type_name(a));
    }
    json_decref(a);
    json_decref(b);
    json_decref(c);
    return out;
}

static int render_body(renderer *r, scope *sc, const ct_body *body);

// Jinja's loop variable for iteration i of n.
static json_t *loop_object(size_t i, size_t n) {
    return json_pack("{sIsIsIsIsbsbsI}", "index0", (json_int_t)i, "index", (json_int_t)(i + 1), "revindex",
                     (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1), "first", i == 0, "last", i + 1 == n,
                     "length", (json_int_t)n);
}

static int render_for(renderer *r, scope *sc, const ct_node *node) {
    int failed = 0;
    json_t *items = eval(r, sc, node->expr, &failed);
    if (failed) return -1;
    if (items && json_is_object(items)) {
        json_t *keys = json_array();
        const char *key;
        json_t *value;
        json_object_foreach(items, key, value) json_array_append_new(keys, json_string_nocheck(key));
        json_decref(items);
        items = keys;
    }
    if (items && !json_is_array(items)) {
        render_fail(r, node->line, "'for' over a %s", type_name(items));
        json_decref(items);
        return -1;
    }
    size_t n = items ? json_array_size(items) : 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        scope iteration = {.vars = json_object(), .outer = sc};
        json_object_set(iteration.vars, node->name, json_array_get(items, i));
        json_object_set_new(iteration.vars, "loop", loop_object(i, n));
        rc = render_body(r, &iteration, &node->bodies[0]);
        json_decref(iteration.vars);
    }
    if (rc == 0 && n == 0 && node->n_bodies > 1) rc = render_body(r, sc, &node->bodies[1]);
    json_decref(items);
    return rc;
}

static int render_if(renderer *r, scope *sc, const ct_node *node) {
    for (size_t i = 0; i < node->n_bodies; i++) {
        int failed = 0, take = 1;
        if (node->conds[i]) {
            json_t *cond = eval(r, sc, node->conds[i], &failed);
            take = truthy(cond);
            json_decref(cond);
            if (failed) return -1;
        }
        if (take) return render_body(r, sc, &node->bodies[i]);
    }
    return 0;
}

static int render_output(renderer *r, scope *sc, const ct_node *node) {
    int failed = 0;
    json_t *v = eval(r, sc, node->expr, &failed);
    if (failed) return -1;
    size_t n;
    char *s = py_str(v, &n);
    int rc = s ? 0 : render_fail(r, node->line, "unsupported Jinja feature: printing a %s", type_name(v));
    if (s) emit(r, s, n);
    free(s);
    json_decref(v);
    return rc;
}

static int render_body(renderer *r, scope *sc, const ct_body *body) {
    for (size_t i = 0; i < body->n; i++) {
        const ct_node *node = body->nodes[i];
        int rc = 0, failed = 0;
        switch (node->kind) {
        case CT_NODE_TEXT: emit(r, node->text, node->text_size); break;
        case CT_NODE_OUTPUT: rc = render_output(r, sc, node); break;
        case CT_NODE_IF: rc = render_if(r, sc, node); break;
        case CT_NODE_FOR: rc = render_for(r, sc, node); break;
        case CT_NODE_SET: {
            json_t *v = eval(r, sc, node->expr, &failed);
            if (failed) return -1;
            // Assigning Undefined leaves the name undefined.
            if (v) json_object_set_new(sc->vars, node->name, v);
            else json_object_del(sc->vars, node->name);
            break;
        }
        }
        if (rc != 0) return -1;
    }
    return 0;
}

static void set_token(json_t *vars, const char *name, const char *value) {
    if (value) json_object_set_new(vars, name, json_string_nocheck(value));
}

char *neox_chat_template_render(const neox_chat_template *tmpl, const neox_chat_context *ctx, size_t *size,
                                neox_error *err) {
    renderer r = {.tmpl = tmpl, .err = err};
    // What apply_chat_template passes: the messages, tools and documents (None here), the special
    // tokens, add_generation_prompt; the template's own top-level `set`s go into a scope above them.
    json_t *globals = json_pack("{sOsnsnsb}", "messages", (json_t *)ctx->messages, "tools", "documents",
                                "add_generation_prompt", ctx->add_generation_prompt != 0);
    set_token(globals, "bos_token", ctx->bos_token);
    set_token(globals, "eos_token", ctx->eos_token);
    set_token(globals, "unk_token", ctx->unk_token);
    set_token(globals, "pad_token", ctx->pad_token);
    scope outer = {.vars = globals}, top = {.vars = json_object(), .outer = &outer};
    emit(&r, "", 0);
    int rc = render_body(&r, &top, &tmpl->body);
    json_decref(top.vars);
    json_decref(globals);
    if (rc != 0) {
        free(r.out);
        return NULL;
    }
    *size = r.len;
    return r.out;
}
