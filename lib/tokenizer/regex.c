// regex.c: the regular expressions tokenizer files carry (Split pre-tokenizers, Replace
// normalizers and decoders, tiktoken patterns), compiled with PCRE2 in UTF + UCP mode so \p{L},
// \p{N}, \w and case folding follow Unicode as the Rust `regex` / `fancy-regex` crates and
// Oniguruma (HF tokenizers) do. Two differences are rewritten away:
//  - PCRE2's \s is [\p{Z}\h\v], which lacks U+0085 and has U+180E; the engines HF and tiktoken
//    use match White_Space (U+0009..U+000D, U+0085, \p{Z}), so \s and \S are spelled out as that;
//  - Oniguruma's [:punct:] is \p{P} and \p{S}; PCRE2's leaves out symbols above U+007F.
// Character properties come from PCRE2's Unicode tables (Unicode 14 in PCRE2 10.42): a code point
// assigned later is "unassigned" here but may be a letter to a newer engine.
// Matching is JIT-compiled; match data and the JIT stack are per thread, so matching takes no lock.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <string.h>

#include "tokenizer_internal.h"

struct tok_regex {
    pcre2_code *code;
    bool jit;
};

// Appends n bytes to a growable string.
static void put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = neox_realloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

#define WHITE_SPACE "\\x{9}-\\x{D}\\x{85}\\p{Z}"

// The pattern with \s, \S and [:punct:] spelled out as HF's and tiktoken's engines read them.
static char *rewrite_classes(const char *p, size_t n, size_t *out_len) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool in_class = false;  // inside [...]
    put(&buf, &len, &cap, "", 0);
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's') put(&buf, &len, &cap, in_class ? WHITE_SPACE : "[" WHITE_SPACE "]",
                              strlen(in_class ? WHITE_SPACE : "[" WHITE_SPACE "]"));
            else if (d == 'S' && !in_class) put(&buf, &len, &cap, "[^" WHITE_SPACE "]", strlen("[^" WHITE_SPACE "]"));
            else put(&buf, &len, &cap, p + i, 2);
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            put(&buf, &len, &cap, p + i, 1);
            // A ']' (after an optional '^') right after '[' is a literal member.
            if (i + 1 < n && p[i + 1] == '^') put(&buf, &len, &cap, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') put(&buf, &len, &cap, p + ++i, 1);
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && p[i + 1] == ':') {  // POSIX class [:alpha:]
            const char *end = strstr(p + i, ":]");
            size_t k = end && (size_t)(end - p) < n ? (size_t)(end - p) + 2 : i + 1;
            if (k - i == 9 && !memcmp(p + i, "[:punct:]", 9)) put(&buf, &len, &cap, "\\p{P}\\p{S}", 10);
            else put(&buf, &len, &cap, p + i, k - i);
            i = k - 1;
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        put(&buf, &len, &cap, p + i, 1);
    }
    *out_len = len;
    return buf;
}

tok_regex *tok_regex_compile(const char *pattern, size_t len, enum regex_dialect dialect, const char *file,
                             const char *where, neox_error *err) {
    size_t wlen;
    char *widened = rewrite_classes(pattern, len, &wlen);
    int code;
    PCRE2_SIZE offset;
    // Oniguruma's Ruby syntax (HF) has ^ and $ at every line; Rust's regex only at the text's ends.
    uint32_t anchors = dialect == REGEX_ONIGURUMA ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)widened, wlen, PCRE2_UTF | PCRE2_UCP | anchors, &code, &offset, NULL);
    free(widened);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: the regular expression does not compile (%s, near offset %zu)", file,
                  where, (const char *)msg, (size_t)offset);
        return NULL;
    }
    tok_regex *r = neox_calloc(1, sizeof *r);
    r->code = re;
    r->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return r;
}

void tok_regex_free(tok_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

// Per-thread matching state: one ovector pair and a JIT stack that may grow to 8 MB (long runs of
// one class under a lookahead need more than PCRE2's default 32 kB).
typedef struct regex_thread_state {
    pcre2_match_data *data;
    pcre2_match_context *context;
    pcre2_jit_stack *stack;
} regex_thread_state;

static pthread_key_t regex_key;
static pthread_once_t regex_once = PTHREAD_ONCE_INIT;
static _Thread_local regex_thread_state *regex_state;

static void regex_state_destroy(void *p) {
    regex_thread_state *s = p;
    pcre2_match_data_free(s->data);
    pcre2_match_context_free(s->context);
    pcre2_jit_stack_free(s->stack);
    free(s);
}

static void regex_key_create(void) { pthread_key_create(&regex_key, regex_state_destroy); }

static regex_thread_state *get_regex_state(void) {
    if (regex_state) return regex_state;
    pthread_once(&regex_once, regex_key_create);
    regex_state = neox_calloc(1, sizeof *regex_state);
    regex_state->data = pcre2_match_data_create(1, NULL);
    regex_state->context = pcre2_match_context_create(NULL);
    regex_state->stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    pcre2_jit_stack_assign(regex_state->context, NULL, regex_state->stack);
    pthread_setspecific(regex_key, regex_state);
    return regex_state;
}

int tok_regex_find(const tok_regex *re, const uint8_t *s, size_t n, size_t from, size_t *start, size_t *end,
                   neox_error *err) {
    regex_thread_state *st = get_regex_state();
    // The text is valid UTF-8 (invalid bytes were replaced before), so the UTF check is skipped.
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, st->data, st->context);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return neox_fail(err, NEOX_EXIT_FAILURE, "tokenizer regular expression: matching failed (%s)",
                         (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->data);
    *start = ov[0], *end = ov[1];
    return 1;
}
