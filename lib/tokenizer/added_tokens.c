// added_tokens.c: matching added tokens (HF's AddedVocabulary) in text: a byte trie over their
// contents, scanned for the leftmost match and, at that position, the longest one — the
// LeftmostLongest rule of the Aho-Corasick automaton HF builds. Only positions whose byte can
// start a token are tried, so text without such bytes is passed over quickly.
#include <string.h>

#include "tokenizer_internal.h"

void added_matcher_init(added_matcher *m) {
    memset(m, 0, sizeof *m);
    m->cap = 16;
    m->nodes = neox_malloc(m->cap * sizeof *m->nodes);
    m->nodes[0] = (struct trie_node){-1, -1, -1, 0};
    m->n_nodes = 1;
}

void added_matcher_free(added_matcher *m) {
    free(m->nodes);
    memset(m, 0, sizeof *m);
}

static int32_t child_of(const added_matcher *m, int32_t node, uint8_t byte) {
    for (int32_t c = m->nodes[node].first_child; c >= 0; c = m->nodes[c].next_sibling)
        if (m->nodes[c].byte == byte) return c;
    return -1;
}

void added_matcher_add(added_matcher *m, const char *s, size_t len, int32_t token_index) {
    if (len == 0) return;  // HF never matches an empty token
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = child_of(m, node, b);
        if (c < 0) {
            if (m->n_nodes == m->cap) {
                m->cap *= 2;
                m->nodes = neox_realloc(m->nodes, m->cap * sizeof *m->nodes);
            }
            c = (int32_t)m->n_nodes++;
            m->nodes[c] = (struct trie_node){-1, m->nodes[node].first_child, -1, b};
            m->nodes[node].first_child = c;
        }
        node = c;
    }
    // The first token added with a given content wins, as in HF (later duplicates map to it).
    if (m->nodes[node].token < 0) m->nodes[node].token = token_index;
    m->first_byte[(uint8_t)s[0]] = true;
}

size_t added_matcher_find(const added_matcher *m, const uint8_t *text, size_t size, size_t from, size_t *match_len,
                          int32_t *token_index) {
    for (size_t i = from; i < size; i++) {
        if (!m->first_byte[text[i]]) continue;
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t j = i; j < size; j++) {
            node = child_of(m, node, text[j]);
            if (node < 0) break;
            if (m->nodes[node].token >= 0) best = m->nodes[node].token, best_len = j - i + 1;
        }
        if (best >= 0) {
            *match_len = best_len;
            *token_index = best;
            return i;
        }
    }
    return size;
}
