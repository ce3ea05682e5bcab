// bpe.c: the BPE model — merges ranked by their order in the file, applied to one pre-tokenized
// word at a time exactly as HF tokenizers does: start from one symbol per byte (byte-level
// vocabularies) or per character (with byte_fallback, unk fusing and the subword affixes), then repeatedly
// merge the adjacent pair of lowest rank (leftmost on ties). Candidate pairs sit in a binary heap
// and stale entries are skipped when popped, so a word of n bytes costs O(n log n), never a
// rescan per merge. Results are kept in a bounded per-thread cache of word encodings, so encode
// takes no lock, and all scratch memory is per-thread and reused (no allocation per token).
#include <pthread.h>
#include <string.h>

#include "tokenizer_internal.h"

// ---------------------------------------------------------------------------------------------
// Merge table.
static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t)(uint32_t)left << 32 | (uint32_t)right; }

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

void bpe_init(bpe_model *m, size_t vocab_hint) {
    memset(m, 0, sizeof *m);
    strmap_init(&m->vocab, vocab_hint);
    m->merges_mask = 1024 - 1;
    m->merges = neox_malloc((m->merges_mask + 1) * sizeof *m->merges);
    for (size_t i = 0; i <= m->merges_mask; i++) m->merges[i].rank = -1;
    m->unk_id = -1;
}

void bpe_free(bpe_model *m) {
    strmap_free(&m->vocab);
    free(m->merges);
    free(m->continuing_subword_prefix);
    free(m->end_of_word_suffix);
    memset(m, 0, sizeof *m);
}

static const bpe_merge_entry *merge_find(const bpe_model *m, int32_t left, int32_t right) {
    uint64_t key = pair_key(left, right);
    for (size_t i = mix64(key) & m->merges_mask;; i = (i + 1) & m->merges_mask) {
        const bpe_merge_entry *e = &m->merges[i];
        if (e->rank < 0) return NULL;
        if (e->key == key) return e;
    }
}

static void merges_grow(bpe_model *m) {
    size_t n = (m->merges_mask + 1) * 2;
    bpe_merge_entry *t = neox_malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i].rank = -1;
    for (size_t j = 0; j <= m->merges_mask; j++) {
        if (m->merges[j].rank < 0) continue;
        size_t i = mix64(m->merges[j].key) & (n - 1);
        while (t[i].rank >= 0) i = (i + 1) & (n - 1);
        t[i] = m->merges[j];
    }
    free(m->merges);
    m->merges = t;
    m->merges_mask = n - 1;
}

int bpe_add_merge(bpe_model *m, int32_t left, int32_t right, int32_t new_id, int32_t rank) {
    if ((m->n_merges + 1) * 2 > m->merges_mask + 1) merges_grow(m);
    uint64_t key = pair_key(left, right);
    size_t i = mix64(key) & m->merges_mask;
    for (; m->merges[i].rank >= 0; i = (i + 1) & m->merges_mask) {
        if (m->merges[i].key == key) {
            m->merges[i].rank = rank;
            m->merges[i].new_id = new_id;
            return 1;
        }
    }
    m->merges[i] = (bpe_merge_entry){key, rank, new_id};
    m->n_merges++;
    return 0;
}

void bpe_finish(bpe_model *m) {
    static uint64_t next_uid;
    for (int b = 0; b < 256; b++) {
        char text[8];
        size_t len = 0, cap = sizeof text;
        char *buf = text;
        uint8_t byte = (uint8_t)b;
        // bytelevel_encode may grow the buffer; 8 bytes always suffice for one char.
        bytelevel_encode(&byte, 1, &buf, &len, &cap);
        m->byte_id[b] = strmap_get(&m->vocab, text, len);
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);  // HF's format!("<{b:#04X}>")
        m->fallback_id[b] = strmap_get(&m->vocab, code, strlen(code));
    }
    m->uid = __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
}

// ---------------------------------------------------------------------------------------------
// Per-thread scratch and word cache.
#define CACHE_SLOTS (1u << 15)        // open addressing; cleared when 3/4 full
#define CACHE_MAX_WORD 128            // longer words are rare and not worth caching
#define CACHE_KEY_BYTES (1u << 20)
#define CACHE_IDS (1u << 18)
#define CACHES_PER_THREAD 4           // a thread may alternate between a few tokenizers

typedef struct cache_slot { uint64_t hash; uint32_t key_off, ids_off; uint16_t key_len, ids_len; } cache_slot;

typedef struct word_cache {
    uint64_t owner;                   // bpe_model.uid, 0 when unused
    uint64_t last_use;
    cache_slot *slots;
    size_t used;
    uint8_t *keys;
    size_t keys_len;
    int32_t *ids;
    size_t ids_len;
} word_cache;

typedef struct bpe_symbol { int32_t id, prev, next, len; } bpe_symbol;
typedef struct bpe_candidate { int32_t rank, pos, new_id; } bpe_candidate;

typedef struct bpe_thread_state {
    word_cache caches[CACHES_PER_THREAD];
    uint64_t clock;
    bpe_symbol *symbols;
    bpe_candidate *heap;
    size_t symbols_cap, heap_cap;
} bpe_thread_state;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
static _Thread_local bpe_thread_state *thread_state;

static void state_destroy(void *p) {
    bpe_thread_state *s = p;
    for (int i = 0; i < CACHES_PER_THREAD; i++) {
        free(s->caches[i].slots);
        free(s->caches[i].keys);
        free(s->caches[i].ids);
    }
    free(s->symbols);
    free(s->heap);
    free(s);
}

static void state_key_create(void) { pthread_key_create(&state_key, state_destroy); }

static bpe_thread_state *get_thread_state(void) {
    if (thread_state) return thread_state;
    pthread_once(&state_once, state_key_create);
    thread_state = neox_calloc(1, sizeof *thread_state);
    pthread_setspecific(state_key, thread_state);
    return thread_state;
}

static void cache_clear(word_cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->used = c->keys_len = c->ids_len = 0;
}

static word_cache *cache_for(bpe_thread_state *s, uint64_t owner) {
    word_cache *lru = &s->caches[0];
    s->clock++;
    for (int i = 0; i < CACHES_PER_THREAD; i++) {
        word_cache *c = &s->caches[i];
        if (c->owner == owner) { c->last_use = s->clock; return c; }
        if (c->last_use < lru->last_use) lru = c;
    }
    if (!lru->slots) {
        lru->slots = neox_malloc(CACHE_SLOTS * sizeof *lru->slots);
        lru->keys = neox_malloc(CACHE_KEY_BYTES);
        lru->ids = neox_malloc(CACHE_IDS * sizeof *lru->ids);
    }
    cache_clear(lru);
    lru->owner = owner;
    lru->last_use = s->clock;
    return lru;
}

// Slot of the word (ids_len == 0 and hash == 0 when absent; then *free_slot is where to insert).
static const cache_slot *cache_lookup(const word_cache *c, uint64_t h, const uint8_t *word, size_t len,
                                      size_t *free_slot) {
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *s = &c->slots[i];
        if (!s->ids_len) { *free_slot = i; return NULL; }
        if (s->hash == h && s->key_len == len && !memcmp(c->keys + s->key_off, word, len)) return s;
    }
}

static void cache_insert(word_cache *c, size_t slot, uint64_t h, const uint8_t *word, size_t len,
                         const int32_t *ids, size_t n) {
    if (n == 0 || n > UINT16_MAX) return;
    if (c->used + 1 > CACHE_SLOTS / 4 * 3 || c->keys_len + len > CACHE_KEY_BYTES || c->ids_len + n > CACHE_IDS) {
        cache_clear(c);
        cache_lookup(c, h, word, len, &slot);
    }
    memcpy(c->keys + c->keys_len, word, len);
    memcpy(c->ids + c->ids_len, ids, n * sizeof *ids);
    c->slots[slot] = (cache_slot){h, (uint32_t)c->keys_len, (uint32_t)c->ids_len, (uint16_t)len, (uint16_t)n};
    c->keys_len += len, c->ids_len += n, c->used++;
}

// ---------------------------------------------------------------------------------------------
// Merging.
static void heap_push(bpe_candidate *heap, size_t *n, bpe_candidate c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        const bpe_candidate *p = &heap[parent];
        if (p->rank < c.rank || (p->rank == c.rank && p->pos < c.pos)) break;
        heap[i] = *p;
        i = parent;
    }
    heap[i] = c;
}

static bpe_candidate heap_pop(bpe_candidate *heap, size_t *n) {
    bpe_candidate top = heap[0], last = heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && (heap[child + 1].rank < heap[child].rank ||
                               (heap[child + 1].rank == heap[child].rank && heap[child + 1].pos < heap[child].pos)))
            child++;
        if (last.rank < heap[child].rank || (last.rank == heap[child].rank && last.pos < heap[child].pos)) break;
        heap[i] = heap[child];
        i = child;
    }
    heap[i] = last;
    return top;
}

static void push_pair(const bpe_model *m, const bpe_symbol *sym, int32_t pos, bpe_candidate *heap, size_t *n) {
    int32_t next = sym[pos].next;
    if (next < 0) return;
    const bpe_merge_entry *e = merge_find(m, sym[pos].id, sym[next].id);
    if (e) heap_push(heap, n, (bpe_candidate){e->rank, pos, e->new_id});
}

static void add_symbol(bpe_symbol *sym, int32_t *n, int32_t id) {
    sym[*n] = (bpe_symbol){id, *n - 1, -1, 1};
    if (*n > 0) sym[*n - 1].next = *n;
    (*n)++;
}

// One symbol per byte (byte-level vocabularies).
static int32_t init_byte_symbols(const bpe_model *m, const uint8_t *word, size_t len, bpe_symbol *sym) {
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = m->byte_id[word[i]];
        if (id < 0) {
            if (m->unk_id < 0) continue;  // HF drops bytes the vocabulary lacks when there is no unk token
            if (m->fuse_unk && n > 0 && sym[n - 1].id == m->unk_id) continue;
            id = m->unk_id;
        }
        add_symbol(sym, &n, id);
    }
    return n;
}

// The id of one character of a word as HF's BPE looks it up: with continuing_subword_prefix
// unless it is the first, end_of_word_suffix when it is the last; -1 when absent.
static int32_t char_id(const bpe_model *m, const uint8_t *c, size_t clen, bool first, bool last, char *buf,
                       size_t *blen) {
    size_t n = 0;
    if (!first && m->prefix_len) memcpy(buf, m->continuing_subword_prefix, m->prefix_len), n = m->prefix_len;
    memcpy(buf + n, c, clen), n += clen;
    if (last && m->suffix_len) memcpy(buf + n, m->end_of_word_suffix, m->suffix_len), n += m->suffix_len;
    *blen = n;
    return strmap_get(&m->vocab, buf, n);
}

// One symbol per character (HF's BPE::merge_word): a character missing from the vocabulary becomes
// its <0xXX> byte tokens (byte_fallback, when all exist), else the unknown token (runs of unknowns
// fused into one with fuse_unk), else it is dropped.
static int32_t init_char_symbols(const bpe_model *m, const uint8_t *word, size_t len, bpe_symbol *sym) {
    int32_t n = 0;
    bool pending_unk = false;
    char small[64];
    size_t cap = m->prefix_len + m->suffix_len + 4;
    char *buf = cap <= sizeof small ? small : neox_malloc(cap);
    for (size_t i = 0; i < len;) {
        int clen;
        if (utf8_decode(word + i, len - i, &clen) < 0) clen = 1;  // cannot happen: the text is valid UTF-8
        size_t blen;
        int32_t id = char_id(m, word + i, (size_t)clen, i == 0, i + (size_t)clen == len, buf, &blen);
        i += (size_t)clen;
        if (id >= 0) {
            if (pending_unk) add_symbol(sym, &n, m->unk_id), pending_unk = false;
            add_symbol(sym, &n, id);
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < blen; k++) all = all && m->fallback_id[(uint8_t)buf[k]] >= 0;
            if (all) {
                // HF adds the byte tokens without flushing a pending unknown first.
                for (size_t k = 0; k < blen; k++) add_symbol(sym, &n, m->fallback_id[(uint8_t)buf[k]]);
                continue;
            }
        }
        if (m->unk_id < 0) continue;
        if (pending_unk && !m->fuse_unk) add_symbol(sym, &n, m->unk_id);
        pending_unk = true;
    }
    if (pending_unk) add_symbol(sym, &n, m->unk_id);
    if (buf != small) free(buf);
    return n;
}

// The most symbols a word of len bytes can start as: with byte_fallback every byte of every
// character (and of its prefix / suffix) may become one.
static size_t bpe_max_symbols(const bpe_model *m, size_t len) {
    return m->byte_level ? len : len * (1 + m->prefix_len) + m->suffix_len;
}

// Merges the word's symbols; writes the resulting ids to out (room for bpe_max_symbols). Returns the count.
static size_t merge_word(const bpe_model *m, bpe_thread_state *st, const uint8_t *word, size_t len, int32_t *out) {
    size_t most = bpe_max_symbols(m, len);
    if (st->symbols_cap < most) {
        st->symbols_cap = most * 2;
        st->symbols = neox_realloc(st->symbols, st->symbols_cap * sizeof *st->symbols);
        st->heap_cap = most * 4;
        st->heap = neox_realloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    bpe_symbol *sym = st->symbols;
    int32_t n = m->byte_level ? init_byte_symbols(m, word, len, sym) : init_char_symbols(m, word, len, sym);
    size_t heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(m, sym, i, st->heap, &heap_n);
    while (heap_n) {
        // Each merge pushes at most two candidates, and there are fewer than n merges.
        bpe_candidate top = heap_pop(st->heap, &heap_n);
        bpe_symbol *a = &sym[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        bpe_symbol *b = &sym[a->next];
        const bpe_merge_entry *e = merge_find(m, a->id, b->id);
        if (!e || e->new_id != top.new_id) continue;  // stale: the pair changed since it was pushed
        a->id = top.new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) sym[a->next].prev = top.pos;
        if (a->prev >= 0) push_pair(m, sym, a->prev, st->heap, &heap_n);
        push_pair(m, sym, top.pos, st->heap, &heap_n);
    }
    size_t count = 0;
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out[count++] = sym[i].id;
    return count;
}

static void reserve_ids(int32_t **ids, size_t *n, size_t *cap, size_t more) {
    if (*n + more <= *cap) return;
    *cap = (*n + more) * 2 > 1024 ? (*n + more) * 2 : 1024;
    *ids = neox_realloc(*ids, *cap * sizeof **ids);
}

void bpe_encode_word(const bpe_model *m, const uint8_t *word, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    if (len == 0) return;
    if (len == 1 && m->byte_level && m->byte_id[word[0]] >= 0) {
        reserve_ids(ids, n, cap, 1);
        (*ids)[(*n)++] = m->byte_id[word[0]];
        return;
    }
    bpe_thread_state *st = get_thread_state();
    word_cache *c = NULL;
    uint64_t h = 0;
    size_t slot = 0;
    if (len <= CACHE_MAX_WORD) {
        c = cache_for(st, m->uid);
        h = tok_hash(word, len);
        const cache_slot *s = cache_lookup(c, h, word, len, &slot);
        if (s) {
            reserve_ids(ids, n, cap, s->ids_len);
            memcpy(*ids + *n, c->ids + s->ids_off, s->ids_len * sizeof **ids);
            *n += s->ids_len;
            return;
        }
    }
    reserve_ids(ids, n, cap, bpe_max_symbols(m, len));
    size_t count;
    int32_t whole = m->ignore_merges ? bpe_lookup_word(m, word, len) : -1;
    if (whole >= 0) {
        (*ids)[*n] = whole;
        count = 1;
    } else {
        count = merge_word(m, st, word, len, *ids + *n);
    }
    if (c) cache_insert(c, slot, h, word, len, *ids + *n, count);
    *n += count;
}

int32_t bpe_lookup_word(const bpe_model *m, const uint8_t *word, size_t len) {
    if (!m->byte_level) return strmap_get(&m->vocab, word, len);
    char small[512];
    char *buf = small;
    size_t blen = 0, cap = sizeof small;
    if (len * 2 + 1 > cap) buf = neox_malloc(cap = len * 2 + 1);  // each byte is at most 2 UTF-8 bytes
    bytelevel_encode(word, len, &buf, &blen, &cap);
    int32_t id = strmap_get(&m->vocab, buf, blen);
    if (buf != small) free(buf);
    return id;
}
