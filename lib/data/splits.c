// splits.c: how GPT-NeoX divides data (data_utils.py, blendable_dataset.py, helpers.cpp):
// the train/valid/test split of one dataset into document ranges, sample counts per split,
// normalised blend weights with the 1.005 margin, weights by document count, and the greedy
// blending assignment. Floating-point steps are done in the same order as the Python code so the
// rounding is the same.
#include "config.h"
#include "data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int neox_split_ranges(const char *splits, int64_t num_docs, int64_t index[4], neox_error *err) {
    double w[3];
    if (neox_split_weights(splits, w, err) != 0) return -1;
    double sum = 0;
    for (int i = 0; i < 3; i++) sum += w[i];
    index[0] = 0;
    // int(round(x)) in Python rounds half to even, as rint does in the default rounding mode.
    for (int i = 0; i < 3; i++) index[i + 1] = index[i] + (int64_t)rint(w[i] / sum * (double)num_docs);
    int64_t diff = index[3] - num_docs;
    for (int i = 1; i < 4; i++) index[i] -= diff;
    return 0;
}

void neox_normalized_weights(const double *weights, int n, int64_t num_samples, double *out_weights,
                             int64_t *out_samples) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += weights[i];
    for (int i = 0; i < n; i++) {
        out_weights[i] = weights[i] / sum;
        // 0.5% more than the share, so blending never runs a dataset dry.
        out_samples[i] = (int64_t)ceil((double)num_samples * out_weights[i] * 1.005);
    }
}

void neox_weights_by_num_docs(const int64_t *num_docs, int n, double alpha, double *out) {
    if (n == 1) {
        out[0] = 1.0;
        return;
    }
    int64_t total_docs = 0;
    for (int i = 0; i < n; i++) total_docs += num_docs[i];
    double *unbiased = neox_malloc((size_t)n * sizeof *unbiased);
    double total = 0;
    for (int i = 0; i < n; i++) {
        unbiased[i] = (double)num_docs[i] / (double)total_docs;
        out[i] = pow(unbiased[i], alpha);
        total += out[i];
    }
    double total2 = 0;
    for (int i = 0; i < n; i++) {
        out[i] = out[i] / total * (1 - unbiased[i]);
        total2 += out[i];
    }
    for (int i = 0; i < n; i++) out[i] /= total2;
    free(unbiased);
}

void neox_blending_indices(const double *weights, int n, int64_t size, uint8_t *dataset_index,
                           int64_t *dataset_sample_index) {
    int64_t *taken = neox_calloc((size_t)n, sizeof *taken);
    for (int64_t s = 0; s < size; s++) {
        double at = s > 1 ? (double)s : 1.0;
        int best = 0;
        double best_error = weights[0] * at - (double)taken[0];
        for (int d = 1; d < n; d++) {
            double error = weights[d] * at - (double)taken[d];
            if (error > best_error) best_error = error, best = d;
        }
        dataset_index[s] = (uint8_t)best;
        dataset_sample_index[s] = taken[best]++;
    }
    free(taken);
}

void neox_train_valid_test_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                                   int64_t train_batch_size, int64_t out[3]) {
    out[0] = train_iters * train_batch_size;
    out[1] = (train_iters / eval_interval + 1) * eval_iters * train_batch_size;
    out[2] = eval_iters * train_batch_size;
}
