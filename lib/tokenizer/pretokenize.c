// pretokenize.c: the GPT-2 pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out as a matcher over character classes. Every character is exactly one of letter
// (\p{L}), number (\p{N}), whitespace (\s) or other, so the alternatives tile the text and each
// call returns the match that starts where the previous one ended. \s is the White_Space set that
// Oniguruma (HF tokenizers) and Rust's regex (tiktoken) use: U+0009..U+000D, U+0085 and the
// categories Zs, Zl, Zp. Categories come from utf8proc.
#include <utf8proc.h>

#include "tokenizer_internal.h"

enum { CL_LETTER, CL_NUMBER, CL_SPACE, CL_OTHER };

static const uint8_t ascii_class[128] = {
#define O CL_OTHER
#define S CL_SPACE
#define N CL_NUMBER
#define L CL_LETTER
    O, O, O, O, O, O, O, O, O, S, S, S, S, S, O, O,  // 0x00
    O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O,  // 0x10
    S, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O,  // ' ' .. '/'
    N, N, N, N, N, N, N, N, N, N, O, O, O, O, O, O,  // '0' .. '?'
    O, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L,  // '@' .. 'O'
    L, L, L, L, L, L, L, L, L, L, L, O, O, O, O, O,  // 'P' .. '_'
    O, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L,  // '`' .. 'o'
    L, L, L, L, L, L, L, L, L, L, L, O, O, O, O, O,  // 'p' .. DEL
#undef O
#undef S
#undef N
#undef L
};

static int unicode_class(int32_t cp) {
    if (cp == 0x85) return CL_SPACE;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return CL_LETTER;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return CL_NUMBER;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        return CL_SPACE;
    default:
        return CL_OTHER;
    }
}

bool unicode_is_space(int32_t cp) {
    if (cp < 0x80) return cp >= 0 && ascii_class[cp] == CL_SPACE;
    return unicode_class(cp) == CL_SPACE;
}

// Class of the character at text[i]; sets *len to its byte length.
static inline int class_at(const uint8_t *text, size_t size, size_t i, int *len) {
    uint8_t b = text[i];
    if (b < 0x80) { *len = 1; return ascii_class[b]; }
    int32_t cp = utf8_decode(text + i, size - i, len);
    return cp < 0 ? CL_OTHER : unicode_class(cp);
}

// End of the run of characters of class cls starting at i.
static size_t run_end(const uint8_t *text, size_t size, size_t i, int cls) {
    while (i < size) {
        int len;
        if (class_at(text, size, i, &len) != cls) break;
        i += (size_t)len;
    }
    return i;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at pos, or 0.
static size_t contraction(const uint8_t *t, size_t size, size_t pos) {
    if (t[pos] != '\'' || pos + 1 >= size) return 0;
    uint8_t a = t[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= size) return 0;
    uint8_t b = t[pos + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

size_t pretok_gpt2_next(const uint8_t *text, size_t size, size_t pos) {
    size_t n = contraction(text, size, pos);
    if (n) return n;
    int len;
    int cls = class_at(text, size, pos, &len);
    if (text[pos] == ' ' && pos + 1 < size) {  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
        int len1;
        int next = class_at(text, size, pos + 1, &len1);
        if (next != CL_SPACE) return run_end(text, size, pos + 1 + (size_t)len1, next) - pos;
    }
    if (cls != CL_SPACE) return run_end(text, size, pos + (size_t)len, cls) - pos;
    // '\s+(?!\S)': the whitespace run, less its last character when a non-space follows, so that
    // character can lead the next word; '\s+' when that leaves nothing.
    size_t end = pos, last = pos;
    while (end < size) {
        int l;
        if (class_at(text, size, end, &l) != CL_SPACE) break;
        last = end;
        end += (size_t)l;
    }
    if (end == size || last == pos) return end - pos;
    return last - pos;
}
