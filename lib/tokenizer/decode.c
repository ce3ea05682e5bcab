// decode.c: HF tokenizers' decoders over the texts of the ids being decoded, each step mapping the
// list of token strings to a new list as its decode_chain does — ByteLevel (alphabet back to bytes),
// Metaspace, ByteFallback (<0xXX> runs back to bytes, U+FFFD per byte when they are not UTF-8),
// Fuse, Strip, Replace, BPEDecoder (end_of_word_suffix) — then the list is concatenated.
#include <string.h>

#include "tokenizer_internal.h"

typedef struct token_list { char **text; size_t *len; size_t n, cap; } token_list;

static void list_push(token_list *l, char *text, size_t len) {  // takes text
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->text = neox_realloc(l->text, l->cap * sizeof *l->text);
        l->len = neox_realloc(l->len, l->cap * sizeof *l->len);
    }
    l->text[l->n] = text, l->len[l->n++] = len;
}

static void list_free(token_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->text[i]);
    free(l->text);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static char *concat(const token_list *l, size_t *size) {
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++) total += l->len[i];
    char *out = neox_malloc(total + 1);
    size_t at = 0;
    for (size_t i = 0; i < l->n; i++) memcpy(out + at, l->text[i], l->len[i]), at += l->len[i];
    out[at] = 0;
    *size = at;
    return out;
}

// ByteLevel: all tokens become one string of the bytes their alphabet chars stand for; a token with
// any other char keeps its UTF-8 text (HF does the same, e.g. for added tokens made of spaces).
static void bytelevel(const token_list *in, token_list *out) {
    size_t total = 0;
    for (size_t i = 0; i < in->n; i++) total += in->len[i];
    char *buf = neox_malloc(total + 1);
    size_t len = 0;
    for (size_t i = 0; i < in->n; i++) {
        long got = bytelevel_decode(in->text[i], in->len[i], (uint8_t *)buf + len);
        if (got < 0) memcpy(buf + len, in->text[i], in->len[i]), got = (long)in->len[i];
        len += (size_t)got;
    }
    buf[len] = 0;
    list_push(out, buf, len);
}

// Metaspace: the replacement becomes a space, and disappears from the first token unless the
// pre-tokenizer never prepends it.
static void metaspace(const tok_decoder *d, const token_list *in, token_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *t = in->text[i];
        char *buf = neox_malloc(in->len[i] + 1);
        size_t len = 0;
        for (size_t k = 0; k < in->len[i];) {
            if (in->len[i] - k >= d->replacement_len && !memcmp(t + k, d->replacement, d->replacement_len)) {
                if (!(i == 0 && d->prepend != PREPEND_NEVER)) buf[len++] = ' ';
                k += d->replacement_len;
            } else {
                buf[len++] = t[k++];
            }
        }
        buf[len] = 0;
        list_push(out, buf, len);
    }
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int fallback_byte(const char *t, size_t len) {  // "<0xAB>" -> 0xAB, else -1
    if (len != 6 || memcmp(t, "<0x", 3) || t[5] != '>') return -1;
    int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void flush_bytes(token_list *out, uint8_t *bytes, size_t *n) {
    if (*n == 0) return;
    if (utf8_valid_prefix(bytes, *n) == *n) {
        list_push(out, tok_bytes_dup((const char *)bytes, *n), *n);
    } else {
        for (size_t i = 0; i < *n; i++) list_push(out, neox_strdup("\xEF\xBF\xBD"), 3);
    }
    *n = 0;
}

static void byte_fallback(const token_list *in, token_list *out) {
    uint8_t *bytes = neox_malloc(in->n + 1);
    size_t n = 0;
    for (size_t i = 0; i < in->n; i++) {
        int b = fallback_byte(in->text[i], in->len[i]);
        if (b >= 0) {
            bytes[n++] = (uint8_t)b;
            continue;
        }
        flush_bytes(out, bytes, &n);
        list_push(out, tok_bytes_dup(in->text[i], in->len[i]), in->len[i]);
    }
    flush_bytes(out, bytes, &n);
    free(bytes);
}

// Strip: up to strip_start copies of the character at the front of each token, strip_stop at the end.
static void strip(const tok_decoder *d, const token_list *in, token_list *out) {
    size_t c = d->content_len;
    for (size_t i = 0; i < in->n; i++) {
        const char *t = in->text[i];
        size_t start = 0, stop = in->len[i];
        for (int64_t k = 0; k < d->strip_start && stop - start >= c && !memcmp(t + start, d->content, c); k++)
            start += c;
        for (int64_t k = 0; k < d->strip_stop && stop - start >= c && !memcmp(t + stop - c, d->content, c); k++)
            stop -= c;
        list_push(out, tok_bytes_dup(t + start, stop - start), stop - start);
    }
}

static void replace(const tok_decoder *d, const token_list *in, token_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        size_t len;
        neox_error ignored = {0};  // a regex that gives up leaves the token as it is
        char *r = pattern_replace_all(&d->pattern, in->text[i], in->len[i], d->content, d->content_len, &len, &ignored);
        if (!r) r = tok_bytes_dup(in->text[i], len = in->len[i]);
        list_push(out, r, len);
    }
}

// BPEDecoder: end_of_word_suffix becomes a space, or nothing in the last token.
static void bpe_suffix(const tok_decoder *d, const token_list *in, token_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        tok_pattern lit = {.literal = d->content, .literal_len = d->content_len};
        size_t len;
        char *r = pattern_replace_all(&lit, in->text[i], in->len[i], " ", i + 1 == in->n ? 0 : 1, &len, NULL);
        list_push(out, r, len);
    }
}

static void run_decoder(const tok_decoder *d, const token_list *in, token_list *out) {
    switch (d->kind) {
    case DEC_BYTELEVEL: bytelevel(in, out); break;
    case DEC_METASPACE: metaspace(d, in, out); break;
    case DEC_BYTE_FALLBACK: byte_fallback(in, out); break;
    case DEC_FUSE: {
        size_t len;
        char *all = concat(in, &len);
        list_push(out, all, len);
        break;
    }
    case DEC_STRIP: strip(d, in, out); break;
    case DEC_REPLACE: replace(d, in, out); break;
    case DEC_BPE: bpe_suffix(d, in, out); break;
    }
}

char *tokenizer_run_decoders(const neox_tokenizer *tok, char **tokens, size_t *lens, size_t n, size_t *size) {
    token_list cur = {0};
    for (size_t i = 0; i < n; i++) list_push(&cur, tok_bytes_dup(tokens[i], lens[i]), lens[i]);
    for (int i = 0; i < tok->n_decoders; i++) {
        token_list next = {0};
        run_decoder(&tok->decoders[i], &cur, &next);
        list_free(&cur);
        cur = next;
    }
    char *out = concat(&cur, size);
    list_free(&cur);
    return out;
}
