// strmap.c: an open-addressing hash table from byte strings to int32 values, with the keys kept
// in one arena. Used for vocabularies (token text -> id) while loading and for BPE lookups.
#include <string.h>

#include "tokenizer_internal.h"

uint64_t tok_hash(const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xFF51AFD7ED558CCDull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8, len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

void strmap_init(strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t n = 16;
    while (n < expected * 2) n <<= 1;
    m->slots = neox_calloc(n, sizeof *m->slots);
    m->mask = n - 1;
}

void strmap_free(strmap *m) {
    free(m->slots);
    free(m->entries);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static void strmap_grow(strmap *m) {
    size_t n = (m->mask + 1) * 2;
    uint32_t *slots = neox_calloc(n, sizeof *slots);
    for (size_t e = 0; e < m->count; e++) {
        size_t i = m->entries[e].hash & (n - 1);
        while (slots[i]) i = (i + 1) & (n - 1);
        slots[i] = (uint32_t)e + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = n - 1;
}

int32_t strmap_get(const strmap *m, const void *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = tok_hash(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (!s) return -1;
        const struct strmap_entry *e = &m->entries[s - 1];
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) return e->value;
    }
}

int strmap_put(strmap *m, const void *key, size_t len, int32_t value) {
    if ((m->count + 1) * 2 > m->mask + 1) strmap_grow(m);
    uint64_t h = tok_hash(key, len);
    size_t i = h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (!s) break;
        const struct strmap_entry *e = &m->entries[s - 1];
        if (e->hash == h && e->len == len && !memcmp(m->arena + e->off, key, len)) return 1;
    }
    if (m->count == m->entries_cap) {
        m->entries_cap = m->entries_cap ? m->entries_cap * 2 : 64;
        m->entries = neox_realloc(m->entries, m->entries_cap * sizeof *m->entries);
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        m->arena_cap = (m->arena_len + len + 1) * 2;
        m->arena = neox_realloc(m->arena, m->arena_cap);
    }
    memcpy(m->arena + m->arena_len, key, len);
    m->arena[m->arena_len + len] = 0;
    m->entries[m->count] = (struct strmap_entry){h, (uint32_t)m->arena_len, (uint32_t)len, value};
    m->arena_len += len + 1;
    m->slots[i] = (uint32_t)++m->count;
    return 0;
}
