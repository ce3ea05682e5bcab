// bytelevel.c: GPT-2's byte-level alphabet. Vocabulary files store tokens as text in which every
// byte is one printable code point: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
// themselves, the remaining 68 bytes map to U+0100, U+0101, ... in byte order (space -> 'Ġ').
#include <string.h>

#include "tokenizer_internal.h"

static int is_self_mapped(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bytelevel_char_of_byte(uint8_t b) {
    if (is_self_mapped(b)) return b;
    unsigned n = 0;  // how many non-self-mapped bytes precede b
    for (unsigned x = 0; x < b; x++) n += !is_self_mapped(x);
    return 256 + n;
}

int bytelevel_byte_of_char(uint32_t cp) {
    if (cp < 256) return is_self_mapped(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned n = cp - 256;
    for (unsigned x = 0; x < 256; x++)
        if (!is_self_mapped(x) && n-- == 0) return (int)x;
    return -1;
}

// Tables built once; both directions are hot in loading and decoding.
static int16_t byte_of_char_table[256 + 68];
static char char_utf8[256][3];
static uint8_t char_utf8_len[256];
static int tables_ready;

static void build_tables(void) {
    if (__atomic_load_n(&tables_ready, __ATOMIC_ACQUIRE)) return;
    for (uint32_t cp = 0; cp < 256 + 68; cp++) byte_of_char_table[cp] = (int16_t)bytelevel_byte_of_char(cp);
    for (unsigned b = 0; b < 256; b++) {
        char tmp[4];
        char_utf8_len[b] = (uint8_t)utf8_encode(bytelevel_char_of_byte((uint8_t)b), tmp);
        memcpy(char_utf8[b], tmp, char_utf8_len[b]);
    }
    __atomic_store_n(&tables_ready, 1, __ATOMIC_RELEASE);
}

long bytelevel_decode(const char *text, size_t size, uint8_t *out) {
    build_tables();
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    long o = 0;
    while (i < size) {
        int len;
        int32_t cp = utf8_decode(s + i, size - i, &len);
        if (cp < 0 || cp >= 256 + 68 || byte_of_char_table[cp] < 0) return -1;
        out[o++] = (uint8_t)byte_of_char_table[cp];
        i += (size_t)len;
    }
    return o;
}

void bytelevel_encode(const uint8_t *bytes, size_t size, char **buf, size_t *len, size_t *cap) {
    build_tables();
    if (*len + size * 2 + 1 > *cap) {
        *cap = (*len + size * 2 + 1) * 2;
        *buf = neox_realloc(*buf, *cap);
    }
    for (size_t i = 0; i < size; i++) {
        memcpy(*buf + *len, char_utf8[bytes[i]], char_utf8_len[bytes[i]]);
        *len += char_utf8_len[bytes[i]];
    }
    (*buf)[*len] = 0;
}
