// normalize.c: the normalizers a tokenizer.json may name, applied in order as HF's Sequence does:
// NFC, NFD, NFKC, NFKD (utf8proc), Lowercase (Rust's char::to_lowercase per character), Strip
// (White_Space at either end), Replace (a literal or a regex) and Prepend (before non-empty text).
// ASCII text under only Unicode normalization forms is left as it is without a copy, since every
// form leaves ASCII unchanged.
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"

static bool all_ascii(const char *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) return false;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static bool is_unicode_form(enum normalizer_kind k) { return k >= NORM_NFC && k <= NORM_NFKD; }

static utf8proc_option_t options_of(enum normalizer_kind k) {
    switch (k) {
    case NORM_NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case NORM_NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case NORM_NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    case NORM_NFKD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    default: return 0;
    }
}

static char *unicode_form(enum normalizer_kind k, const char *in, size_t n, size_t *out_size) {
    utf8proc_uint8_t *out = NULL;
    // The input is valid UTF-8 (invalid bytes were replaced before); utf8proc stops at NUL only
    // with UTF8PROC_NULLTERM, which is not set.
    utf8proc_ssize_t got = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &out, options_of(k));
    if (got < 0) {  // keep the text as it is rather than lose it
        free(out);
        return NULL;
    }
    *out_size = (size_t)got;
    return (char *)out;
}

// Rust's char::to_lowercase: utf8proc's simple mapping, plus the one unconditional multi-character
// lowercase mapping of SpecialCasing (U+0130 -> "i\u0307").
static char *lowercase(const char *in, size_t n, size_t *out_size) {
    char *out = neox_malloc(n * 3 / 2 + 8);
    size_t len = 0, cap = n * 3 / 2 + 8;
    for (size_t i = 0; i < n;) {
        int clen;
        int32_t cp = utf8_decode((const uint8_t *)in + i, n - i, &clen);
        i += (size_t)clen;
        if (len + 8 > cap) out = neox_realloc(out, cap *= 2);
        if (cp == 0x130) {
            out[len++] = 'i';
            len += (size_t)utf8_encode(0x307, out + len);
            continue;
        }
        len += (size_t)utf8_encode((uint32_t)(cp < 0 ? 0xFFFD : utf8proc_tolower(cp)), out + len);
    }
    *out_size = len;
    return out;
}

static char *strip(const tok_normalizer *nm, const char *in, size_t n, size_t *out_size) {
    size_t start = 0, end = n;
    while (nm->strip_left && start < end) {
        int clen;
        int32_t cp = utf8_decode((const uint8_t *)in + start, end - start, &clen);
        if (!unicode_is_space(cp)) break;
        start += (size_t)clen;
    }
    while (nm->strip_right && end > start) {
        size_t j = end - 1;
        while (j > start && ((unsigned char)in[j] & 0xC0) == 0x80) j--;
        int clen;
        if (!unicode_is_space(utf8_decode((const uint8_t *)in + j, end - j, &clen))) break;
        end = j;
    }
    *out_size = end - start;
    return tok_bytes_dup(in + start, end - start);
}

static char *prepend(const tok_normalizer *nm, const char *in, size_t n, size_t *out_size) {
    if (n == 0) return NULL;
    char *out = neox_malloc(nm->content_len + n + 1);
    memcpy(out, nm->content, nm->content_len);
    memcpy(out + nm->content_len, in, n);
    out[nm->content_len + n] = 0;
    *out_size = nm->content_len + n;
    return out;
}

// One normalizer; NULL when the text is unchanged.
static char *apply(const tok_normalizer *nm, const char *in, size_t n, size_t *out_size) {
    switch (nm->kind) {
    case NORM_NFC: case NORM_NFD: case NORM_NFKC: case NORM_NFKD:
        return all_ascii(in, n) ? NULL : unicode_form(nm->kind, in, n, out_size);
    case NORM_LOWERCASE: return lowercase(in, n, out_size);
    case NORM_STRIP: return strip(nm, in, n, out_size);
    case NORM_PREPEND: return prepend(nm, in, n, out_size);
    case NORM_REPLACE: {
        neox_error ignored = {0};  // a regex that gives up leaves the text as it is
        return pattern_replace_all(&nm->pattern, in, n, nm->content, nm->content_len, out_size, &ignored);
    }
    }
    return NULL;
}

char *tokenizer_normalize(const neox_tokenizer *tok, const char *text, size_t size, bool continued,
                          size_t *out_size) {
    if (tok->n_normalizers == 0) return NULL;
    bool only_forms = true;
    for (int i = 0; i < tok->n_normalizers; i++) only_forms = only_forms && is_unicode_form(tok->normalizers[i].kind);
    if (only_forms && all_ascii(text, size)) return NULL;
    char *cur = NULL;
    size_t cur_size = size;
    for (int i = 0; i < tok->n_normalizers; i++) {
        if (continued && tok->normalizers[i].kind == NORM_PREPEND) continue;
        size_t n;
        char *next = apply(&tok->normalizers[i], cur ? cur : text, cur_size, &n);
        if (!next) continue;
        free(cur);
        cur = next, cur_size = n;
    }
    *out_size = cur_size;
    return cur;
}

char *pattern_replace_all(const tok_pattern *p, const char *s, size_t n, const char *content, size_t content_len,
                          size_t *out_size, neox_error *err) {
    tok_segment *segs;
    size_t n_segs;
    if (pattern_find_matches(p, s, n, &segs, &n_segs, err) < 0) return NULL;
    size_t cap = n + 16, len = 0;
    char *out = neox_malloc(cap);
    for (size_t i = 0; i < n_segs; i++) {
        const char *piece = segs[i].is_match ? content : s + segs[i].start;
        size_t plen = segs[i].is_match ? content_len : segs[i].end - segs[i].start;
        if (len + plen + 1 > cap) out = neox_realloc(out, cap = (len + plen + 1) * 2);
        memcpy(out + len, piece, plen);
        len += plen;
    }
    out[len] = 0;
    free(segs);
    *out_size = len;
    return out;
}

void pattern_free(tok_pattern *p) {
    free(p->literal);
    tok_regex_free(p->regex);
    memset(p, 0, sizeof *p);
}
