// perplexity.c: lm_loss and lm_loss_ppl of the valid or test split, on the samples and in the
// order training evaluates them (the same datasets, sample index and per-rank batch slices), so
// the test loss equals the one neox-train logs at the end of training for the same checkpoint;
// with char_level_ppl also GPT-NeoX's character-level perplexity (char_ppl.c).
#include <math.h>
#include <stdlib.h>

#include "data.h"
#include "eval.h"


// The mean loss over count micro-batches of ds; with char_level_ppl, *tokens_per_char of them too.
static int mean_loss(neox_evaluator *ev, const neox_dataset *ds, int64_t count, double *loss, double *tokens_per_char,
                     neox_error *err) {
    const neox_config *cfg = ev->cfg;
    neox_batch_iterator it;
    neox_batch_iterator_init(&it, ds, ev->micro_batch, ev->grid->data_size, ev->grid->data_rank,
                             ev->eod_id, neox_config_bool(cfg, eod_mask_loss));
    if (neox_config_bool(cfg, char_level_ppl) &&
        neox_eval_tokens_per_char(ev->tokenizer, &it, ev->seq_length, count, &ev->grid->data, tokens_per_char, err) != 0)
        return -1;
    neox_batch *b = neox_batch_alloc(ev->micro_batch, ev->seq_length);
    int rc = neox_model_plan(ev->model, ev->micro_batch, ev->seq_length, err);
    double sum = 0.0, start = neox_now();
    neox_progress *bar = ev->rank0 && !ev->quiet ? neox_progress_start("perplexity", (double)count, "batches") : NULL;
    for (int64_t i = 0; i < count && rc == 0; i++) {
        rc = neox_batch_next(&it, b, err);
        if (rc == 0) rc = neox_model_forward(ev->model, (const int *)b->tokens, (const int *)b->labels, b->loss_mask, err);
        sum += ev->model->loss;
        ev->tokens_scored += (int64_t)ev->micro_batch * ev->seq_length;
        if (bar) {
            char extra[48];
            double seconds = neox_now() - start + 1e-9;
            snprintf(extra, sizeof extra, "%.1f examples/s", (double)(i + 1) * ev->micro_batch * ev->grid->data_size / seconds);
            neox_progress_update(bar, (double)(i + 1), extra);
        }
    }
    if (bar) neox_progress_finish(bar, (double)count, NULL);
    ev->forward_seconds += neox_now() - start;
    neox_batch_free(b);
    double local[2] = {count > 0 ? sum / (double)count : NAN, rc != 0};
    if (ev->grid->data_size > 1) neox_allreduce_sum(&ev->grid->data, local, 2, NEOX_F64);
    if (rc == 0 && local[1] > 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "another rank failed during evaluation");
    *loss = local[0] / ev->grid->data_size;
    return rc;
}

int neox_eval_split_perplexity(neox_evaluator *ev, int split, int64_t iters, neox_task_result *out, neox_error *err) {
    const neox_config *cfg = ev->cfg;
    *out = (neox_task_result){.task = neox_strdup(split == 1 ? "validation" : "test")};
    double start = neox_now();
    neox_data_settings s;
    if (neox_data_settings_from_config(cfg, &s, err) != 0) return -1;
    s.train_batch_size = neox_config_int(cfg, train_batch_size);
    s.train_iters = neox_config_int_or(cfg, train_iters, 0);
    neox_dataset *ds[3] = {0};
    int rc = neox_build_datasets(&s, ds, err);
    if (rc == 0 && ds[split]) ds[split]->vocab_size = ev->model->desc.vocab_size;
    if (rc == 0 && !ds[split])
        rc = neox_fail(err, NEOX_EXIT_USAGE, "split: the %s split has no samples", split == 1 ? "validation" : "test");
    if (iters <= 0) iters = neox_config_int(cfg, eval_iters);
    int64_t count = iters * neox_config_int(cfg, gradient_accumulation_steps);
    double loss = NAN, tokens_per_char = NAN;
    if (rc == 0) rc = mean_loss(ev, ds[split], count, &loss, &tokens_per_char, err);
    // The cap below would turn a NaN or inf loss into a finite perplexity: that is an error instead.
    if (rc == 0 && !isfinite(loss))
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: the mean loss over %lld batches is %g, not a number a model's "
                       "perplexity can be computed from", out->task, (long long)count, loss);
    if (rc == 0) {
        // GPT-NeoX caps the exponent at 20 when it reports lm_loss_ppl.
        out->metrics[out->nmetrics++] = (neox_metric){"lm_loss", loss, NAN, 0};
        out->metrics[out->nmetrics++] = (neox_metric){"lm_loss_ppl", exp(fmin(20.0, loss)), NAN, 0};
        if (!isnan(tokens_per_char))
            out->metrics[out->nmetrics++] = (neox_metric){"lm_loss_char_lvl_ppl", exp(loss * tokens_per_char), NAN, 0};
        out->examples = count * ev->micro_batch * ev->grid->data_size;
    }
    for (int i = 0; i < 3; i++) neox_dataset_free(ds[i]);
    neox_data_settings_release(&s);
    out->seconds = neox_now() - start;
    return rc;
}
