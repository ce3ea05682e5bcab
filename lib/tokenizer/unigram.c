// unigram.c: the unigram lattice of SentencePiece models — the best segmentation of normalized
// text into pieces, with sentencepiece 0.2.3's exact arithmetic, so that ties and near-ties fall
// as they fall in PyPI's sentencepiece (docs/tokenizers.md, "SPMTokenizer"):
//   - path scores are floats, and every candidate is a float sum (best + piece score);
//   - a candidate replaces the best path ending at a position only when strictly greater, and
//     candidates come by start position, then by length: on a tie the earlier start wins;
//   - a user-defined piece of n bytes scores (float)((n - 1) * 0.1) (a double product);
//   - a position that no one-character piece covers gets an unknown node scoring the lowest
//     normal score minus 10;
//   - when the best score at a start leaves [-1e5, 1e5], it is subtracted from every path
//     reached so far (and becomes 0), which changes the rounding of the sums after it.
// Unknown pieces then become byte pieces (byte fallback) or merge into one unknown id per run.
#include <stdio.h>
#include <string.h>

#include "spm.h"
#include "tokenizer_internal.h"

#define UNKNOWN_PENALTY 10.0f
#define REBASE_LIMIT 1e5f

// A trie over piece bytes: each node's transitions live in one open-addressing hash table keyed
// by (node, byte), which keeps the build short and a step one probe on average.
typedef struct trie_edge { uint32_t key; int32_t child; } trie_edge;  // key: node << 8 | byte

struct unigram_model {
    int32_t *node_piece;  // per trie node: the piece id ending there, -1 for none
    int32_t n_nodes, nodes_cap;
    trie_edge *edges;
    uint32_t edges_mask;  // capacity - 1 (a power of two)
    uint32_t n_edges;
    float *scores;        // per piece
    uint8_t *types;       // per piece (SPM_PIECE_*)
    int32_t n_pieces;
    int32_t unk_id;
    float unk_score;
    bool byte_fallback;
    int32_t byte_ids[256];  // the <0xXX> pieces (unk_id where absent)
};

static uint32_t edge_slot(const unigram_model *u, uint32_t key) {
    uint32_t h = key * 2654435761u;
    uint32_t i = (h ^ (h >> 15)) & u->edges_mask;
    while (u->edges[i].child >= 0 && u->edges[i].key != key) i = (i + 1) & u->edges_mask;
    return i;
}

static int32_t trie_step(const unigram_model *u, int32_t node, uint8_t byte) {
    return u->edges[edge_slot(u, (uint32_t)node << 8 | byte)].child;
}

static void grow_edges(unigram_model *u) {
    trie_edge *old = u->edges;
    uint32_t old_cap = u->edges ? u->edges_mask + 1 : 0;
    uint32_t cap = old_cap ? old_cap * 2 : 1024;
    u->edges = neox_malloc(cap * sizeof *u->edges);
    for (uint32_t i = 0; i < cap; i++) u->edges[i].child = -1;
    u->edges_mask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].child >= 0) u->edges[edge_slot(u, old[i].key)] = old[i];
    free(old);
}

static int32_t new_node(unigram_model *u) {
    if (u->n_nodes == u->nodes_cap) {
        u->nodes_cap = u->nodes_cap ? u->nodes_cap * 2 : 1024;
        u->node_piece = neox_realloc(u->node_piece, (size_t)u->nodes_cap * sizeof *u->node_piece);
    }
    u->node_piece[u->n_nodes] = -1;
    return u->n_nodes++;
}

static void trie_insert(unigram_model *u, const char *piece, size_t len, int32_t id) {
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        if (u->n_edges * 2 >= u->edges_mask + 1) grow_edges(u);
        uint32_t key = (uint32_t)node << 8 | (uint8_t)piece[i];
        uint32_t slot = edge_slot(u, key);
        if (u->edges[slot].child < 0) {
            int32_t child = new_node(u);
            u->edges[slot] = (trie_edge){key, child};
            u->n_edges++;
        }
        node = u->edges[slot].child;
    }
    // SentencePiece refuses duplicate pieces when it loads the model, so a node ends one piece.
    u->node_piece[node] = id;
}

unigram_model *unigram_new(const char *const *pieces, const float *scores, const uint8_t *types, int32_t n,
                           int32_t unk_id, bool byte_fallback) {
    unigram_model *u = neox_calloc(1, sizeof *u);
    u->scores = neox_malloc((size_t)n * sizeof *u->scores);
    u->types = neox_malloc((size_t)n * sizeof *u->types);
    memcpy(u->scores, scores, (size_t)n * sizeof *scores);
    memcpy(u->types, types, (size_t)n);
    u->n_pieces = n, u->unk_id = unk_id, u->byte_fallback = byte_fallback;
    grow_edges(u);
    new_node(u);  // the root
    float min_score = 3.402823466e+38f;
    for (int32_t id = 0; id < n; id++) {
        if (types[id] == SPM_PIECE_NORMAL && scores[id] < min_score) min_score = scores[id];
        // Only these kinds are matched in text; unused pieces are found but never chosen.
        if (types[id] == SPM_PIECE_NORMAL || types[id] == SPM_PIECE_USER_DEFINED || types[id] == SPM_PIECE_UNUSED)
            trie_insert(u, pieces[id], strlen(pieces[id]), id);
    }
    u->unk_score = min_score - UNKNOWN_PENALTY;
    for (int b = 0; b < 256; b++) u->byte_ids[b] = unk_id;
    for (int32_t id = 0; id < n; id++) {
        unsigned b;
        if (types[id] == SPM_PIECE_BYTE && sscanf(pieces[id], "<0x%02X>", &b) == 1 && b < 256) u->byte_ids[b] = id;
    }
    return u;
}

void unigram_free(unigram_model *u) {
    if (!u) return;
    free(u->node_piece);
    free(u->edges);
    free(u->scores);
    free(u->types);
    free(u);
}

// The best path ending at a byte position: its last piece, where that piece starts, its score.
typedef struct best_end { int32_t id, start; float score; } best_end;

// UTF-8 length from the lead byte alone, as SentencePiece counts a character (never past the end).
static size_t char_len(const uint8_t *s, size_t left) {
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t len = by_high_nibble[s[0] >> 4];
    return len < left ? len : left;
}

static void offer(best_end *target, int32_t id, int32_t start, float score) {
    if (target->start < 0 || score > target->score) *target = (best_end){id, start, score};
}

// Keeps the scores of long texts near zero as 0.2.3 does: subtracts the score at `start` from
// every path reached from start up to `reached`.
static float rebase(best_end *best, size_t start, size_t reached, float base) {
    for (size_t p = start; p <= reached; p++)
        if (p == start || best[p].start >= 0) best[p].score = best[p].score - base;
    return 0.0f;
}

static void viterbi(const unigram_model *u, const uint8_t *s, size_t n, best_end *best) {
    for (size_t p = 0; p <= n; p++) best[p] = (best_end){-1, -1, 0.0f};
    size_t reached = 0;
    for (size_t start = 0; start < n;) {
        float base = best[start].score;
        if (base < -REBASE_LIMIT || base > REBASE_LIMIT) base = rebase(best, start, reached, base);
        size_t mblen = char_len(s + start, n - start);
        bool has_single = false;
        int32_t node = 0;
        for (size_t end = start; end < n;) {
            node = trie_step(u, node, s[end++]);
            if (node < 0) break;
            int32_t id = u->node_piece[node];
            if (id < 0 || u->types[id] == SPM_PIECE_UNUSED) continue;
            size_t len = end - start;
            float score = u->types[id] == SPM_PIECE_USER_DEFINED ? (float)((double)(int)(len - 1) * 0.1)
                                                                 : u->scores[id];
            offer(&best[end], id, (int32_t)start, score + base);
            if (end > reached) reached = end;
            if (len == mblen) has_single = true;
        }
        if (!has_single) {
            offer(&best[start + mblen], u->unk_id, (int32_t)start, u->unk_score + base);
            if (start + mblen > reached) reached = start + mblen;
        }
        start += mblen;
    }
}

size_t unigram_user_symbol_prefix(const unigram_model *u, const uint8_t *s, size_t n) {
    size_t longest = 0;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        node = trie_step(u, node, s[i]);
        if (node < 0) break;
        int32_t id = u->node_piece[node];
        if (id >= 0 && u->types[id] == SPM_PIECE_USER_DEFINED) longest = i + 1;
    }
    return longest;
}

int32_t unigram_piece_id(const unigram_model *u, const uint8_t *s, size_t n) {
    int32_t node = 0;
    for (size_t i = 0; i < n && node >= 0; i++) node = trie_step(u, node, s[i]);
    return node >= 0 ? u->node_piece[node] : -1;
}

static void push(int32_t **ids, size_t *len, size_t *cap, int32_t id) {
    if (*len == *cap) {
        *cap = *cap * 2 > 1024 ? *cap * 2 : 1024;
        *ids = neox_realloc(*ids, *cap * sizeof **ids);
    }
    (*ids)[(*len)++] = id;
}

void unigram_encode(const unigram_model *u, const char *normalized, size_t n, int32_t **ids, size_t *len,
                    size_t *cap) {
    if (n == 0) return;
    const uint8_t *s = (const uint8_t *)normalized;
    best_end *best = neox_malloc((n + 1) * sizeof *best);
    viterbi(u, s, n, best);
    // The path backwards: piece start positions, then forwards.
    size_t count = 0;
    for (size_t end = n; end > 0; end = (size_t)best[end].start) count++;
    size_t *starts = neox_malloc(count * sizeof *starts);
    size_t k = count;
    for (size_t end = n; end > 0; end = (size_t)best[end].start) starts[--k] = (size_t)best[end].start;
    bool previous_unknown = false;
    for (size_t i = 0; i < count; i++) {
        size_t start = starts[i], end = i + 1 < count ? starts[i + 1] : n;
        int32_t id = best[end].id;
        bool unknown = id == u->unk_id;
        if (unknown && u->byte_fallback) {
            for (size_t b = start; b < end; b++) push(ids, len, cap, u->byte_ids[s[b]]);
        } else if (!(unknown && previous_unknown)) {
            push(ids, len, cap, id);  // a run of unknown pieces is one unknown id
        }
        previous_unknown = unknown;
    }
    free(starts);
    free(best);
}
