// text.c: the text handling lm-evaluation-harness's wikitext task does in Python, reimplemented:
// wikitext_detokenizer (string replacements and five "strip inside the brackets/quotes"
// regular expressions) and the word count len(re.split(r"\s+", page)), with Python's notion of
// Unicode whitespace.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "eval.h"

// str.isspace() for one code point: bidirectional class WS, B or S, or category Zs.
static int py_isspace(utf8proc_int32_t c) {
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c < 0x80) return 0;
    const utf8proc_property_t *p = utf8proc_get_property(c);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

// Length in bytes of the whitespace character at s (0 when it is not one).
static size_t space_at(const char *s, size_t n) {
    if (n == 0) return 0;
    utf8proc_int32_t c;
    utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (len <= 0) return 0;
    return py_isspace(c) ? (size_t)len : 0;
}

int64_t neox_count_words(const char *s, size_t n) {
    int64_t words = 1;
    for (size_t i = 0; i < n;) {
        size_t w = space_at(s + i, n - i);
        if (!w) {
            i++;
            continue;
        }
        words++;
        while (i < n && (w = space_at(s + i, n - i)) > 0) i += w;
    }
    return words;
}

int64_t neox_count_codepoints(const char *s) {
    int64_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

// Replaces every occurrence of `from` with `to` (left to right, non-overlapping, as str.replace).
static char *replace(char *s, const char *from, const char *to) {
    size_t nf = strlen(from), nt = strlen(to), n = strlen(s);
    char *out = neox_malloc(n * (nt > nf ? nt / nf + 1 : 1) + 1), *o = out;
    for (const char *p = s; *p;) {
        if (!strncmp(p, from, nf)) {
            memcpy(o, to, nt);
            o += nt;
            p += nf;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    free(s);
    return out;
}

// re.sub(OPEN \s* ([^CLOSE]*?) \s* CLOSE, OPEN \1 CLOSE): each OPEN with a CLOSE after it loses the
// whitespace just inside both ends; scanning resumes after the CLOSE.
static char *strip_inside(char *s, char open, char close) {
    size_t n = strlen(s);
    char *out = neox_malloc(n + 1), *o = out;
    for (size_t i = 0; i < n;) {
        const char *end = s[i] == open ? strchr(s + i + 1, close) : NULL;
        if (!end) {
            *o++ = s[i++];
            continue;
        }
        size_t a = i + 1, b = (size_t)(end - s), w;
        while (a < b && (w = space_at(s + a, b - a)) > 0) a += w;
        // Trailing whitespace: walk back over whole code points.
        for (;;) {
            size_t k = b;
            while (k > a && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--;
            if (k > a && space_at(s + k - 1, b - (k - 1)) == b - (k - 1)) b = k - 1;
            else break;
        }
        *o++ = open;
        memcpy(o, s + a, b - a);
        o += b - a;
        *o++ = close;
        i = (size_t)(end - s) + 1;
    }
    *o = 0;
    free(s);
    return out;
}

// re.sub(r"/' [0-9]/", r"/'[0-9]/", s): the pattern and the replacement are literal text apart
// from the digit class, so a match becomes the literal "/'[0-9]/" (as the harness does).
static char *slash_quote_digit(char *s) {
    size_t n = strlen(s);
    char *out = neox_malloc(n * 2 + 1), *o = out;
    for (size_t i = 0; i < n;) {
        if (i + 5 <= n && s[i] == '/' && s[i + 1] == '\'' && s[i + 2] == ' ' && s[i + 3] >= '0' && s[i + 3] <= '9' &&
            s[i + 4] == '/') {
            memcpy(o, "/'[0-9]/", 8);
            o += 8;
            i += 5;
        } else {
            *o++ = s[i++];
        }
    }
    *o = 0;
    free(s);
    return out;
}

char *neox_wikitext_detokenize(const char *text) {
    char *s = neox_strdup(text);
    s = replace(s, "s '", "s'");
    s = slash_quote_digit(s);
    static const char *const number_and_punct[][2] = {
        {" @-@ ", "-"}, {" @,@ ", ","}, {" @.@ ", "."}, {" : ", ": "}, {" ; ", "; "},
        {" . ", ". "},  {" ! ", "! "},  {" ? ", "? "},  {" , ", ", "},
    };
    for (size_t i = 0; i < sizeof number_and_punct / sizeof *number_and_punct; i++)
        s = replace(s, number_and_punct[i][0], number_and_punct[i][1]);
    s = strip_inside(s, '(', ')');
    s = strip_inside(s, '[', ']');
    s = strip_inside(s, '{', '}');
    s = strip_inside(s, '"', '"');
    s = strip_inside(s, '\'', '\'');
    static const char *const misc[][2] = {
        {"= = = =", "===="}, {"= = =", "==="}, {"= =", "=="}, {" \xc2\xb0 ", "\xc2\xb0"},
        {" \n", "\n"},       {"\n ", "\n"},    {" N ", " 1 "}, {" 's", "'s"},
    };
    for (size_t i = 0; i < sizeof misc / sizeof *misc; i++) s = replace(s, misc[i][0], misc[i][1]);
    return s;
}
