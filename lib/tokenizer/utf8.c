// utf8.c: UTF-8 decoding with the Unicode "maximal subpart" rule for invalid bytes, so that
// replacing them with U+FFFD gives exactly what Python's bytes.decode('utf-8', 'replace') and
// Rust's String::from_utf8_lossy give (the strings HF tokenizers would receive).
#include <string.h>

#include "tokenizer_internal.h"

// Second-byte range of a well-formed sequence, by lead byte (Unicode Table 3-7).
static int lead_info(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b == 0xE0) { *lo = 0xA0; return 3; }
    if (b >= 0xE1 && b <= 0xEC) return 3;
    if (b == 0xED) { *hi = 0x9F; return 3; }
    if (b >= 0xEE && b <= 0xEF) return 3;
    if (b == 0xF0) { *lo = 0x90; return 4; }
    if (b >= 0xF1 && b <= 0xF3) return 4;
    if (b == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

int32_t utf8_decode(const uint8_t *s, size_t n, int *len) {
    uint8_t b = s[0];
    if (b < 0x80) { *len = 1; return b; }
    uint8_t lo, hi;
    int need = lead_info(b, &lo, &hi);
    if (!need) { *len = 1; return -1; }
    int32_t cp = b & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) { *len = i; return -1; }
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) { *len = i; return -1; }
        cp = (cp << 6) | (c & 0x3F);
    }
    *len = need;
    return cp;
}

size_t utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        // Eight ASCII bytes at a time: the common case.
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) { i++; continue; }
        int len;
        if (utf8_decode(s + i, n - i, &len) < 0) return i;
        i += len;
    }
    return n;
}

int utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

char *utf8_replace_invalid(const uint8_t *s, size_t n, size_t *out_size) {
    // Each invalid byte becomes at most 3 bytes (U+FFFD).
    char *out = neox_malloc(n * 3 + 1);
    size_t o = 0, i = 0;
    while (i < n) {
        size_t valid = utf8_valid_prefix(s + i, n - i);
        memcpy(out + o, s + i, valid);
        o += valid, i += valid;
        if (i >= n) break;
        int len;
        utf8_decode(s + i, n - i, &len);
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3, i += (size_t)len;
    }
    out[o] = 0;
    *out_size = o;
    return out;
}

char *tok_bytes_dup(const char *s, size_t n) {
    char *d = neox_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}
