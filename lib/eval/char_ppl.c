// char_ppl.c: char_level_ppl — GPT-NeoX's character-level perplexity of an evaluation (megatron/
// training.py evaluate with megatron/utils.py CharCounter): exp(lm_loss x tokens / characters), where
// the tokens are every sample's seq_length + 1 ids and the characters those of its detokenized text,
// counted as Python's len counts a str (code points). GPT-NeoX counts one rank's samples; here the
// counts are summed over the data-parallel ranks, so every layout gives the same value.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "eval.h"

static int64_t code_points(const char *s, size_t n) {
    int64_t count = 0;
    for (size_t i = 0; i < n; i++) count += ((unsigned char)s[i] & 0xC0) != 0x80;  // not a continuation byte
    return count;
}

int neox_eval_tokens_per_char(const neox_tokenizer *tok, const neox_batch_iterator *from, int seq_length, int64_t count,
                              neox_comm *data, double *tokens_per_char, neox_error *err) {
    neox_batch_iterator it = *from;  // the evaluation reads the same batches afterwards
    neox_batch *b = neox_batch_alloc(it.micro_batch, seq_length);
    int T = seq_length, rc = 0;
    int32_t *sample = neox_malloc(((size_t)T + 1) * sizeof *sample);
    double sums[3] = {0, 0, 0};  // tokens, characters, failures
    for (int64_t k = 0; rc == 0 && k < count; k++) {
        rc = neox_batch_next(&it, b, err);
        for (int s = 0; rc == 0 && s < b->micro_batch; s++) {
            memcpy(sample, b->tokens + (size_t)s * T, (size_t)T * sizeof *sample);
            sample[T] = b->labels[(size_t)s * T + T - 1];
            size_t size;
            char *text = neox_tokenizer_decode(tok, sample, (size_t)T + 1, &size, err);
            if (!text) rc = -1;
            else sums[0] += T + 1, sums[1] += (double)code_points(text, size);
            free(text);
        }
    }
    sums[2] = rc != 0;
    free(sample);
    neox_batch_free(b);
    if (data && data->size > 1) neox_allreduce_sum(data, sums, 3, NEOX_F64);
    if (rc == 0 && sums[2] > 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "another rank failed counting characters");
    *tokens_per_char = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    return rc;
}
