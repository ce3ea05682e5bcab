// batch.c: the training batch iterator. GPT-NeoX reads its dataset sequentially in global batches
// of micro_batch * dp samples (drop_last) and gives each data-parallel rank a contiguous slice
// (DistributedBatchSampler); inputs are tokens[:-1], labels tokens[1:], and the loss mask drops
// padding (-100) and, with eod_mask_loss, positions whose input is the EOD token. With a label
// dataset (SFT), labels and mask come from it as GPT-NeoX's _get_batch takes them: labels are
// label[1:] (negative ones replaced by 0) and a position is scored only where its label is >= 0,
// the EOD mask still applying to the inputs. With a reward dataset (KTO) each row also carries the
// reward of each input position (GPT-NeoX's reward[:, :-1]).
#include "data.h"

#include <stdlib.h>
#include <string.h>

void neox_batch_iterator_init(neox_batch_iterator *it, const neox_dataset *d, int micro_batch, int dp_size, int dp_rank,
                              int32_t eod_id, int eod_mask_loss) {
    it->dataset = d;
    it->micro_batch = micro_batch;
    it->dp_size = dp_size;
    it->dp_rank = dp_rank;
    it->position = 0;
    it->eod_id = eod_id;
    it->eod_mask_loss = eod_mask_loss;
}

int64_t neox_batch_iterator_batches(const neox_batch_iterator *it) {
    return it->dataset->size / ((int64_t)it->micro_batch * it->dp_size);
}

neox_batch *neox_batch_alloc(int micro_batch, int seq_length) {
    neox_batch *b = neox_calloc(1, sizeof *b);
    size_t n = (size_t)micro_batch * (size_t)seq_length;
    b->micro_batch = micro_batch;
    b->seq_length = seq_length;
    b->tokens = neox_malloc(n * sizeof *b->tokens);
    b->labels = neox_malloc(n * sizeof *b->labels);
    b->loss_mask = neox_malloc(n * sizeof *b->loss_mask);
    b->rewards = neox_calloc(n ? n : 1, sizeof *b->rewards);
    return b;
}

void neox_batch_free(neox_batch *b) {
    if (!b) return;
    free(b->tokens);
    free(b->labels);
    free(b->loss_mask);
    free(b->rewards);
    free(b);
}

// The dataloader restarts from the beginning when a resume position passes its end
// (GPT-NeoX: start_iter = iteration * gradient_accumulation_steps % len(dataloader)).
// Row `row` of b from one sample: inputs are sample[:-1] (negative ids replaced by 0), labels
// target[1:] (likewise), scored where the label is >= 0 and, with eod_mask_loss, the input not EOD.
static void fill_row(const neox_batch_iterator *it, neox_batch *b, int row, const int32_t *sample,
                     const int32_t *target) {
    int seq = b->seq_length;
    for (int t = 0; t < seq; t++) {
        size_t k = (size_t)row * seq + t;
        int32_t in = sample[t], next = target[t + 1];
        b->tokens[k] = in < 0 ? 0 : in;
        b->labels[k] = next < 0 ? 0 : next;
        float mask = next >= 0 ? 1.0f : 0.0f;
        if (it->eod_mask_loss && in == it->eod_id) mask = 0.0f;
        b->loss_mask[k] = mask;
    }
}

// Row `row` of b's rewards: the sample's reward row without its last position.
static int read_rewards(const neox_dataset *d, int64_t idx, neox_batch *b, int row, neox_error *err) {
    float *r = neox_malloc(((size_t)b->seq_length + 1) * sizeof *r);
    int rc = neox_dataset_sample_rewards(d, idx, r, err);
    if (rc == 0) memcpy(b->rewards + (size_t)row * b->seq_length, r, (size_t)b->seq_length * sizeof *r);
    free(r);
    return rc;
}

// The dataloader restarts from the beginning when a resume position passes its end
// (GPT-NeoX: start_iter = iteration * gradient_accumulation_steps % len(dataloader)). A pairwise
// dataset's samples fill the chosen rows [0, micro_batch) and the rejected rows after them, as
// GPT-NeoX concatenates pos and neg along the batch.
int neox_batch_next(neox_batch_iterator *it, neox_batch *b, neox_error *err) {
    int64_t batches = neox_batch_iterator_batches(it);
    if (batches <= 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "the dataset has %lld samples, fewer than one global batch of %d",
                         (long long)it->dataset->size, it->micro_batch * it->dp_size);
    int rows = neox_dataset_rows_per_sample(it->dataset);
    if (b->micro_batch != it->micro_batch * rows)
        return neox_fail(err, NEOX_EXIT_FAILURE, "internal: a batch of %d rows for %d samples of %d rows",
                         b->micro_batch, it->micro_batch, rows);
    size_t n = (size_t)b->seq_length + 1;
    int32_t *buf = neox_malloc(4 * n * sizeof *buf);
    int32_t *sample = buf, *label = buf + n, *neg = buf + 2 * n, *neg_label = buf + 3 * n;
    int labelled = it->dataset->has_labels;
    int64_t first = (it->position % batches) * it->micro_batch * it->dp_size + (int64_t)it->dp_rank * it->micro_batch;
    int rc = 0;
    for (int m = 0; m < it->micro_batch && rc == 0; m++) {
        if (rows == 2) {
            rc = neox_dataset_pair_sample(it->dataset, first + m, sample, label, neg, neg_label, err);
            if (rc == 0) fill_row(it, b, it->micro_batch + m, neg, labelled ? neg_label : neg);
        } else {
            rc = neox_dataset_sample(it->dataset, first + m, sample, labelled ? label : NULL, err);
        }
        if (rc == 0) fill_row(it, b, m, sample, labelled ? label : sample);
        if (rc == 0 && it->dataset->has_rewards) rc = read_rewards(it->dataset, first + m, b, m, err);
    }
    free(buf);
    if (rc == 0) it->position++;
    return rc;
}
