// spm_bpe.c: the BPE encoder of SentencePiece models — normalized text split into characters
// (user-defined pieces whole, and never merged), then the adjacent pair whose concatenation is a
// piece of the highest score merged, again and again, as sentencepiece 0.2.3's bpe_model.cc does
// (docs/tokenizers.md, "SPMTokenizer"):
//   - candidates live in a heap ordered by score (a float), ties to the leftmost pair (the lower
//     symbol index); a candidate whose symbols changed since it was pushed is dropped when popped;
//   - the pieces merges may form are sentencepiece's pieces_ map: normal, user-defined and unused;
//   - an unused piece formed by a merge is split back into the pair that formed it — the pair
//     recorded last for that piece anywhere in the text, since sentencepiece keys that record by
//     the piece's string and writes it whenever it pushes a candidate, merged or not (a random
//     search over small models found no text where that differs from the pair merged in place);
//   - a symbol that is no piece is unknown: byte pieces with byte_fallback, else one unknown id
//     per run of unknown symbols.
// O(n log n) in the symbols of a text: each merge pushes at most two candidates.
#include <stdio.h>
#include <string.h>

#include "spm.h"
#include "tokenizer_internal.h"

// Words: when no piece holds the whitespace symbol after its start, no merge joins a symbol to one
// that starts with it, so the text before each whitespace symbol and the text from it on are
// merged apart, and the heap stays the size of a word (likewise before the end with whitespace as
// a suffix). The order of merges across words does not matter then: each word's merges keep their
// order. Unused pieces keep the whole text together (their split is recorded per text).
enum { CUT_NONE, CUT_BEFORE_SPACE, CUT_AFTER_SPACE };

// (left id, right id) -> the piece their concatenation is: open addressing, keys never 0 since
// ids are offset by one.
typedef struct pair_entry { uint64_t key; int32_t id; } pair_entry;

struct spm_bpe_model {
    unigram_model *pieces;  // the trie of the pieces sentencepiece matches (normal, user-defined, unused)
    pair_entry *pairs;
    uint64_t pairs_mask;
    float *scores;
    uint8_t *types;
    int32_t *unused_slot;  // per piece: its index among the unused pieces, -1 for others
    int32_t n_unused;
    int32_t n_pieces, unk_id;
    bool byte_fallback, has_user_symbols;
    bool user_first_byte[256];  // bytes a user-defined piece starts with: most positions skip the trie
    int cut;  // CUT_*: where the text falls into words no merge crosses
    char space[4];  // the normalizer's whitespace: U+2581, or a space when it does not escape
    size_t space_len;
    int32_t byte_ids[256];
    int32_t ascii_ids[128];  // one-byte pieces (-1 when none), the common case of a symbol's id
};

static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t)(uint32_t)(left + 1) << 32 | (uint32_t)(right + 1); }

static uint64_t pair_slot(const spm_bpe_model *b, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    uint64_t i = (h >> 29) & b->pairs_mask;
    while (b->pairs[i].key && b->pairs[i].key != key) i = (i + 1) & b->pairs_mask;
    return i;
}

static int32_t pair_lookup(const spm_bpe_model *b, int32_t left, int32_t right) {
    const pair_entry *e = &b->pairs[pair_slot(b, pair_key(left, right))];
    return e->key ? e->id : -1;
}

static int32_t piece_id(const spm_bpe_model *b, const uint8_t *s, size_t n) {
    if (n == 1 && s[0] < 128) return b->ascii_ids[s[0]];
    return unigram_piece_id(b->pieces, s, n);
}

// Every way a piece is the concatenation of two pieces gets an entry, so that a merge looks up
// two ids instead of hashing a string.
static void build_pairs(spm_bpe_model *b, const char *const *pieces) {
    size_t count = 0;
    for (int32_t id = 0; id < b->n_pieces; id++) count += strlen(pieces[id]);
    uint64_t cap = 1024;
    while (cap < count * 2) cap *= 2;
    b->pairs = neox_calloc(cap, sizeof *b->pairs);
    b->pairs_mask = cap - 1;
    for (int32_t id = 0; id < b->n_pieces; id++) {
        const uint8_t *s = (const uint8_t *)pieces[id];
        size_t n = strlen(pieces[id]);
        if (unigram_piece_id(b->pieces, s, n) != id) continue;  // control, unknown and byte pieces
        for (size_t cut = 1; cut < n; cut++) {
            int32_t left = unigram_piece_id(b->pieces, s, cut), right = unigram_piece_id(b->pieces, s + cut, n - cut);
            if (left < 0 || right < 0) continue;
            uint64_t key = pair_key(left, right);
            b->pairs[pair_slot(b, key)] = (pair_entry){key, id};
        }
    }
}

// Where the whitespace symbol occurs in pieces decides how texts may be cut into words.
static int cut_mode(const spm_bpe_model *b, const char *const *pieces) {
    if (b->n_unused) return CUT_NONE;
    bool only_first = true, only_last = true;
    for (int32_t id = 0; id < b->n_pieces; id++) {
        size_t n = strlen(pieces[id]);
        if (unigram_piece_id(b->pieces, (const uint8_t *)pieces[id], n) != id) continue;  // never merged
        for (const char *at = pieces[id]; (at = strstr(at, b->space)) != NULL; at += b->space_len) {
            if (at != pieces[id]) only_first = false;
            if (at + b->space_len != pieces[id] + n) only_last = false;
        }
    }
    return only_first ? CUT_BEFORE_SPACE : only_last ? CUT_AFTER_SPACE : CUT_NONE;
}

spm_bpe_model *spm_bpe_new(const char *const *pieces, const float *scores, const uint8_t *types, int32_t n,
                           int32_t unk_id, bool byte_fallback, bool escape_whitespaces) {
    spm_bpe_model *b = neox_calloc(1, sizeof *b);
    b->pieces = unigram_new(pieces, scores, types, n, unk_id, byte_fallback);
    b->scores = neox_malloc((size_t)n * sizeof *b->scores);
    b->types = neox_malloc((size_t)n);
    b->unused_slot = neox_malloc((size_t)n * sizeof *b->unused_slot);
    memcpy(b->scores, scores, (size_t)n * sizeof *scores);
    memcpy(b->types, types, (size_t)n);
    b->n_pieces = n, b->unk_id = unk_id, b->byte_fallback = byte_fallback;
    for (int32_t id = 0; id < n; id++) {
        b->unused_slot[id] = types[id] == SPM_PIECE_UNUSED ? b->n_unused++ : -1;
        if (types[id] == SPM_PIECE_USER_DEFINED) b->has_user_symbols = b->user_first_byte[(uint8_t)pieces[id][0]] = true;
    }
    for (int c = 0; c < 128; c++) {
        uint8_t ch = (uint8_t)c;
        b->ascii_ids[c] = unigram_piece_id(b->pieces, &ch, 1);
    }
    for (int i = 0; i < 256; i++) b->byte_ids[i] = unk_id;
    for (int32_t id = 0; id < n; id++) {
        unsigned v;
        int end = 0;
        if (types[id] == SPM_PIECE_BYTE && sscanf(pieces[id], "<0x%2X>%n", &v, &end) == 1 && end == 6 && !pieces[id][6])
            b->byte_ids[v] = id;
    }
    build_pairs(b, pieces);
    strcpy(b->space, escape_whitespaces ? "\xe2\x96\x81" : " ");
    b->space_len = strlen(b->space);
    b->cut = cut_mode(b, pieces);
    return b;
}

void spm_bpe_free(spm_bpe_model *b) {
    if (!b) return;
    unigram_free(b->pieces);
    free(b->pairs);
    free(b->scores);
    free(b->types);
    free(b->unused_slot);
    free(b);
}

const unigram_model *spm_bpe_user_symbols(const spm_bpe_model *b) { return b->has_user_symbols ? b->pieces : NULL; }

// A symbol: a span of the normalized text, linked to its neighbours; len 0 once merged into its left.
typedef struct symbol {
    uint32_t start, len;
    int32_t prev, next;
    int32_t id;  // the piece the span is, -1 for none
    bool frozen;  // a user-defined piece: never merged
} symbol;

// A candidate merge of symbols[left] with its right neighbour into piece `id` of `size` bytes.
typedef struct candidate { float score; int32_t left, id; uint32_t size; } candidate;

// The pair recorded for an unused piece: the spans it was formed from.
typedef struct unused_split { uint32_t left_start, left_len, right_start, right_len; } unused_split;

typedef struct bpe_state {
    const spm_bpe_model *b;
    const uint8_t *text;
    symbol *syms;
    candidate *heap;
    size_t n_heap, heap_cap;
    unused_split *splits;  // per unused piece, allocated when one is first pushed
    uint8_t *split_set;
} bpe_state;

// Whether a comes out of the heap before b: the higher score, then the leftmost.
static bool before(const candidate *a, const candidate *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(bpe_state *st, candidate c) {
    if (st->n_heap == st->heap_cap) {
        st->heap_cap = st->heap_cap ? st->heap_cap * 2 : 256;
        st->heap = neox_realloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    size_t i = st->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&c, &st->heap[parent])) break;
        st->heap[i] = st->heap[parent];
        i = parent;
    }
    st->heap[i] = c;
}

static candidate heap_pop(bpe_state *st) {
    candidate top = st->heap[0], last = st->heap[--st->n_heap];
    size_t i = 0, n = st->n_heap;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && before(&st->heap[child + 1], &st->heap[child])) child++;
        if (!before(&st->heap[child], &last)) break;
        st->heap[i] = st->heap[child];
        i = child;
    }
    if (n) st->heap[i] = last;
    return top;
}

// sentencepiece's MaybeAddNewSymbolPair: pushes the merge of symbols left and right when their
// concatenation is a piece.
static void maybe_push(bpe_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const symbol *l = &st->syms[left], *r = &st->syms[right];
    if (l->frozen || r->frozen) return;
    const spm_bpe_model *b = st->b;
    int32_t id = l->id >= 0 && r->id >= 0 ? pair_lookup(b, l->id, r->id)
                                          : unigram_piece_id(b->pieces, st->text + l->start, l->len + r->len);
    if (id < 0) return;
    heap_push(st, (candidate){b->scores[id], left, id, l->len + r->len});
    int32_t slot = b->unused_slot[id];
    if (slot < 0) return;
    if (!st->splits) {
        st->splits = neox_malloc((size_t)b->n_unused * sizeof *st->splits);
        st->split_set = neox_calloc((size_t)b->n_unused, 1);
    }
    st->splits[slot] = (unused_split){l->start, l->len, r->start, r->len};
    st->split_set[slot] = 1;
}

static void merge_all(bpe_state *st) {
    symbol *syms = st->syms;
    while (st->n_heap) {
        candidate top = heap_pop(st);
        symbol *l = &syms[top.left];
        // Stale: the left symbol was merged away or grew, or its right neighbour grew.
        if (l->len == 0 || l->next < 0 || l->len + syms[l->next].len != top.size) continue;
        symbol *r = &syms[l->next];
        l->len += r->len;
        l->id = top.id;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = top.left;
        r->len = 0;
        maybe_push(st, l->prev, top.left);
        maybe_push(st, top.left, l->next);
    }
}

static void push_id(int32_t **ids, size_t *len, size_t *cap, int32_t id) {
    if (*len == *cap) {
        *cap = *cap * 2 > 1024 ? *cap * 2 : 1024;
        *ids = neox_realloc(*ids, *cap * sizeof **ids);
    }
    (*ids)[(*len)++] = id;
}

typedef struct out_state { int32_t **ids; size_t *len, *cap; bool previous_unknown; } out_state;

// One output piece of the span: its bytes when unknown with byte fallback, nothing for the
// second unknown of a run, else its id.
static void emit(const bpe_state *st, out_state *o, uint32_t start, uint32_t len, int32_t id) {
    const spm_bpe_model *b = st->b;
    bool unknown = id < 0;
    if (unknown && b->byte_fallback) {
        for (uint32_t i = 0; i < len; i++) push_id(o->ids, o->len, o->cap, b->byte_ids[st->text[start + i]]);
    } else if (!(unknown && o->previous_unknown)) {
        push_id(o->ids, o->len, o->cap, unknown ? b->unk_id : id);
    }
    o->previous_unknown = unknown;
}

// sentencepiece's resegment: an unused piece is replaced by the pair recorded for it.
static void resegment(const bpe_state *st, out_state *o, uint32_t start, uint32_t len, int32_t id) {
    int32_t slot = id >= 0 ? st->b->unused_slot[id] : -1;
    if (slot < 0 || !st->split_set || !st->split_set[slot]) {  // a one-character unused piece stays
        emit(st, o, start, len, id);
        return;
    }
    unused_split s = st->splits[slot];
    resegment(st, o, s.left_start, s.left_len, piece_id(st->b, st->text + s.left_start, s.left_len));
    resegment(st, o, s.right_start, s.right_len, piece_id(st->b, st->text + s.right_start, s.right_len));
}

// UTF-8 length from the lead byte alone, as SentencePiece counts a character (never past the end).
static uint32_t char_len(const uint8_t *s, size_t left) {
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t len = by_high_nibble[s[0] >> 4];
    return (uint32_t)(len < left ? len : left);
}

// The characters of the text as symbols (user-defined pieces whole and frozen); returns the count.
static int32_t split_symbols(const spm_bpe_model *b, const uint8_t *s, size_t n, symbol *syms) {
    int32_t count = 0;
    for (size_t at = 0; at < n;) {
        size_t user = b->user_first_byte[s[at]] ? unigram_user_symbol_prefix(b->pieces, s + at, n - at) : 0;
        uint32_t len = user ? (uint32_t)user : char_len(s + at, n - at);
        syms[count] = (symbol){(uint32_t)at, len, count - 1, count + 1, piece_id(b, s + at, len), user != 0};
        count++;
        at += len;
    }
    syms[count - 1].next = -1;
    return count;
}

// Merges the symbols of one span of the text (a word, or all of it) and emits its pieces.
static void encode_span(bpe_state *st, out_state *o, size_t start, size_t n) {
    int32_t count = split_symbols(st->b, st->text + start, n, st->syms);
    for (int32_t i = 0; i < count; i++) st->syms[i].start += (uint32_t)start;
    st->n_heap = 0;
    for (int32_t i = 1; i < count; i++) maybe_push(st, i - 1, i);
    merge_all(st);
    for (int32_t i = 0; i >= 0; i = st->syms[i].next) resegment(st, o, st->syms[i].start, st->syms[i].len, st->syms[i].id);
}

// The end of the word that starts at `at`: before the next whitespace symbol after it, or after
// the next one from it on.
static size_t word_end(const spm_bpe_model *b, const uint8_t *s, size_t at, size_t n) {
    size_t from = b->cut == CUT_BEFORE_SPACE ? at + 1 : at;
    while (from < n) {
        const uint8_t *hit = memchr(s + from, b->space[0], n - from);
        if (!hit) break;
        size_t pos = (size_t)(hit - s);
        if (pos + b->space_len <= n && !memcmp(hit, b->space, b->space_len))
            return b->cut == CUT_BEFORE_SPACE ? pos : pos + b->space_len;
        from = pos + 1;
    }
    return n;
}

void spm_bpe_encode(const spm_bpe_model *b, const char *normalized, size_t n, int32_t **ids, size_t *len,
                    size_t *cap) {
    if (n == 0) return;
    bpe_state st = {.b = b, .text = (const uint8_t *)normalized};
    st.syms = neox_malloc(n * sizeof *st.syms);
    out_state o = {ids, len, cap, false};
    if (b->cut == CUT_NONE) {
        encode_span(&st, &o, 0, n);
    } else {
        for (size_t at = 0; at < n;) {
            size_t end = word_end(b, st.text, at, n);
            encode_span(&st, &o, at, end - at);
            at = end;
        }
    }
    free(st.syms);
    free(st.heap);
    free(st.splits);
    free(st.split_set);
}
