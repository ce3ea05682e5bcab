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

// Sample idx of g read from ds: the token dataset, or its label dataset, whose items have the same
// sizes, so one sample index serves both (GPT2Dataset reads the label dataset at the same
// document and offsets).
static int64_t gpt2_read(const neox_gpt2_dataset *g, const neox_indexed_dataset *ds, int64_t idx, int32_t *out,
                         neox_error *err) {
    const neox_sample_index *si = g->index;
    int64_t want = g->seq_length + 1;
    int64_t row = si->shuffle_idx[idx];
    int64_t f = si->sample_idx[2 * row], l = si->sample_idx[2 * row + 2];
    int64_t off_f = si->sample_idx[2 * row + 1], off_l = si->sample_idx[2 * row + 3];
    int64_t n = 0;
    // Tokens [off_f, end) of doc f, whole documents up to l, and tokens [0, off_l] of doc l:
    // the last token is shared with the next sample. Reads are clamped to want tokens.
    for (int64_t d = f; d <= l && d < si->doc_idx_len && n < want; d++) {
        int64_t item = si->doc_idx[d], size = ds->sizes[item];
        int64_t begin = d == f ? off_f : 0;
        int64_t end = d == l ? off_l + 1 : size;
        if (end > size) end = size;
        if (end - begin > want - n) end = begin + (want - n);
        if (end <= begin) continue;
        if (neox_indexed_get(ds, item, begin, end - begin, out + n, err) < 0) return -1;
        n += end - begin;
    }
    for (int64_t i = n; i < want; i++) out[i] = -100;  // GPT-NeoX pads short samples with -100
    return n;
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

int neox_dataset_sample(const neox_dataset *d, int64_t idx, int32_t *tokens, int32_t *labels, neox_error *err) {
    if (d->size <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "dataset has no samples");
    idx %= d->size;
    if (idx < 0) idx += d->size;
    const neox_gpt2_dataset *g = &d->parts[0];
    int64_t local = idx;
    if (d->dataset_index) {
        g = &d->parts[d->dataset_index[idx]];
        local = d->dataset_sample_index[idx];
    }
    int64_t len = gpt2_length(g);
    if (len <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: dataset has no samples", g->data->idx_path);
    // GPT-NeoX answers an IndexError by taking the index modulo the dataset length.
    local %= len;
    if (gpt2_read(g, g->data, local, tokens, err) < 0) return -1;
    if (check_vocabulary(d, g->data, idx, local, tokens, 0, err) != 0) return -1;
    if (!labels || !g->labels) return 0;
    if (gpt2_read(g, g->labels, local, labels, err) < 0) return -1;
    return check_vocabulary(d, g->labels, idx, local, labels, 1, err);
}

void neox_dataset_free(neox_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->count; i++) {
        neox_sample_index_free(d->parts[i].index);
        neox_indexed_close(d->parts[i].data);
        neox_indexed_close(d->parts[i].labels);
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
        .allow_chopped = s->allow_chopped, .cache_dir = s->cache_dir,
    };
    part->data = ds;
    part->seq_length = s->seq_length;
    part->index = neox_sample_index_build(ds, &o, NULL, err);
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

// One BlendableDataset over paths with weights (or weights by document count), each path with its
// label dataset when label_paths is set.
static int build_blend(const neox_data_settings *s, const char *kind, const char *const *paths,
                       const char *const *label_paths, int n, const double *weights, int64_t total_samples,
                       neox_dataset **out, neox_error *err) {
    if (n == 0) return 0;
    if (n > 254) return neox_fail(err, NEOX_EXIT_USAGE, "%s_data_paths: at most 254 datasets can be blended", kind);
    double *w = neox_malloc((size_t)n * sizeof *w), *norm = neox_malloc((size_t)n * sizeof *norm);
    int64_t *counts = neox_malloc((size_t)n * sizeof *counts);
    neox_indexed_dataset **data = neox_calloc((size_t)n, sizeof *data);
    neox_indexed_dataset **labels = neox_calloc((size_t)n, sizeof *labels);
    int rc = -1;
    for (int i = 0; i < n; i++) {
        w[i] = weights ? weights[i] : 1.0;
        if (!(data[i] = neox_indexed_open(paths[i], err))) goto done;
        if (label_paths && !(labels[i] = open_labels(label_paths[i], data[i], err))) goto done;
        counts[i] = data[i]->num_items;  // GPT-NeoX counts indexed_dataset.sizes, i.e. items
    }
    if (s->weight_by_num_documents) neox_weights_by_num_docs(counts, n, s->weighted_sampler_alpha, w);
    neox_normalized_weights(w, n, total_samples, norm, counts);
    neox_dataset *d = *out = dataset_new(n, s->seq_length);
    d->has_labels = label_paths != NULL;
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s_%d", kind, i);
        neox_indexed_dataset *ds = data[i];
        data[i] = NULL;
        d->parts[i].labels = labels[i];
        labels[i] = NULL;
        if (build_part(&d->parts[i], ds, paths[i], name, 0, ds->num_doc_idx - 1, counts[i], s, err) != 0) goto done;
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
    for (int i = 0; i < n; i++) neox_indexed_close(data[i]), neox_indexed_close(labels[i]);
    free(data);
    free(labels);
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
        rc = build_blend(s, "train", s->train_paths, s->train_label_paths, s->ntrain, s->train_weights, samples[0],
                         &out[0], err);
        if (rc == 0)
            rc = build_blend(s, "valid", s->valid_paths, s->valid_label_paths, s->nvalid, s->valid_weights, samples[1],
                             &out[1], err);
        if (rc == 0)
            rc = build_blend(s, "test", s->test_paths, s->test_label_paths, s->ntest, s->test_weights, samples[2],
                             &out[2], err);
    } else if (s->data_path) {
        rc = build_from_split(s, samples, out, err);
    } else {
        rc = neox_fail(err, NEOX_EXIT_USAGE, "no data: set data_path, or train_data_paths with valid and test paths");
    }
    if (rc != 0)
        for (int i = 0; i < 3; i++) neox_dataset_free(out[i]), out[i] = NULL;
    return rc;
}
