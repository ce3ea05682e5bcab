// datasets.c: the train/valid/test datasets GPT-NeoX builds from a config
// (build_train_valid_test_data_iterators): one data_path split into document ranges, or separate
// train/valid/test paths blended by weight (optionally weighted by document count), and reading a
// sample of seq_length + 1 tokens as GPT2Dataset.__getitem__ and BlendableDataset do.
#include "config.h"
#include "data.h"

#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// Samples

// One document's span of a sample: tokens [begin, end) of the indexed item, written at position at.
typedef int (*span_fn)(const neox_gpt2_dataset *g, const void *ctx, int64_t item, int64_t begin, int64_t end,
                       int64_t at, void *out, neox_error *err);

// Walks the spans of sample idx: tokens [off_f, end) of doc f, whole documents up to l, and tokens
// [0, off_l] of doc l (the last token is shared with the next sample), clamped to seq_length + 1
// positions in all. Returns the positions covered, or -1 when fn fails.
static int64_t gpt2_walk(const neox_gpt2_dataset *g, const neox_indexed_dataset *ds, int64_t idx, span_fn fn,
                         const void *ctx, void *out, neox_error *err) {
    const neox_sample_index *si = g->index;
    int64_t want = g->seq_length + 1;
    int64_t row = si->shuffle_idx[idx];
    int64_t f = si->sample_idx[2 * row], l = si->sample_idx[2 * row + 2];
    int64_t off_f = si->sample_idx[2 * row + 1], off_l = si->sample_idx[2 * row + 3];
    int64_t n = 0;
    for (int64_t d = f; d <= l && d < si->doc_idx_len && n < want; d++) {
        int64_t item = si->doc_idx[d], size = ds->sizes[item];
        int64_t begin = d == f ? off_f : 0;
        int64_t end = d == l ? off_l + 1 : size;
        if (end > size) end = size;
        if (end - begin > want - n) end = begin + (want - n);
        if (end <= begin) continue;
        if (fn(g, ctx, item, begin, end, n, out, err) != 0) return -1;
        n += end - begin;
    }
    return n;
}

static int read_ids(const neox_gpt2_dataset *g, const void *ds, int64_t item, int64_t begin, int64_t end, int64_t at,
                    void *out, neox_error *err) {
    (void)g;
    return neox_indexed_get(ds, item, begin, end - begin, (int32_t *)out + at, err) < 0 ? -1 : 0;
}

// Each position of a document's span takes the document's reward (the first value of its item).
static int read_reward(const neox_gpt2_dataset *g, const void *ctx, int64_t item, int64_t begin, int64_t end,
                       int64_t at, void *out, neox_error *err) {
    (void)ctx;
    double r;
    if (neox_indexed_get_values(g->rewards, item, 0, 1, &r, err) < 0) return -1;
    for (int64_t i = begin; i < end; i++) ((float *)out)[at++] = (float)r;
    return 0;
}

// Sample idx of g read from ds: the token dataset, or its label dataset, whose items have the same
// sizes, so one sample index serves both (GPT2Dataset reads the label dataset at the same
// document and offsets).
static int64_t gpt2_read(const neox_gpt2_dataset *g, const neox_indexed_dataset *ds, int64_t idx, int32_t pad,
                         int32_t *out, neox_error *err) {
    int64_t n = gpt2_walk(g, ds, idx, read_ids, ds, out, err);
    if (n < 0) return -1;
    for (int64_t i = n; i < g->seq_length + 1; i++) out[i] = pad;
    return n;
}

// The reward row of sample idx of g: the token spans, each filled with its document's reward,
// padding 0 (GPT2Dataset.__getitem__).
static int gpt2_read_rewards(const neox_gpt2_dataset *g, int64_t idx, float *out, neox_error *err) {
    int64_t n = gpt2_walk(g, g->data, idx, read_reward, NULL, out, err);
    if (n < 0) return -1;
    for (int64_t i = n; i < g->seq_length + 1; i++) out[i] = 0.0f;
    return 0;
}

static int64_t gpt2_length(const neox_gpt2_dataset *g) { return g->index->length; }

// Every id of a sample below the model's vocabulary: tokens may be padding (-100) only, labels
// any negative value (GPT-NeoX scores a label when it is >= 0).
static int check_vocabulary(const neox_dataset *d, const neox_indexed_dataset *ds, int64_t idx, int64_t local,
                            const int32_t *ids, int is_label, neox_error *err) {
    if (d->vocab_size <= 0) return 0;
    for (int t = 0; t <= d->seq_length; t++)
        if (ids[t] >= d->vocab_size || (ids[t] < 0 && ids[t] != -100 && !is_label))
            return neox_fail(err, NEOX_EXIT_FAILURE,
                             "%s: sample %lld (%lld of this dataset) holds %s id %d at position %d, outside the "
                             "model's vocabulary of %lld (was it preprocessed with another tokenizer?)",
                             ds->bin_path, (long long)idx, (long long)local, is_label ? "label" : "token", ids[t], t,
                             (long long)d->vocab_size);
    return 0;
}

// The part holding sample idx of d and the sample's index inside it.
static const neox_gpt2_dataset *locate(const neox_dataset *d, int64_t *idx, int64_t *local, neox_error *err) {
    if (d->size <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "dataset has no samples"), NULL;
    *idx %= d->size;
    if (*idx < 0) *idx += d->size;
    const neox_gpt2_dataset *g = &d->parts[0];
    *local = *idx;
    if (d->dataset_index) {
        g = &d->parts[d->dataset_index[*idx]];
        *local = d->dataset_sample_index[*idx];
    }
    int64_t len = gpt2_length(g);
    if (len <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: dataset has no samples", g->data->idx_path), NULL;
    // GPT-NeoX answers an IndexError by taking the index modulo the dataset length.
    *local %= len;
    return g;
}

// One side's span of sample local: tokens (padded with token_pad) and, when wanted and present, labels.
static int read_side(const neox_dataset *d, const neox_gpt2_dataset *g, const neox_indexed_dataset *data,
                     const neox_indexed_dataset *labels, int64_t idx, int64_t local, int32_t token_pad, int32_t *tokens,
                     int32_t *label_out, neox_error *err) {
    if (gpt2_read(g, data, local, token_pad, tokens, err) < 0) return -1;
    if (check_vocabulary(d, data, idx, local, tokens, 0, err) != 0) return -1;
    if (!label_out || !labels) return 0;
    if (gpt2_read(g, labels, local, NEOX_LABEL_MASKED, label_out, err) < 0) return -1;
    return check_vocabulary(d, labels, idx, local, label_out, 1, err);
}

int neox_dataset_sample(const neox_dataset *d, int64_t idx, int32_t *tokens, int32_t *labels, neox_error *err) {
    int64_t local;
    const neox_gpt2_dataset *g = locate(d, &idx, &local, err);
    // GPT2Dataset pads short samples with -100.
    return g ? read_side(d, g, g->data, g->labels, idx, local, NEOX_LABEL_MASKED, tokens, labels, err) : -1;
}

int neox_dataset_sample_rewards(const neox_dataset *d, int64_t idx, float *out, neox_error *err) {
    int64_t local;
    const neox_gpt2_dataset *g = locate(d, &idx, &local, err);
    if (!g) return -1;
    if (!g->rewards) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: has no reward dataset", g->data->idx_path);
    return gpt2_read_rewards(g, local, out, err);
}

int neox_dataset_pair_sample(const neox_dataset *d, int64_t idx, int32_t *pos, int32_t *pos_labels, int32_t *neg,
                             int32_t *neg_labels, neox_error *err) {
    int64_t local;
    const neox_gpt2_dataset *g = locate(d, &idx, &local, err);
    if (!g) return -1;
    if (!g->neg) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a pairwise dataset", g->data->idx_path);
    // PairwiseDataset reads doc_idx[l] even for the last sample of pack_until_overflow, where l is one
    // past the end: its IndexError fallback then serves sample shuffle_idx[local] % len instead.
    const neox_sample_index *si = g->index;
    for (int64_t guard = 0; guard < si->length; guard++) {
        int64_t row = si->shuffle_idx[local];
        if (si->sample_idx[2 * row + 2] < si->doc_idx_len) break;
        local = row % si->length;
    }
    if (read_side(d, g, g->data, g->labels, idx, local, 0, pos, pos_labels, err) != 0) return -1;
    return read_side(d, g, g->neg, g->neg_labels, idx, local, 0, neg, neg_labels, err);
}

void neox_dataset_free(neox_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->count; i++) {
        neox_sample_index_free(d->parts[i].index);
        neox_indexed_close(d->parts[i].data);
        neox_indexed_close(d->parts[i].labels);
        neox_indexed_close(d->parts[i].neg);
        neox_indexed_close(d->parts[i].neg_labels);
        neox_indexed_close(d->parts[i].rewards);
    }
    free(d->parts);
    free(d->weights);
    free(d->dataset_index);
    free(d->dataset_sample_index);
    free(d);
}

// ---------------------------------------------------------------------------------------------
// Building

static int build_part(neox_gpt2_dataset *part, neox_indexed_dataset *ds, const char *prefix, const char *name,
                      int64_t begin, int64_t end, int64_t num_samples, const neox_data_settings *s, neox_error *err) {
    neox_sample_index_options o = {
        .name = name, .data_prefix = s->use_cache ? prefix : NULL, .doc_begin = begin, .doc_end = end,
        .num_samples = num_samples, .seq_length = s->seq_length, .seed = s->seed, .pack_impl = s->pack_impl,
        .allow_chopped = s->allow_chopped, .cache_dir = s->cache_dir, .labels = part->labels,
    };
    part->data = ds;
    part->seq_length = s->seq_length;
    part->index = part->neg ? neox_pairwise_index_build(ds, part->neg, part->labels, part->neg_labels, &o, err)
                            : neox_sample_index_build(ds, &o, NULL, err);
    return part->index ? 0 : -1;
}

static neox_dataset *dataset_new(int count, int seq_length) {
    neox_dataset *d = neox_calloc(1, sizeof *d);
    d->count = count;
    d->parts = neox_calloc((size_t)count, sizeof *d->parts);
    d->seq_length = seq_length;
    return d;
}

// data_path + split: three GPT2Datasets over contiguous document ranges of one file.
static int build_from_split(const neox_data_settings *s, const int64_t samples[3], neox_dataset *out[3],
                            neox_error *err) {
    static const char *names[3] = {"train", "valid", "test"};
    neox_indexed_dataset *probe = neox_indexed_open(s->data_path, err);
    if (!probe) return -1;
    int64_t docs = probe->num_doc_idx - 1, index[4];
    neox_indexed_close(probe);
    char *fallback = s->split ? NULL : neox_key_default_str(NEOX_K_split);  // (split: null in a file)
    int rc = neox_split_ranges(s->split ? s->split : fallback, docs, index, err);
    free(fallback);
    if (rc != 0) return -1;
    for (int i = 0; i < 3; i++) {
        if (index[i + 1] <= index[i]) continue;
        neox_indexed_dataset *ds = neox_indexed_open(s->data_path, err);
        if (!ds) return -1;
        out[i] = dataset_new(1, s->seq_length);
        if (build_part(&out[i]->parts[0], ds, s->data_path, names[i], index[i], index[i + 1], samples[i], s, err) != 0)
            return -1;
        out[i]->size = gpt2_length(&out[i]->parts[0]);
    }
    return 0;
}

// The label dataset must have the token dataset's documents and item sizes, since samples are cut
// from both at the same offsets; the error names both files and the first document that differs.
static int check_label_lengths(const neox_indexed_dataset *tokens, const neox_indexed_dataset *labels,
                               neox_error *err) {
    int64_t docs = tokens->num_doc_idx - 1, label_docs = labels->num_doc_idx - 1;
    for (int64_t d = 0; d < docs && d < label_docs; d++) {
        int64_t first = tokens->doc_idx[d], end = tokens->doc_idx[d + 1];
        int same = labels->doc_idx[d] == first && labels->doc_idx[d + 1] == end;
        int64_t ntok = 0, nlab = 0;
        for (int64_t i = first; i < end; i++) ntok += tokens->sizes[i];
        for (int64_t i = labels->doc_idx[d]; i < labels->doc_idx[d + 1]; i++) nlab += labels->sizes[i];
        for (int64_t i = first; same && i < end; i++) same = tokens->sizes[i] == labels->sizes[i];
        if (!same)
            return neox_fail(err, NEOX_EXIT_FAILURE,
                             "%s: document %lld has %lld labels in %lld items, but %s has %lld tokens in %lld items "
                             "(a label dataset must match its token dataset item for item)",
                             labels->idx_path, (long long)d, (long long)nlab,
                             (long long)(labels->doc_idx[d + 1] - labels->doc_idx[d]), tokens->idx_path,
                             (long long)ntok, (long long)(end - first));
    }
    if (docs != label_docs)
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "%s: has %lld documents, but its token dataset %s has %lld (first missing: document %lld)",
                         labels->idx_path, (long long)label_docs, tokens->idx_path, (long long)docs,
                         (long long)(docs < label_docs ? docs : label_docs));
    return 0;
}

static neox_indexed_dataset *open_labels(const char *path, const neox_indexed_dataset *tokens, neox_error *err) {
    neox_indexed_dataset *labels = neox_indexed_open(path, err);
    if (labels && check_label_lengths(tokens, labels, err) != 0) neox_indexed_close(labels), labels = NULL;
    return labels;
}

// A reward dataset holds one reward per item of its token dataset (GPT-NeoX reads the first value of
// item i for document i), so it must have as many items, none of them empty; the error names both files.
static int check_reward_lengths(const neox_indexed_dataset *tokens, const neox_indexed_dataset *rewards,
                                neox_error *err) {
    if (rewards->num_items != tokens->num_items || rewards->num_doc_idx != tokens->num_doc_idx)
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "%s: has %lld rewards in %lld documents, but its token dataset %s has %lld items in %lld "
                         "documents (a reward dataset holds one reward per document of its token dataset)",
                         rewards->idx_path, (long long)rewards->num_items, (long long)(rewards->num_doc_idx - 1),
                         tokens->idx_path, (long long)tokens->num_items, (long long)(tokens->num_doc_idx - 1));
    for (int64_t i = 0; i < rewards->num_items; i++)
        if (rewards->sizes[i] < 1)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item %lld holds no reward (document %lld of %s)",
                             rewards->idx_path, (long long)i, (long long)i, tokens->idx_path);
    return 0;
}

static neox_indexed_dataset *open_rewards(const char *path, const neox_indexed_dataset *tokens, neox_error *err) {
    neox_indexed_dataset *rewards = neox_indexed_open(path, err);
    if (rewards && check_reward_lengths(tokens, rewards, err) != 0) neox_indexed_close(rewards), rewards = NULL;
    return rewards;
}

// The paths of one split: data (the chosen side of pairwise data), and optionally its labels, the
// rejected side and its labels, one of each per data path.
typedef struct split_paths {
    const char *kind;  // "train", "valid", "test"
    const char *const *data, *const *labels, *const *neg, *const *neg_labels, *const *rewards;
    int n;
    const double *weights;
} split_paths;

// The datasets of path i of a split, checked against each other.
static int open_part(const split_paths *p, int i, neox_gpt2_dataset *part, neox_error *err) {
    if (!(part->data = neox_indexed_open(p->data[i], err))) return -1;
    if (p->labels && !(part->labels = open_labels(p->labels[i], part->data, err))) return -1;
    if (p->neg && !(part->neg = neox_indexed_open(p->neg[i], err))) return -1;
    if (p->neg_labels && !(part->neg_labels = open_labels(p->neg_labels[i], part->neg, err))) return -1;
    if (p->rewards && !(part->rewards = open_rewards(p->rewards[i], part->data, err))) return -1;
    return 0;
}

// One BlendableDataset over the split's paths with weights (or weights by document count).
static int build_blend(const neox_data_settings *s, const split_paths *p, int64_t total_samples, neox_dataset **out,
                       neox_error *err) {
    int n = p->n;
    if (n == 0) return 0;
    if (n > 254) return neox_fail(err, NEOX_EXIT_USAGE, "%s_data_paths: at most 254 datasets can be blended", p->kind);
    double *w = neox_malloc((size_t)n * sizeof *w), *norm = neox_malloc((size_t)n * sizeof *norm);
    int64_t *counts = neox_malloc((size_t)n * sizeof *counts);
    neox_dataset *d = *out = dataset_new(n, s->seq_length);
    d->has_labels = p->labels != NULL;
    d->pairwise = p->neg != NULL;
    d->has_rewards = p->rewards != NULL;
    int rc = -1;
    for (int i = 0; i < n; i++) {
        w[i] = p->weights ? p->weights[i] : 1.0;
        if (open_part(p, i, &d->parts[i], err) != 0) goto done;
        counts[i] = d->parts[i].data->num_items;  // GPT-NeoX counts indexed_dataset.sizes, i.e. items
    }
    if (s->weight_by_num_documents) neox_weights_by_num_docs(counts, n, s->weighted_sampler_alpha, w);
    neox_normalized_weights(w, n, total_samples, norm, counts);
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s_%d", p->kind, i);
        neox_indexed_dataset *ds = d->parts[i].data;
        if (build_part(&d->parts[i], ds, p->data[i], name, 0, ds->num_doc_idx - 1, counts[i], s, err) != 0) goto done;
        d->size += gpt2_length(&d->parts[i]);
    }
    // BlendableDataset normalises the already normalised weights once more (float64).
    double sum = 0;
    for (int i = 0; i < n; i++) sum += norm[i];
    d->weights = neox_malloc((size_t)n * sizeof *d->weights);
    for (int i = 0; i < n; i++) d->weights[i] = norm[i] / sum;
    d->dataset_index = neox_malloc((size_t)d->size + 1);
    d->dataset_sample_index = neox_malloc((size_t)d->size * sizeof *d->dataset_sample_index + 1);
    neox_blending_indices(d->weights, n, d->size, d->dataset_index, d->dataset_sample_index);
    rc = 0;
done:
    free(w);
    free(norm);
    free(counts);
    return rc;
}

int neox_build_datasets(const neox_data_settings *s, neox_dataset *out[3], neox_error *err) {
    out[0] = out[1] = out[2] = NULL;
    if (s->seq_length < 1) return neox_fail(err, NEOX_EXIT_USAGE, "seq_length must be positive");
    if (s->eval_interval < 1) return neox_fail(err, NEOX_EXIT_USAGE, "eval_interval must be positive");
    int64_t samples[3];
    neox_train_valid_test_samples(s->train_iters, s->eval_interval, s->eval_iters, s->train_batch_size, samples);
    int rc;
    if (s->ntrain > 0) {
        split_paths splits[3] = {
            {"train", s->train_paths, s->train_label_paths, s->train_neg_paths, s->train_neg_label_paths,
             s->train_reward_paths, s->ntrain, s->train_weights},
            {"valid", s->valid_paths, s->valid_label_paths, s->valid_neg_paths, s->valid_neg_label_paths,
             s->valid_reward_paths, s->nvalid, s->valid_weights},
            {"test", s->test_paths, s->test_label_paths, s->test_neg_paths, s->test_neg_label_paths,
             s->test_reward_paths, s->ntest, s->test_weights},
        };
        rc = 0;
        for (int i = 0; rc == 0 && i < 3; i++) rc = build_blend(s, &splits[i], samples[i], &out[i], err);
    } else if (s->data_path) {
        rc = build_from_split(s, samples, out, err);
    } else {
        rc = neox_fail(err, NEOX_EXIT_USAGE, "no data: set data_path, or train_data_paths with valid and test paths");
    }
    if (rc != 0)
        for (int i = 0; i < 3; i++) neox_dataset_free(out[i]), out[i] = NULL;
    return rc;
}
