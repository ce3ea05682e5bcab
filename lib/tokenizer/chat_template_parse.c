// chat_template_parse.c: parses a chat template (the Jinja2 subset of docs/post-training.md) into
// the tree of chat_template_ast.h. The source is first cut into segments (text, {{ }}, {% %}) with
// Jinja's whitespace rules as transformers configures them (trim_blocks, lstrip_blocks, and the
// "-"/"+" markers); each tag's inside is then tokenized and parsed by recursive descent with Jinja's
// operator precedence. Anything outside the subset is refused by name with its line.
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_ast.h"
#include "tokenizer_internal.h"

// ---------------------------------------------------------------------------------------------
// Tokens inside a tag.
typedef enum { TK_END, TK_NAME, TK_STRING, TK_INT, TK_OP } tk_kind;

typedef struct {
    tk_kind kind;
    int line;
    const char *start;     // TK_NAME, TK_OP: the source text
    size_t len;
    char *string;          // TK_STRING: the unescaped value
    size_t string_size;
    long long integer;
} token;

typedef struct {
    token *toks;
    size_t n, pos;
} tag_tokens;

typedef struct {
    const char *name;
    neox_error *err;
    int failed;
    int depth;             // nesting of expressions and blocks, bounded so a template cannot exhaust the stack
} parser;

enum { MAX_NESTING = 200 };

static int parse_fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int parse_fail(parser *p, int line, const char *fmt, ...) {
    if (p->failed) return -1;
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    p->failed = 1;
    return neox_fail(p->err, NEOX_EXIT_USAGE, "%s: line %d: %s", p->name, line, what);
}

static int line_at(const char *src, const char *at, int line) {
    for (const char *s = src; s < at; s++) line += *s == '\n';
    return line;
}

// Appends the UTF-8 of cp; returns 0, or -1 for a code point outside Unicode.
static int append_code_point(char *out, size_t *len, unsigned long cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *len += (size_t)utf8_encode((uint32_t)cp, out + *len);
    return 0;
}

// A string literal's escapes as Python reads them (\n \t \r \\ \' \" \xHH \uHHHH; another backslash
// stays as it is). *end gets the position after the closing quote.
static int lex_string(parser *p, const char *s, const char *limit, int line, token *t, const char **end) {
    char quote = *s++;
    char *out = malloc((size_t)(limit - s) * 2 + 1);
    size_t len = 0;
    while (s < limit && *s != quote) {
        if (*s != '\\' || s + 1 >= limit) {
            out[len++] = *s++;
            continue;
        }
        char c = s[1];
        s += 2;
        const char *simple = strchr("ntr\\'\"", c);
        if (simple && c) {
            out[len++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        } else if (c == 'x' || c == 'u') {
            int digits = c == 'x' ? 2 : 4;
            char hex[5] = {0};
            int ok = limit - s >= digits;
            for (int i = 0; ok && i < digits; i++) ok = isxdigit((unsigned char)s[i]) && (hex[i] = s[i]);
            if (!ok || append_code_point(out, &len, strtoul(hex, NULL, 16)) != 0) {
                free(out);
                return parse_fail(p, line, "bad \\%c escape in a string literal", c);
            }
            s += digits;
        } else {
            out[len++] = '\\';
            out[len++] = c;
        }
    }
    if (s >= limit) {
        free(out);
        return parse_fail(p, line, "unterminated string literal");
    }
    out[len] = 0;
    t->kind = TK_STRING;
    t->string = out;
    t->string_size = len;
    *end = s + 1;
    return 0;
}

static const char *const two_char_ops[] = {"==", "!=", "<=", ">=", "//", "**"};

static int lex_tag(parser *p, const char *s, const char *limit, int line, tag_tokens *out) {
    size_t cap = 16;
    out->toks = calloc(cap, sizeof(token));
    for (;;) {
        while (s < limit && isspace((unsigned char)*s)) line += *s++ == '\n';
        if (out->n + 1 >= cap) {
            out->toks = neox_realloc(out->toks, (cap *= 2) * sizeof(token));
            memset(out->toks + out->n, 0, (cap - out->n) * sizeof(token));
        }
        token *t = &out->toks[out->n];
        t->line = line;
        t->start = s;
        if (s >= limit) {
            t->kind = TK_END;
            return 0;
        }
        if (isalpha((unsigned char)*s) || *s == '_') {
            while (s < limit && (isalnum((unsigned char)*s) || *s == '_')) s++;
            t->kind = TK_NAME;
        } else if (isdigit((unsigned char)*s)) {
            char *e;
            errno = 0;
            t->integer = strtoll(s, &e, 10);
            if (errno == ERANGE) return parse_fail(p, line, "integer literal out of the 64-bit range");
            if (e < limit && (*e == '.' || isalpha((unsigned char)*e)))
                return parse_fail(p, line, "unsupported number literal '%.*s' (integers only)", (int)(limit - s > 20 ? 20 : limit - s), s);
            s = e;
            t->kind = TK_INT;
        } else if (*s == '\'' || *s == '"') {
            if (lex_string(p, s, limit, line, t, &s) != 0) return -1;
        } else {
            size_t n = 1;
            for (size_t i = 0; i < sizeof two_char_ops / sizeof *two_char_ops; i++)
                if (limit - s >= 2 && !strncmp(s, two_char_ops[i], 2)) n = 2;
            if (!strchr("=!<>+-*/%~|()[]{},.:", *s)) return parse_fail(p, line, "unexpected character '%c'", *s);
            s += n;
            t->kind = TK_OP;
        }
        t->len = (size_t)(s - t->start);
        out->n++;
    }
}

static void tokens_free(tag_tokens *tt) {
    for (size_t i = 0; i < tt->n; i++) free(tt->toks[i].string);
    free(tt->toks);
    memset(tt, 0, sizeof *tt);
}

// ---------------------------------------------------------------------------------------------
// Expressions: or < and < not < comparisons/in < + - < ~ < * % < unary minus < postfix ([ ], ., calls)
// and filters/tests, as Jinja2's parser nests them.
static int enter(parser *p, int line) {
    if (++p->depth <= MAX_NESTING) return 0;
    return parse_fail(p, line, "nested more than %d deep", MAX_NESTING);
}

static token *peek(tag_tokens *tt) { return &tt->toks[tt->pos]; }
static int is_op(const token *t, const char *op) { return t->kind == TK_OP && t->len == strlen(op) && !strncmp(t->start, op, t->len); }
static int is_name(const token *t, const char *name) { return t->kind == TK_NAME && t->len == strlen(name) && !strncmp(t->start, name, t->len); }
static char *token_text(const token *t) { return strndup(t->start, t->len); }

static ct_expr *new_expr(ct_expr_kind kind, int line) {
    ct_expr *e = calloc(1, sizeof *e);
    e->kind = kind;
    e->line = line;
    return e;
}

static ct_expr *binary(ct_op op, ct_expr *a, ct_expr *b, int line) {
    ct_expr *e = new_expr(CT_EXPR_BINARY, line);
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

static int expect_op(parser *p, tag_tokens *tt, const char *op) {
    if (is_op(peek(tt), op)) {
        tt->pos++;
        return 0;
    }
    const token *t = peek(tt);
    return parse_fail(p, t->line, "expected '%s', found '%.*s'", op, t->kind == TK_END ? 3 : (int)t->len,
                      t->kind == TK_END ? "end" : t->start);
}

static ct_expr *parse_expr(parser *p, tag_tokens *tt);

static void push_item(ct_expr *e, ct_expr *item) {
    e->items = neox_realloc(e->items, (e->n_items + 1) * sizeof *e->items);
    e->items[e->n_items++] = item;
}

// Comma-separated expressions up to the closing operator (already past the opening one).
static int parse_sequence(parser *p, tag_tokens *tt, ct_expr *into, const char *close) {
    while (!is_op(peek(tt), close)) {
        ct_expr *item = parse_expr(p, tt);
        if (!item) return -1;
        push_item(into, item);
        if (!is_op(peek(tt), ",")) break;
        tt->pos++;
    }
    return expect_op(p, tt, close);
}

static const char *const supported_functions[] = {"raise_exception"};

static ct_expr *parse_primary(parser *p, tag_tokens *tt) {
    token *t = peek(tt);
    ct_expr *e = NULL;
    if (t->kind == TK_STRING || t->kind == TK_INT) {
        e = new_expr(CT_EXPR_LITERAL, t->line);
        e->value = t->kind == TK_INT ? json_integer(t->integer) : json_stringn_nocheck(t->string, t->string_size);
        // Adjacent string literals join, as in Jinja ('a' 'b' is 'ab').
        tt->pos++;
        while (t->kind == TK_STRING && peek(tt)->kind == TK_STRING) {
            token *next = peek(tt);
            char *joined = neox_asprintf("%s%s", json_string_value(e->value), next->string);
            json_decref(e->value);
            e->value = json_string_nocheck(joined);
            free(joined);
            tt->pos++;
        }
        return e;
    }
    if (t->kind == TK_NAME) {
        tt->pos++;
        if (is_name(t, "true") || is_name(t, "True")) (e = new_expr(CT_EXPR_LITERAL, t->line))->value = json_true();
        else if (is_name(t, "false") || is_name(t, "False")) (e = new_expr(CT_EXPR_LITERAL, t->line))->value = json_false();
        else if (is_name(t, "none") || is_name(t, "None")) (e = new_expr(CT_EXPR_LITERAL, t->line))->value = json_null();
        else if (is_op(peek(tt), "(")) {
            int known = 0;
            for (size_t i = 0; i < sizeof supported_functions / sizeof *supported_functions; i++) known |= is_name(t, supported_functions[i]);
            if (!known) {
                parse_fail(p, t->line, "unsupported Jinja function '%.*s'", (int)t->len, t->start);
                return NULL;
            }
            tt->pos++;
            e = new_expr(CT_EXPR_CALL, t->line);
            e->name = token_text(t);
            if (parse_sequence(p, tt, e, ")") != 0) goto fail;
        } else {
            e = new_expr(CT_EXPR_NAME, t->line);
            e->name = token_text(t);
        }
        return e;
    }
    if (is_op(t, "(")) {
        tt->pos++;
        e = parse_expr(p, tt);
        if (e && expect_op(p, tt, ")") != 0) goto fail;
        return e;
    }
    if (is_op(t, "[")) {
        tt->pos++;
        e = new_expr(CT_EXPR_LIST, t->line);
        if (parse_sequence(p, tt, e, "]") != 0) goto fail;
        return e;
    }
    if (is_op(t, "{")) parse_fail(p, t->line, "unsupported Jinja feature: dict literals");
    else if (t->kind == TK_END) parse_fail(p, t->line, "expected an expression");
    else parse_fail(p, t->line, "unexpected '%.*s'", (int)t->len, t->start);
    return NULL;
fail:
    ct_expr_free(e);
    return NULL;
}

// a[b], a[b:c], a.name
static ct_expr *parse_subscript(parser *p, tag_tokens *tt, ct_expr *target, int line) {
    ct_expr *e = new_expr(CT_EXPR_SUBSCRIPT, line);
    e->a = target;
    if (!is_op(peek(tt), ":") && !(e->b = parse_expr(p, tt))) goto fail;
    if (is_op(peek(tt), ":")) {
        tt->pos++;
        e->kind = CT_EXPR_SLICE;
        if (!is_op(peek(tt), "]") && !(e->c = parse_expr(p, tt))) goto fail;
        if (is_op(peek(tt), ":")) {
            parse_fail(p, peek(tt)->line, "unsupported Jinja feature: slice steps");
            goto fail;
        }
    }
    if (expect_op(p, tt, "]") == 0) return e;
fail:
    ct_expr_free(e);
    return NULL;
}

static const char *const supported_filters[] = {"trim", "length"};
static const char *const supported_tests[] = {"defined", "undefined", "none", "string"};

static int name_in(const token *t, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (is_name(t, names[i])) return 1;
    return 0;
}

// Postfix subscripts, then filters and tests: 'x'[0]|trim is (('x'[0])|trim).
static ct_expr *parse_postfix(parser *p, tag_tokens *tt, ct_expr *e) {
    while (e) {
        token *t = peek(tt);
        if (is_op(t, "[")) {
            tt->pos++;
            e = parse_subscript(p, tt, e, t->line);
        } else if (is_op(t, ".")) {
            tt->pos++;
            token *attr = peek(tt);
            if (attr->kind != TK_NAME) {
                parse_fail(p, attr->line, "expected a name after '.'");
                break;
            }
            tt->pos++;
            if (is_op(peek(tt), "(")) {
                parse_fail(p, attr->line, "unsupported Jinja feature: method call '.%.*s()'", (int)attr->len, attr->start);
                break;
            }
            ct_expr *s = new_expr(CT_EXPR_SUBSCRIPT, t->line);
            s->a = e;
            s->b = new_expr(CT_EXPR_LITERAL, attr->line);
            s->b->value = json_stringn_nocheck(attr->start, attr->len);
            e = s;
        } else if (is_op(t, "|") || is_name(t, "is")) {
            int filter = is_op(t, "|");
            tt->pos++;
            int negated = !filter && is_name(peek(tt), "not");
            if (negated) tt->pos++;
            token *name = peek(tt);
            int known = filter ? name_in(name, supported_filters, 2) : name_in(name, supported_tests, 4);
            if (!known) {
                parse_fail(p, name->line, "unsupported Jinja %s '%.*s'", filter ? "filter" : "test",
                           name->kind == TK_END ? 3 : (int)name->len, name->kind == TK_END ? "end" : name->start);
                break;
            }
            tt->pos++;
            if (is_op(peek(tt), "(")) {
                parse_fail(p, name->line, "unsupported Jinja feature: arguments to '%.*s'", (int)name->len, name->start);
                break;
            }
            ct_expr *f = new_expr(filter ? CT_EXPR_FILTER : CT_EXPR_TEST, t->line);
            f->a = e;
            f->name = token_text(name);
            f->negated = negated;
            e = f;
        } else {
            return e;
        }
    }
    ct_expr_free(e);
    return NULL;
}

static ct_expr *parse_unary(parser *p, tag_tokens *tt) {
    token *t = peek(tt);
    if (is_op(t, "-")) {
        tt->pos++;
        ct_expr *operand = enter(p, t->line) == 0 ? parse_unary(p, tt) : NULL;
        p->depth--;
        if (!operand) return NULL;
        ct_expr *e = new_expr(CT_EXPR_NEG, t->line);
        e->a = operand;
        return parse_postfix(p, tt, e);
    }
    return parse_postfix(p, tt, parse_primary(p, tt));
}

typedef struct {
    const char *text;
    ct_op op;
} op_spelling;

// One left-associative level of binary operators.
static ct_expr *parse_level(parser *p, tag_tokens *tt, const op_spelling *ops, size_t n_ops,
                            ct_expr *(*next)(parser *, tag_tokens *)) {
    ct_expr *e = next(p, tt);
    while (e) {
        token *t = peek(tt);
        size_t i = 0;
        while (i < n_ops && !is_op(t, ops[i].text)) i++;
        if (i == n_ops) {
            if (is_op(t, "/") || is_op(t, "//") || is_op(t, "**"))
                parse_fail(p, t->line, "unsupported Jinja operator '%.*s'", (int)t->len, t->start);
            else return e;
            ct_expr_free(e);
            return NULL;
        }
        tt->pos++;
        ct_expr *rhs = next(p, tt);
        if (!rhs) {
            ct_expr_free(e);
            return NULL;
        }
        e = binary(ops[i].op, e, rhs, t->line);
    }
    return e;
}

static ct_expr *parse_math2(parser *p, tag_tokens *tt) {
    static const op_spelling ops[] = {{"*", CT_OP_MUL}, {"%", CT_OP_MOD}};
    return parse_level(p, tt, ops, 2, parse_unary);
}
static ct_expr *parse_concat(parser *p, tag_tokens *tt) {
    static const op_spelling ops[] = {{"~", CT_OP_CONCAT}};
    return parse_level(p, tt, ops, 1, parse_math2);
}
static ct_expr *parse_math1(parser *p, tag_tokens *tt) {
    static const op_spelling ops[] = {{"+", CT_OP_ADD}, {"-", CT_OP_SUB}};
    return parse_level(p, tt, ops, 2, parse_concat);
}

static ct_expr *parse_compare(parser *p, tag_tokens *tt) {
    static const op_spelling ops[] = {{"==", CT_OP_EQ}, {"!=", CT_OP_NE}, {"<=", CT_OP_LE},
                                      {">=", CT_OP_GE}, {"<", CT_OP_LT},  {">", CT_OP_GT}};
    ct_expr *e = parse_math1(p, tt);
    while (e) {
        token *t = peek(tt);
        ct_op op;
        size_t i = 0;
        while (i < 6 && !is_op(t, ops[i].text)) i++;
        if (i < 6) op = ops[i].op, tt->pos++;
        else if (is_name(t, "in")) op = CT_OP_IN, tt->pos++;
        else if (is_name(t, "not") && is_name(&tt->toks[tt->pos + 1], "in")) op = CT_OP_NOT_IN, tt->pos += 2;
        else return e;
        ct_expr *rhs = parse_math1(p, tt);
        if (!rhs) {
            ct_expr_free(e);
            return NULL;
        }
        e = binary(op, e, rhs, t->line);
    }
    return e;
}

static ct_expr *parse_not(parser *p, tag_tokens *tt) {
    token *t = peek(tt);
    if (!is_name(t, "not")) return parse_compare(p, tt);
    tt->pos++;
    ct_expr *operand = enter(p, t->line) == 0 ? parse_not(p, tt) : NULL;
    p->depth--;
    if (!operand) return NULL;
    ct_expr *e = new_expr(CT_EXPR_NOT, t->line);
    e->a = operand;
    return e;
}

static ct_expr *parse_and(parser *p, tag_tokens *tt);
static ct_expr *parse_or(parser *p, tag_tokens *tt) {
    ct_expr *e = parse_and(p, tt);
    while (e && is_name(peek(tt), "or")) {
        int line = peek(tt)->line;
        tt->pos++;
        ct_expr *rhs = parse_and(p, tt);
        if (!rhs) {
            ct_expr_free(e);
            return NULL;
        }
        e = binary(CT_OP_OR, e, rhs, line);
    }
    return e;
}
static ct_expr *parse_and(parser *p, tag_tokens *tt) {
    ct_expr *e = parse_not(p, tt);
    while (e && is_name(peek(tt), "and")) {
        int line = peek(tt)->line;
        tt->pos++;
        ct_expr *rhs = parse_not(p, tt);
        if (!rhs) {
            ct_expr_free(e);
            return NULL;
        }
        e = binary(CT_OP_AND, e, rhs, line);
    }
    return e;
}

// a if b [else c]
static ct_expr *parse_conditional(parser *p, tag_tokens *tt) {
    ct_expr *e = parse_or(p, tt);
    while (e && is_name(peek(tt), "if")) {
        ct_expr *cond = new_expr(CT_EXPR_COND, peek(tt)->line);
        tt->pos++;
        cond->a = e;
        e = cond;
        if (!(cond->b = parse_or(p, tt))) break;
        if (!is_name(peek(tt), "else")) return e;
        tt->pos++;
        if (!(cond->c = parse_or(p, tt))) break;
    }
    if (e && p->failed) {
        ct_expr_free(e);
        return NULL;
    }
    return e;
}

static ct_expr *parse_expr(parser *p, tag_tokens *tt) {
    ct_expr *e = enter(p, peek(tt)->line) == 0 ? parse_conditional(p, tt) : NULL;
    p->depth--;
    return e;
}

// ---------------------------------------------------------------------------------------------
// Segments: the template cut at its tags, with Jinja's whitespace control applied to the text.
typedef enum { SEG_TEXT, SEG_OUTPUT, SEG_STATEMENT } seg_kind;

typedef struct {
    seg_kind kind;
    int line;
    const char *start;   // text, or the tag's inside without delimiters and markers
    size_t len;
} segment;

typedef struct {
    segment *segs;
    size_t n, pos;
} segments;

static void push_segment(segments *ss, seg_kind kind, int line, const char *start, size_t len) {
    ss->segs = neox_realloc(ss->segs, (ss->n + 1) * sizeof *ss->segs);
    ss->segs[ss->n++] = (segment){kind, line, start, len};
}

// The end of a tag's inside: the closing delimiter outside string literals.
static const char *tag_close(const char *s, const char *end, char close) {
    char quote = 0;
    for (; s + 1 < end; s++) {
        if (quote) {
            if (*s == '\\') s++;
            else if (*s == quote) quote = 0;
        } else if (*s == '\'' || *s == '"') {
            quote = *s;
        } else if (*s == close && s[1] == '}') {
            return s;
        }
    }
    return NULL;
}

// lstrip_blocks: the spaces and tabs between the start of a line and a block tag are removed.
static size_t lstrip_line(const char *text, size_t len, int at_template_start) {
    size_t i = len;
    while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t')) i--;
    if (i == 0 ? at_template_start : text[i - 1] == '\n') return i;
    return len;
}

static int cut_segments(parser *p, const char *src, size_t size, segments *ss) {
    const char *s = src, *end = src + size;
    int line = 1, strip_all = 0, trim_newline = 0;
    // Jinja drops one newline at the end of the template (keep_trailing_newline is off).
    if (end > s && end[-1] == '\n') end -= 1 + (end - 1 > s && end[-2] == '\r');
    while (s < end) {
        const char *tag = s;
        while (tag + 1 < end && !(tag[0] == '{' && strchr("{%#", tag[1]))) tag++;
        if (tag + 1 >= end) tag = end;
        const char *text = s;
        size_t len = (size_t)(tag - s);
        if (strip_all) {
            while (len && isspace((unsigned char)*text)) text++, len--;
        } else if (trim_newline && len && *text == '\n') {
            text++, len--;
        } else if (trim_newline && len >= 2 && text[0] == '\r' && text[1] == '\n') {
            text += 2, len -= 2;
        }
        char kind = tag < end ? tag[1] : 0;
        char marker = tag + 2 < end ? tag[2] : 0;
        if (kind && marker == '-') {
            while (len && isspace((unsigned char)text[len - 1])) len--;
        } else if ((kind == '%' || kind == '#') && marker != '+') {
            len = lstrip_line(text, len, s == src || (text > src && text[-1] == '\n'));
        }
        if (len) push_segment(ss, SEG_TEXT, line_at(src, text, 1), text, len);
        if (!kind) break;
        line = line_at(src, tag, 1);
        const char *inside = tag + 2 + (marker == '-' || marker == '+');
        const char *close = kind == '#' ? NULL : tag_close(inside, end, kind == '{' ? '}' : '%');
        if (kind == '#') {
            for (const char *c = inside; c + 1 < end && !close; c++)
                if (c[0] == '#' && c[1] == '}') close = c;
        }
        if (!close) return parse_fail(p, line, "unclosed '{%c'", kind);
        strip_all = close > inside && close[-1] == '-';
        trim_newline = kind != '{';
        const char *inside_end = close - (strip_all || (close > inside && close[-1] == '+'));
        if (kind != '#') push_segment(ss, kind == '{' ? SEG_OUTPUT : SEG_STATEMENT, line, inside, (size_t)(inside_end - inside));
        s = close + 2;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Statements.
static const char *const refused_statements[] = {"macro", "call", "block", "extends", "include", "import", "from",
                                                 "filter", "raw", "with", "break", "continue", "generation",
                                                 "autoescape", "do", "endset"};

static ct_node *new_node(ct_node_kind kind, int line) {
    ct_node *n = calloc(1, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

static void push_node(ct_body *b, ct_node *n) {
    b->nodes = neox_realloc(b->nodes, (b->n + 1) * sizeof *b->nodes);
    b->nodes[b->n++] = n;
}

static void push_branch(ct_node *n, ct_expr *cond) {
    n->conds = neox_realloc(n->conds, (n->n_bodies + 1) * sizeof *n->conds);
    n->bodies = neox_realloc(n->bodies, (n->n_bodies + 1) * sizeof *n->bodies);
    n->conds[n->n_bodies] = cond;
    n->bodies[n->n_bodies++] = (ct_body){0};
}

static int parse_body(parser *p, segments *ss, ct_body *body, const char *const *stops, size_t n_stops,
                      char **stopped_by, tag_tokens *stop_tokens, int open_line);

// Parses a whole expression that must fill the rest of the tag (a for loop's iterable is one without
// "a if b else c", as in Jinja, whose "for x in xs if cond" filters the loop instead).
static ct_expr *parse_rest(parser *p, tag_tokens *tt, ct_expr *(*parse)(parser *, tag_tokens *)) {
    ct_expr *e = parse(p, tt);
    if (e && peek(tt)->kind != TK_END) {
        token *t = peek(tt);
        if (is_name(t, "if") || is_name(t, "recursive")) parse_fail(p, t->line, "unsupported Jinja feature: '%.*s' here", (int)t->len, t->start);
        else parse_fail(p, t->line, "unexpected '%.*s' after the expression", (int)t->len, t->start);
        ct_expr_free(e);
        return NULL;
    }
    return e;
}

static ct_expr *parse_tag_expr(parser *p, tag_tokens *tt) { return parse_rest(p, tt, parse_expr); }

static void node_free(ct_node *n) {
    ct_body b = {.nodes = malloc(sizeof(ct_node *)), .n = 1};
    b.nodes[0] = n;
    ct_body_free(&b);
}

static ct_node *parse_if(parser *p, segments *ss, tag_tokens *tt, int line) {
    static const char *const stops[] = {"elif", "else", "endif"};
    ct_node *n = new_node(CT_NODE_IF, line);
    ct_expr *cond = parse_tag_expr(p, tt);
    int in_else = 0;
    while (!p->failed) {
        push_branch(n, cond);
        char *stop = NULL;
        tag_tokens next = {0};
        if (parse_body(p, ss, &n->bodies[n->n_bodies - 1], stops + (in_else ? 2 : 0), in_else ? 1 : 3, &stop, &next, line) != 0)
            break;
        int done = !strcmp(stop, "endif");
        cond = NULL;
        if (!strcmp(stop, "elif")) cond = parse_tag_expr(p, &next);
        else if (peek(&next)->kind != TK_END) parse_fail(p, next.toks[0].line, "unexpected text after '%s'", stop);
        in_else = !strcmp(stop, "else");
        free(stop);
        tokens_free(&next);
        if (done && !p->failed) return n;
    }
    node_free(n);
    return NULL;
}

static ct_node *parse_for(parser *p, segments *ss, tag_tokens *tt, int line) {
    static const char *const stops[] = {"else", "endfor"};
    token *var = peek(tt);
    if (var->kind != TK_NAME) {
        parse_fail(p, var->line, "expected a loop variable after 'for'");
        return NULL;
    }
    tt->pos++;
    if (is_op(peek(tt), ",")) {
        parse_fail(p, var->line, "unsupported Jinja feature: unpacking in 'for'");
        return NULL;
    }
    if (!is_name(peek(tt), "in")) {
        parse_fail(p, var->line, "expected 'in' after the loop variable");
        return NULL;
    }
    tt->pos++;
    ct_node *n = new_node(CT_NODE_FOR, line);
    n->name = token_text(var);
    n->expr = parse_rest(p, tt, parse_or);
    for (int part = 0; n->expr && part < 2; part++) {
        push_branch(n, NULL);
        char *stop = NULL;
        tag_tokens next = {0};
        if (parse_body(p, ss, &n->bodies[part], stops + part, 2 - (size_t)part, &stop, &next, line) != 0) break;
        int done = !strcmp(stop, "endfor");
        if (peek(&next)->kind != TK_END) parse_fail(p, next.toks[0].line, "unexpected text after '%s'", stop);
        free(stop);
        tokens_free(&next);
        if (p->failed) break;
        if (done) return n;
    }
    node_free(n);
    return NULL;
}

static ct_node *parse_set(parser *p, tag_tokens *tt, int line) {
    token *var = peek(tt);
    if (var->kind != TK_NAME) {
        parse_fail(p, var->line, "expected a name after 'set'");
        return NULL;
    }
    tt->pos++;
    if (is_op(peek(tt), ".") || is_op(peek(tt), ",")) {
        parse_fail(p, var->line, "unsupported Jinja feature: 'set' of an attribute or several names");
        return NULL;
    }
    if (!is_op(peek(tt), "=")) {
        parse_fail(p, var->line, "unsupported Jinja feature: block 'set' (expected '=' after the name)");
        return NULL;
    }
    tt->pos++;
    ct_expr *value = parse_tag_expr(p, tt);
    if (!value) return NULL;
    ct_node *n = new_node(CT_NODE_SET, line);
    n->name = token_text(var);
    n->expr = value;
    return n;
}

// Parses nodes up to one of the stop statements (whose name goes to *stopped_by and the rest of its
// tokens to *stop_tokens), or to the end of the template when stops is empty; open_line is the line
// of the statement the body belongs to.
static int parse_body(parser *p, segments *ss, ct_body *body, const char *const *stops, size_t n_stops,
                      char **stopped_by, tag_tokens *stop_tokens, int open_line) {
    while (ss->pos < ss->n) {
        segment *seg = &ss->segs[ss->pos++];
        if (seg->kind == SEG_TEXT) {
            ct_node *n = new_node(CT_NODE_TEXT, seg->line);
            n->text = strndup(seg->start, seg->len);
            n->text_size = seg->len;
            push_node(body, n);
            continue;
        }
        tag_tokens tt = {0};
        if (lex_tag(p, seg->start, seg->start + seg->len, seg->line, &tt) != 0) {
            tokens_free(&tt);
            return -1;
        }
        ct_node *n = NULL;
        if (seg->kind == SEG_OUTPUT) {
            ct_expr *e = parse_tag_expr(p, &tt);
            if (e) (n = new_node(CT_NODE_OUTPUT, seg->line))->expr = e;
        } else {
            token *kw = peek(&tt);
            tt.pos++;
            for (size_t i = 0; i < n_stops; i++) {
                if (!is_name(kw, stops[i])) continue;
                *stopped_by = strdup(stops[i]);
                *stop_tokens = tt;
                return 0;
            }
            int nested = (is_name(kw, "if") || is_name(kw, "for")) && enter(p, seg->line) == 0;
            if (nested && is_name(kw, "if")) n = parse_if(p, ss, &tt, seg->line);
            else if (nested) n = parse_for(p, ss, &tt, seg->line);
            else if (is_name(kw, "set")) n = parse_set(p, &tt, seg->line);
            else if (p->failed) ;
            else if (kw->kind == TK_NAME && name_in(kw, refused_statements, sizeof refused_statements / sizeof *refused_statements))
                parse_fail(p, seg->line, "unsupported Jinja statement '%.*s'", (int)kw->len, kw->start);
            else if (kw->kind == TK_NAME) parse_fail(p, seg->line, "unexpected statement '%.*s'", (int)kw->len, kw->start);
            else parse_fail(p, seg->line, "expected a statement name after '{%%'");
        }
        if (seg->kind == SEG_STATEMENT && (is_name(&tt.toks[0], "if") || is_name(&tt.toks[0], "for"))) p->depth--;
        tokens_free(&tt);
        if (!n) return -1;
        push_node(body, n);
    }
    if (n_stops) return parse_fail(p, open_line, "missing '{%% %s %%}'", stops[n_stops - 1]);
    return 0;
}

neox_chat_template *neox_chat_template_parse(const char *source, size_t size, const char *name, neox_error *err) {
    parser p = {.name = name, .err = err};
    if (memchr(source, 0, size)) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s: the template contains a NUL byte", name);
        return NULL;
    }
    segments ss = {0};
    neox_chat_template *t = calloc(1, sizeof *t);
    t->name = strdup(name);
    int rc = cut_segments(&p, source, size, &ss);
    if (rc == 0) rc = parse_body(&p, &ss, &t->body, NULL, 0, NULL, NULL, 1);
    free(ss.segs);
    if (rc != 0) {
        neox_chat_template_free(t);
        return NULL;
    }
    return t;
}

void ct_expr_free(ct_expr *e) {
    if (!e) return;
    ct_expr_free(e->a);
    ct_expr_free(e->b);
    ct_expr_free(e->c);
    for (size_t i = 0; i < e->n_items; i++) ct_expr_free(e->items[i]);
    free(e->items);
    free(e->name);
    json_decref(e->value);
    free(e);
}

void ct_body_free(ct_body *b) {
    for (size_t i = 0; i < b->n; i++) {
        ct_node *n = b->nodes[i];
        free(n->text);
        free(n->name);
        ct_expr_free(n->expr);
        for (size_t j = 0; j < n->n_bodies; j++) {
            ct_expr_free(n->conds[j]);
            ct_body_free(&n->bodies[j]);
        }
        free(n->conds);
        free(n->bodies);
        free(n);
    }
    free(b->nodes);
    b->nodes = NULL;
    b->n = 0;
}

void neox_chat_template_free(neox_chat_template *tmpl) {
    if (!tmpl) return;
    ct_body_free(&tmpl->body);
    free(tmpl->name);
    free(tmpl);
}
