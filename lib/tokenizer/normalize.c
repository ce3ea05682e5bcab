// normalize.c: the Unicode normalizers a tokenizer.json may name (NFC, NFD, NFKC, NFKD, alone or
// in a Sequence), applied with utf8proc. ASCII text is left as it is without a copy, since every
// normalization form leaves ASCII unchanged.
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

static utf8proc_option_t options_of(enum normalizer_kind k) {
    switch (k) {
    case NORM_NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case NORM_NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case NORM_NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    case NORM_NFKD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    default: return 0;
    }
}

char *tokenizer_normalize(const neox_tokenizer *tok, const char *text, size_t size, size_t *out_size) {
    if (tok->n_normalizers == 0 || all_ascii(text, size)) return NULL;
    char *cur = NULL;
    size_t cur_size = size;
    for (int i = 0; i < tok->n_normalizers; i++) {
        utf8proc_uint8_t *out = NULL;
        const char *in = cur ? cur : text;
        // The input is valid UTF-8 (invalid bytes were replaced before), so this cannot fail;
        // utf8proc stops at NUL only with UTF8PROC_NULLTERM, which is not set.
        utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)cur_size, &out,
                                          options_of(tok->normalizers[i]));
        if (n < 0) {  // keep the text as it is rather than lose it
            free(out);
            continue;
        }
        free(cur);
        cur = (char *)out;
        cur_size = (size_t)n;
    }
    *out_size = cur_size;
    return cur;
}
