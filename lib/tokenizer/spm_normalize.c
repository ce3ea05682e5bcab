// spm_normalize.c: SentencePiece's normalizer for unigram and BPE models — the model's precompiled
// character map (a darts-clone double-array trie of source strings whose values point into a
// blob of NUL-terminated replacements), user-defined symbols passed through whole, the dummy
// prefix (or suffix), runs of whitespace collapsed and trimmed, spaces escaped as U+2581. The rules
// are those of sentencepiece's normalizer.cc, which 0.1.97 and 0.2.3 share; the library itself has
// no call that only normalizes. Input is valid UTF-8 (the tokenizer replaces invalid bytes first).
// Every trie step and blob offset is bounds-checked: the library does not check the map's contents.
#include <stdlib.h>
#include <string.h>

#include "spm.h"

#define SPACE_SYMBOL "\xe2\x96\x81"  // U+2581

struct spm_normalizer {
    uint32_t *units;  // the double array (little-endian in the file, copied out)
    size_t n_units;
    char *replacements;  // the blob after the trie
    size_t replacements_size;
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces, whitespace_as_suffix;
    const unigram_model *user_symbols;  // longest user-defined piece at a position
};

spm_normalizer *spm_normalizer_new(const spm_proto_fields *f, const unigram_model *user_symbols) {
    spm_normalizer *n = neox_calloc(1, sizeof *n);
    n->add_dummy_prefix = f->add_dummy_prefix;
    n->remove_extra_whitespaces = f->remove_extra_whitespaces;
    n->escape_whitespaces = f->escape_whitespaces;
    n->whitespace_as_suffix = f->treat_whitespace_as_suffix;
    n->user_symbols = user_symbols;
    // <trie size: uint32 LE><trie units><replacements>; the library refuses a map whose trie size
    // is not below the blob's, and an empty map means no rule (identity).
    if (f->charsmap_size > 4) {
        const uint8_t *b = f->charsmap;
        size_t trie_size = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
        if (trie_size >= 4 && trie_size < f->charsmap_size - 4) {
            n->n_units = trie_size / 4;
            n->units = neox_malloc(n->n_units * sizeof *n->units);
            for (size_t i = 0; i < n->n_units; i++) {
                const uint8_t *u = b + 4 + 4 * i;
                n->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
            }
            n->replacements_size = f->charsmap_size - 4 - trie_size;
            n->replacements = neox_malloc(n->replacements_size + 1);
            memcpy(n->replacements, b + 4 + trie_size, n->replacements_size);
            n->replacements[n->replacements_size] = 0;  // a last replacement without its NUL ends here
        }
    }
    return n;
}

void spm_normalizer_free(spm_normalizer *n) {
    if (!n) return;
    free(n->units);
    free(n->replacements);
    free(n);
}

// darts-clone's unit fields.
static bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & 0x7FFFFFFFu; }
static uint32_t unit_label(uint32_t u) { return u & 0x800000FFu; }
static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

// The longest source string of the map that starts s (darts-clone's common-prefix search): its
// length, 0 for none, and its replacement.
static size_t longest_rule(const spm_normalizer *n, const uint8_t *s, size_t len, const char **replacement) {
    size_t best = 0;
    if (!n->n_units) return 0;
    size_t pos = unit_offset(n->units[0]);
    for (size_t i = 0; i < len; i++) {
        pos ^= s[i];
        if (pos >= n->n_units) break;
        uint32_t unit = n->units[pos];
        if (unit_label(unit) != s[i]) break;
        pos ^= unit_offset(unit);
        if (!unit_has_leaf(unit)) continue;
        if (pos >= n->n_units) break;
        uint32_t value = unit_value(n->units[pos]);
        if (value >= n->replacements_size) break;
        best = i + 1;
        *replacement = n->replacements + value;
    }
    return best;
}

// The normalized form of the prefix of s (n bytes left): user-defined symbols as they are, else
// the longest rule of the map, else one character unchanged. Sets *consumed.
static const char *normalize_prefix(const spm_normalizer *n, const uint8_t *s, size_t left, size_t *consumed,
                                    size_t *out_len) {
    size_t len = n->user_symbols ? unigram_user_symbol_prefix(n->user_symbols, s, left) : 0;
    if (len) {
        *consumed = *out_len = len;
        return (const char *)s;
    }
    const char *replacement = NULL;
    len = longest_rule(n, s, left, &replacement);
    if (len) {
        *consumed = len;
        *out_len = strlen(replacement);
        return replacement;
    }
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    len = by_high_nibble[s[0] >> 4];
    *consumed = *out_len = len < left ? len : left;
    return (const char *)s;
}

typedef struct text_buf { char *data; size_t len, cap; } text_buf;

static void put(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = neox_realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void put_space(const spm_normalizer *n, text_buf *b) {
    if (n->escape_whitespaces) put(b, SPACE_SYMBOL, 3);
    else put(b, " ", 1);
}

char *spm_normalize(const spm_normalizer *n, const char *text, size_t size, size_t *out_size) {
    text_buf b = {neox_malloc(size * 3 + 16), 0, size * 3 + 16};
    const uint8_t *s = (const uint8_t *)text, *end = s + size;
    size_t consumed, len;
    if (n->remove_extra_whitespaces) {  // leading characters that normalize to one space
        while (s < end) {
            const char *p = normalize_prefix(n, s, (size_t)(end - s), &consumed, &len);
            if (len != 1 || p[0] != ' ') break;
            s += consumed;
        }
    }
    if (s == end) {
        *out_size = 0;
        b.data[0] = 0;
        return b.data;
    }
    if (n->add_dummy_prefix && !n->whitespace_as_suffix) put_space(n, &b);
    bool previous_space = n->remove_extra_whitespaces;
    while (s < end) {
        const char *p = normalize_prefix(n, s, (size_t)(end - s), &consumed, &len);
        // After a space, the spaces that start a piece go when runs are collapsed.
        while (previous_space && len && p[0] == ' ') p++, len--;
        if (len) {
            for (size_t i = 0; i < len; i++) {
                if (p[i] == ' ' && n->escape_whitespaces) put(&b, SPACE_SYMBOL, 3);
                else put(&b, p + i, 1);
            }
            previous_space = p[len - 1] == ' ';
        }
        s += consumed;
        if (!n->remove_extra_whitespaces) previous_space = false;
    }
    if (n->remove_extra_whitespaces) {  // trailing spaces (escaped or not)
        const char *space = n->escape_whitespaces ? SPACE_SYMBOL : " ";
        size_t space_len = strlen(space);
        while (b.len >= space_len && !memcmp(b.data + b.len - space_len, space, space_len)) b.len -= space_len;
    }
    if (n->add_dummy_prefix && n->whitespace_as_suffix) put_space(n, &b);
    b.data[b.len] = 0;
    *out_size = b.len;
    return b.data;
}
