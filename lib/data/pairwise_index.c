// pairwise_index.c: the sample index of a pairwise (preference) dataset, as GPT-NeoX's
// pairwise_dataset.py _build_index_mappings builds it: which document pair (the same document of
// the chosen and the rejected dataset) makes up each sample, and the order samples are served in,
// with the same RandomState draws. Documents whose labels are all masked are skipped, since such a
// pair has no tokens to compare. The index is cheap (one pass over the documents), so it is built
// in memory and not cached.
#include "data.h"

#include <stdlib.h>

typedef struct pairwise_sources {
    const neox_indexed_dataset *pos, *neg, *pos_labels, *neg_labels;
    const neox_sample_index_options *o;
    int32_t *scratch;  // seq_length + 1 labels
} pairwise_sources;

static int all_masked(const pairwise_sources *s, const neox_indexed_dataset *labels, int64_t doc, int64_t n,
                      int *masked, neox_error *err) {
    *masked = 0;
    return labels ? neox_labels_all_masked(labels, doc, n, s->scratch, masked, err) : 0;
}

// A document pair GPT-NeoX skips: too long (or, for pack_until_overflow, too short: its test is
// `< seq_length + 1` there) without allow_chopped, or with a side whose first n labels are masked.
static int skips(const pairwise_sources *s, int64_t doc, int64_t n, int *skip, neox_error *err) {
    const neox_sample_index_options *o = s->o;
    int64_t limit = o->seq_length + 1, p = s->pos->sizes[doc], q = s->neg->sizes[doc];
    int too_long = o->pack_impl == NEOX_PACK_UNPACKED ? (p > limit || q > limit) : (p < limit || q < limit);
    *skip = !o->allow_chopped && too_long;
    if (*skip) return 0;
    int masked;
    if (all_masked(s, s->pos_labels, doc, n, &masked, err) != 0) return -1;
    if (!masked && all_masked(s, s->neg_labels, doc, n, &masked, err) != 0) return -1;
    *skip = masked;
    return 0;
}

static int none_usable(const neox_sample_index_options *o, neox_error *err) {
    return neox_fail(err, NEOX_EXIT_USAGE,
                     "%s: no document pair is usable (each is %s seq_length + 1 = %d tokens with allow_chopped off, or "
                     "has a side whose labels are all masked)",
                     o->name, o->pack_impl == NEOX_PACK_UNPACKED ? "longer than" : "shorter than", o->seq_length + 1);
}

// The samples in a shuffled order of n entries, entry i being value[i] (drawn before anything else).
static void shuffled_order(neox_sample_index *si, int64_t n, int64_t modulo, neox_random_state *rs) {
    si->shuffle_idx_len = n;
    si->shuffle_idx = neox_malloc((size_t)n * 8 + 1);
    for (int64_t i = 0; i < n; i++) si->shuffle_idx[i] = modulo > 0 ? i % modulo : i;
    neox_random_shuffle(rs, si->shuffle_idx, n, 8);
}

// unpacked: one pair per sample, pairs in document order (cycling, skipping unusable ones), served
// in a shuffled order of i % documents, i < num_samples (so only the first pass is ever served).
static int build_unpacked(neox_sample_index *si, const pairwise_sources *s, neox_random_state *rs, neox_error *err) {
    const neox_sample_index_options *o = s->o;
    int64_t ns = o->num_samples, ndocs = o->doc_end - o->doc_begin;
    shuffled_order(si, ns, ndocs, rs);
    si->sample_idx_len = ns + 1;
    si->sample_idx = neox_malloc((size_t)(ns + 1) * 16);
    for (int64_t i = 0; i <= ns; i++) si->sample_idx[2 * i] = i, si->sample_idx[2 * i + 1] = 0;
    si->doc_idx_len = ns + 1;
    si->doc_idx = neox_malloc((size_t)(ns + 1) * 8);
    int64_t d = 0, skipped_in_row = 0;
    for (int64_t i = 0; i <= ns;) {
        int64_t doc = o->doc_begin + d;
        int skip;
        d = (d + 1) % ndocs;
        if (skips(s, doc, o->seq_length, &skip, err) != 0) return -1;
        if (skip) {
            if (++skipped_in_row > ndocs) return none_usable(o, err);
            continue;
        }
        skipped_in_row = 0;
        si->doc_idx[i++] = doc;
    }
    return 0;
}

static void append(int64_t **a, int64_t *len, int64_t *cap, int64_t v) {
    if (*len == *cap) *a = neox_realloc(*a, (size_t)(*cap = *cap ? 2 * *cap : 1024) * sizeof **a);
    (*a)[(*len)++] = v;
}

// pack_until_overflow: pairs in reshuffled passes, packed into a sample until the longer side of
// the next pair would overflow seq_length + 1. (GPT-NeoX does not wrap to the next pass after
// skipping the last pair of one, and stops with an IndexError there; neox.c wraps.)
static int build_packed_pairs(neox_sample_index *si, const pairwise_sources *s, neox_random_state *rs, neox_error *err) {
    const neox_sample_index_options *o = s->o;
    int64_t ns = o->num_samples, ndocs = o->doc_end - o->doc_begin, limit = o->seq_length + 1;
    shuffled_order(si, ns, 0, rs);
    int64_t *order = neox_malloc((size_t)ndocs * 8);
    for (int64_t i = 0; i < ndocs; i++) order[i] = i;
    neox_random_shuffle(rs, order, ndocs, 8);
    int64_t flat = 0, flat_cap = 0, docs_cap = 0, running = 0, cur = 0, skipped_in_row = 0;
    int rc = 0;
    si->doc_idx_len = 0;
    while (rc == 0 && flat / 2 < ns) {
        int64_t doc = o->doc_begin + order[cur];
        int skip;
        if ((rc = skips(s, doc, limit, &skip, err)) != 0) break;
        if (skip) {
            if (++skipped_in_row > ndocs) rc = none_usable(o, err);
        } else {
            skipped_in_row = 0;
            int64_t len = s->pos->sizes[doc] > s->neg->sizes[doc] ? s->pos->sizes[doc] : s->neg->sizes[doc];
            if (running == 0 || running + len > limit) {
                append(&si->sample_idx, &flat, &flat_cap, si->doc_idx_len);
                append(&si->sample_idx, &flat, &flat_cap, 0);
                running = len;
            } else {
                running += len;
            }
            append(&si->doc_idx, &si->doc_idx_len, &docs_cap, doc);
        }
        if (++cur == ndocs) cur = 0, neox_random_shuffle(rs, order, ndocs, 8);
    }
    append(&si->sample_idx, &flat, &flat_cap, si->doc_idx_len);
    append(&si->sample_idx, &flat, &flat_cap, 0);
    si->sample_idx_len = flat / 2;
    free(order);
    return rc;
}

neox_sample_index *neox_pairwise_index_build(const neox_indexed_dataset *pos, const neox_indexed_dataset *neg,
                                             const neox_indexed_dataset *pos_labels,
                                             const neox_indexed_dataset *neg_labels,
                                             const neox_sample_index_options *o, neox_error *err) {
    if (o->pack_impl == NEOX_PACK_PACKED) {
        neox_fail(err, NEOX_EXIT_USAGE, "pack_impl: packed is not supported for dataset_impl pairwise (a sample must "
                  "hold whole pairs; use unpacked or pack_until_overflow, as GPT-NeoX requires)");
        return NULL;
    }
    if (neg->num_items != pos->num_items) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s has %lld documents but the rejected dataset %s has %lld: pairwise data "
                  "needs one rejected document per chosen one", pos->idx_path, (long long)pos->num_items,
                  neg->idx_path, (long long)neg->num_items);
        return NULL;
    }
    if (o->doc_begin < 0 || o->doc_end > pos->num_items || o->doc_begin >= o->doc_end || o->seq_length < 1 ||
        o->num_samples < 0) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s: invalid sample index request (documents [%lld, %lld), seq_length %d)",
                  pos->idx_path, (long long)o->doc_begin, (long long)o->doc_end, o->seq_length);
        return NULL;
    }
    pairwise_sources s = {pos, neg, pos_labels, neg_labels, o, neox_malloc(((size_t)o->seq_length + 1) * 4)};
    neox_sample_index *si = neox_calloc(1, sizeof *si);
    si->num_epochs = 1;
    neox_random_state rs;
    neox_random_seed(&rs, o->seed);
    int rc = o->pack_impl == NEOX_PACK_UNPACKED ? build_unpacked(si, &s, &rs, err) : build_packed_pairs(si, &s, &rs, err);
    free(s.scratch);
    if (rc != 0) {
        neox_sample_index_free(si);
        return NULL;
    }
    int64_t a = si->shuffle_idx_len - 1, b = si->sample_idx_len - 1;
    si->length = a < b ? a : b;
    if (si->length < 0) si->length = 0;
    return si;
}
