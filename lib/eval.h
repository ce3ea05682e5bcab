// eval.h: neox-eval's evaluation — perplexity of the valid and test splits (the samples training
// evaluates on), lm-evaluation-harness 0.4 tasks scored from local files (lambada_openai, piqa,
// wikitext) and the generic multiple-choice and loglikelihood jsonl formats, the results table
// and the eval_results JSON file. Work is spread over the data-parallel ranks; every rank ends
// with the same results. docs/eval.md describes tasks, formats and metrics.
#ifndef NEOX_EVAL_H
#define NEOX_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "core.h"
#include "model.h"
#include "parallel.h"
#include "tokenizer.h"

enum { NEOX_EVAL_MAX_END_IDS = 16 };

typedef struct neox_evaluator {
    const neox_config *cfg;      // outlives the evaluator
    neox_grid *grid;
    int rank0, quiet;
    neox_tokenizer *tokenizer;
    int32_t eod_id;
    int32_t end_ids[NEOX_EVAL_MAX_END_IDS];  // what ends a generated text: eod, the declared
    int nend;                    // eos_token and generation_config.json's eos_token_id(s) (each once)
    int32_t prefix_id;           // before rolling windows and empty contexts: the tokenizer's bos when
                                 // it declares one, else eod (the harness's HFLM.prefix_token_id)
    neox_model *model;
    int64_t iteration;           // of the loaded checkpoint (0: none loaded)
    int seq_length;              // the longest sequence scored (the harness's max_length)
    int micro_batch;             // samples per forward (split perplexity)
    struct neox_generator *scorer;  // the decoder path that scores requests (lib/generate.h)
    int64_t tokens_scored;       // this rank's scored input tokens (for tokens/s)
    double forward_seconds;
} neox_evaluator;

// Loads the tokenizer, builds the model from cfg and reads the checkpoint `load` names (the
// `iteration` key picks one; otherwise `latest`). A config without `load` evaluates the initial
// weights (with a notice).
neox_evaluator *neox_evaluator_create(const neox_config *cfg, neox_grid *grid, int quiet, neox_error *err);
void neox_evaluator_free(neox_evaluator *ev);
// 1 when id ends a generated text (one of end_ids).
int neox_evaluator_ends_text(const neox_evaluator *ev, int32_t id);

// ---- results ------------------------------------------------------------------------------------
#define NEOX_EVAL_MAX_METRICS 6
typedef struct neox_metric {
    const char *name;        // "acc", "perplexity", ... (static strings)
    double value;
    double stderr_value;
    int has_stderr;          // 0: the harness reports "N/A"
} neox_metric;

typedef struct neox_task_result {
    char *task;              // malloc'ed
    int64_t examples;
    int nmetrics;
    neox_metric metrics[NEOX_EVAL_MAX_METRICS];
    double seconds;
} neox_task_result;

void neox_task_result_release(neox_task_result *r);
// The table as lm-evaluation-harness prints it: Tasks | n | Metric | Value | Stderr.
void neox_eval_print_table(FILE *out, const neox_task_result *r, int n);
// Writes {"results": {task: {"METRIC,none": v, "METRIC_stderr,none": s|"N/A"}}, "n-samples": ...,
// "config": ...} atomically to path.
int neox_eval_write_results(const char *path, const neox_task_result *r, int n, const neox_evaluator *ev,
                            neox_error *err);
// GPT-NeoX's name: {prefix}_eval_results_yy-mm-dd-HH-MM.json (eval_results_... without a prefix).
char *neox_eval_results_path(const char *prefix);

// ---- perplexity of a data split -------------------------------------------------------------
// lm_loss (the mean of the micro-batch mask-weighted mean losses, as training reports it) and
// lm_loss_ppl over eval_iters x gradient_accumulation_steps global batches of split 1 (valid) or
// 2 (test) from the start of the split. iters <= 0 takes eval_iters.
int neox_eval_split_perplexity(neox_evaluator *ev, int split, int64_t iters, neox_task_result *out, neox_error *err);

// char_level_ppl: tokens per character of the count micro-batches `from` would give next (read
// from a copy of it), summed over the data group (NULL: one rank); GPT-NeoX's character-level
// perplexity is exp(lm_loss x *tokens_per_char). Collective over data.
typedef struct neox_batch_iterator neox_batch_iterator;
int neox_eval_tokens_per_char(const neox_tokenizer *tok, const neox_batch_iterator *from, int seq_length, int64_t count,
                              neox_comm *data, double *tokens_per_char, neox_error *err);

// ---- tasks ----------------------------------------------------------------------------------
typedef struct neox_task_options {
    const char *data_dir;    // where lambada_test.jsonl, piqa_valid*.jsonl/.lst and wikitext files are
    int64_t limit;           // at most this many examples per task (0: all)
    int64_t bootstrap_iters; // the harness's bootstrap_iters (its default 100000): resamples for the
                             // standard error of perplexity; 0 reports no standard errors at all
} neox_task_options;

// Runs one task by name: lambada_openai, piqa, wikitext, mc:FILE.jsonl, loglikelihood:FILE.jsonl,
// rolling:FILE.jsonl. An unknown name is a usage error listing the known ones.
int neox_eval_task(neox_evaluator *ev, const char *name, const neox_task_options *o, neox_task_result *out,
                   neox_error *err);

// ---- the loglikelihood engine (lm-evaluation-harness's loglikelihood requests) ----------------
typedef struct neox_ll_request {
    int32_t *ctx, *cont;     // token ids (malloc'ed)
    int nctx, ncont;         // ncont >= 1
} neox_ll_request;

typedef struct neox_ll_result {
    double ll;               // sum of log p(cont | ctx)
    int greedy;              // every continuation token is the argmax
} neox_ll_result;

// Tokenizes a (context, continuation) pair as the harness's _encode_pair: trailing spaces of the
// context move to the continuation, the continuation's ids are those of the whole text after the
// context's, and an empty context becomes [prefix_id].
int neox_eval_encode_pair(const neox_evaluator *ev, const char *ctx, const char *cont, neox_ll_request *out,
                          neox_error *err);
void neox_ll_request_release(neox_ll_request *r);
// Scores every request: the input is (ctx + cont) cut to its last seq_length + 1 tokens minus the
// last one, and the continuation is scored at the last ncont positions (at most the input's
// length). Requests are spread over the data-parallel ranks; every rank gets every result. label
// names the progress bar.
int neox_eval_loglikelihood(neox_evaluator *ev, const neox_ll_request *reqs, int64_t n, neox_ll_result *out,
                            const char *label, neox_error *err);
// The harness's rolling windows (get_rolling_token_windows with context_len 1, then
// make_disjoint_window) over tokens: disjoint requests that together score every token once.
// Returns the number of windows (*out malloc'ed; release each).
int64_t neox_rolling_windows(const int32_t *tokens, int64_t n, int32_t prefix, int max_len, neox_ll_request **out);

// ---- work shared over the data-parallel ranks (lib/eval/shared_records.c) ----------------------
// 0 when rc is 0 on every rank of dp; else -1, and a rank that did not fail gets "another rank failed
// while DOING" with the failure's exit status.
int neox_eval_ranks_agree(neox_comm *dp, int rc, const char *doing, neox_error *err);
// Item k's record (malloc'ed text), or NULL with err set.
typedef char *(*neox_record_maker)(void *ctx, int64_t k, neox_error *err);
typedef void (*neox_record_sink)(void *ctx, int64_t k, const char *record);
// Items 0..n-1 shared k to rank k % size: each rank makes its own records, then rank 0 emits every
// record in item order. Fails on every rank when any rank's make fails.
int neox_eval_share_records(neox_comm *dp, int64_t n, neox_record_maker make, neox_record_sink emit, void *ctx,
                            const char *doing, neox_error *err);
// *sum summed and *max maximised over the ranks of dp (a rate: tokens over the slowest rank's time).
void neox_eval_sum_and_max(neox_comm *dp, double *sum, double *max);

// ---- the harness's bootstrap (lib/eval/bootstrap.c) -------------------------------------------
// lm-evaluation-harness 0.4's bootstrap_stderr for perplexity, draw for draw: iters resamples in
// chunks of neox_bootstrap_chunk(iters) = min(1000, iters), chunk c drawn by Python's
// random.Random(c).choices(ll, k=n), each resample's exp(-mean); neox_bootstrap_count(iters) =
// iters // chunk x chunk resamples in all. neox_bootstrap_perplexity fills the resamples of chunks
// part, part + parts, ... (a data-parallel rank's share) at their places in replicates; the
// standard error is neox_sample_stddev of all of them.
int64_t neox_bootstrap_chunk(int64_t iters);
int64_t neox_bootstrap_count(int64_t iters);
void neox_bootstrap_perplexity(const double *ll, int64_t n, int64_t iters, int part, int parts, double *replicates);
// The harness's sample_stddev: sqrt(sum((x - mean)^2) / (n - 1)); NaN for n < 2.
double neox_sample_stddev(const double *x, int64_t n);
// Python's random.Random(seed).random() after k earlier calls (for tests of the generator).
double neox_python_random(uint64_t seed, int64_t k);

// The harness's wikitext_detokenizer (lm_eval/tasks/wikitext/preprocess_wikitext.py): a new string.
char *neox_wikitext_detokenize(const char *text);
// len(re.split(r"\s+", s)) with Python's Unicode whitespace.
int64_t neox_count_words(const char *s, size_t n);
// len(s) of a Python str: code points of UTF-8 text.
int64_t neox_count_codepoints(const char *s);

#endif
