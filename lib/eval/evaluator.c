// evaluator.c: the evaluator's set-up (tokenizer, model, checkpoint) and the loglikelihood engine
// every task is built on: requests tokenized as lm-evaluation-harness tokenizes them, packed
// several to a pass through the decoder (up to NEOX_SCORE_PACK_ROWS rows, or seq_length if more, each
// request in its own positions, at most seq_length of them)
// with only their continuations' positions through the output layer (lib/generate.h's scoring
// path), scored from the logits (cross-entropy kernel, greedy check) and spread over the
// data-parallel ranks.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "eval.h"
#include "generate.h"
#include "kernels/kernels.h"

// ---- what ends a generated text -----------------------------------------------------------------
static int add_end_id(neox_evaluator *ev, int32_t id, const char *what, neox_error *err) {
    if (id < 0) return 0;
    for (int i = 0; i < ev->nend; i++)
        if (ev->end_ids[i] == id) return 0;
    if (ev->nend == NEOX_EVAL_MAX_END_IDS)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: more than %d end-of-text ids", what, NEOX_EVAL_MAX_END_IDS);
    ev->end_ids[ev->nend++] = id;
    return 0;
}

// generation_config.json beside the vocab file (a Hugging Face model's, which from-hf keeps there):
// its eos_token_id, an id or a list (Llama 3.1 Instruct stops at three), ends generation as in
// transformers' generate().
static int generation_config_stops(neox_evaluator *ev, const char *vocab_file, neox_error *err) {
    if (!vocab_file) return 0;
    char *path = neox_path_beside(vocab_file, "generation_config.json");
    int rc = 0;
    if (access(path, F_OK) == 0) {
        json_error_t jerr;
        json_t *root = json_load_file(path, 0, &jerr), *eos = json_object_get(root, "eos_token_id");
        int64_t vocab = neox_tokenizer_vocab_size(ev->tokenizer);
        if (!root) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d: %s", path, jerr.line, jerr.text);
        size_t n = json_is_array(eos) ? json_array_size(eos) : eos && !json_is_null(eos) ? 1 : 0;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            json_t *one = json_is_array(eos) ? json_array_get(eos, i) : eos;
            if (!json_is_integer(one) || json_integer_value(one) < 0 || json_integer_value(one) >= vocab)
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: eos_token_id is not a token id of the tokenizer (%lld ids)",
                               path, (long long)vocab);
            else rc = add_end_id(ev, (int32_t)json_integer_value(one), path, err);
        }
        json_decref(root);
    }
    free(path);
    return rc;
}

static int end_ids(neox_evaluator *ev, const char *vocab_file, neox_error *err) {
    if (add_end_id(ev, ev->eod_id, "the end of document", err) != 0 ||
        add_end_id(ev, neox_tokenizer_declared_id(ev->tokenizer, NEOX_SPECIAL_EOS), "eos_token", err) != 0)
        return -1;
    return generation_config_stops(ev, vocab_file, err);
}

static int load_checkpoint(neox_evaluator *ev, neox_error *err) {
    const char *load = neox_config_str(ev->cfg, load);
    if (!load) {
        if (ev->rank0 && !ev->quiet) neox_notice("load: not set; evaluating the initial (untrained) weights");
        return 0;
    }
    int64_t iteration = neox_config_int_or(ev->cfg, iteration, 0);
    if (neox_load_model_params(ev->model, load, iteration, &ev->iteration, err) != 0) return -1;
    if (ev->rank0 && !ev->quiet) neox_info("loaded checkpoint %s (iteration %lld)", load, (long long)ev->iteration);
    return 0;
}

neox_evaluator *neox_evaluator_create(const neox_config *cfg, neox_grid *grid, int quiet, neox_error *err) {
    neox_evaluator *ev = neox_calloc(1, sizeof *ev);
    ev->cfg = cfg;
    ev->grid = grid;
    ev->quiet = quiet;
    ev->rank0 = grid->world_rank == 0;
    ev->seq_length = (int)neox_config_int(cfg, seq_length);
    ev->micro_batch = (int)neox_config_int(cfg, train_micro_batch_size_per_gpu);
    if (grid->model_size > 1 || grid->pipe_size > 1) {
        neox_fail(err, NEOX_EXIT_USAGE, "neox-eval runs data parallel only (a grid with pipe and model size 1)");
        goto fail;
    }
    neox_tokenizer_options to = {neox_config_str(cfg, tokenizer_type), neox_config_str(cfg, vocab_file),
                                 neox_config_str(cfg, merge_file)};
    ev->tokenizer = neox_tokenizer_load(&to, err);
    if (!ev->tokenizer) {
        neox_fail_context(err, "tokenizer_type %s", to.type ? to.type : "None");
        goto fail;
    }
    ev->eod_id = neox_tokenizer_eod_id(ev->tokenizer);
    if (end_ids(ev, to.vocab_file, err) != 0) goto fail;
    int32_t bos = neox_tokenizer_bos_id(ev->tokenizer);
    ev->prefix_id = bos >= 0 ? bos : ev->eod_id;
    neox_model_desc desc;
    if (neox_model_desc_from_config(&desc, cfg, neox_tokenizer_vocab_size(ev->tokenizer), err) != 0) goto fail;
    if (desc.value_head) {
        neox_fail(err, NEOX_EXIT_USAGE, "train_impl rm: a reward model gives one value per sequence and predicts no "
                  "tokens, so perplexity, tasks and generation do not apply (export it with neox-convert to-hf and score "
                  "sequences with transformers' ...ForSequenceClassification)");
        goto fail;
    }
    const neox_backend *be = neox_backend_for_rank(neox_config_str(cfg, compute_backend), grid, err);
    if (!be || !(ev->model = neox_model_create_on(&desc, be, err))) goto fail;
    // The checkpoint overwrites every parameter (a piece it lacks is an error), so the random
    // initialisation, as long as reading the checkpoint for a large model, is only for a config
    // without `load`.
    if (!neox_config_str(cfg, load)) neox_model_init(ev->model, (unsigned long long)neox_config_int(cfg, seed));
    ev->model->training = 0;
    if (load_checkpoint(ev, err) != 0) goto fail;
    // Under bfloat16 the products run on the weights' bfloat16 copy, as in training (half the bytes
    // each generated token streams), and so under fp8 (whose generation is bfloat16's: docs/model.md,
    // "FP8 training"); fp16 stays fp32 here (lib/model/generate.c says why).
    const char *precision = neox_config_str(cfg, precision);
    if (precision && (!strcmp(precision, "bfloat16") || !strcmp(precision, "fp8")))
        neox_model_set_precision(ev->model, NEOX_PRECISION_BF16);
    return ev;
fail:
    neox_evaluator_free(ev);
    return NULL;
}

void neox_evaluator_free(neox_evaluator *ev) {
    if (!ev) return;
    neox_generator_free(ev->scorer);
    neox_model_free(ev->model);
    if (ev->tokenizer) neox_tokenizer_free(ev->tokenizer);
    free(ev);
}

int neox_evaluator_ends_text(const neox_evaluator *ev, int32_t id) {
    for (int i = 0; i < ev->nend; i++)
        if (id >= 0 && id == ev->end_ids[i]) return 1;
    return 0;
}

// ---- tokenizing requests ------------------------------------------------------------------------
static int encode(const neox_evaluator *ev, const char *text, size_t size, int32_t **ids, int *n, neox_error *err) {
    size_t len = 0, cap = 0;
    *ids = NULL;
    if (neox_tokenizer_encode(ev->tokenizer, text, size, ids, &len, &cap, err) < 0) {
        free(*ids);
        *ids = NULL;
        return -1;
    }
    *n = (int)len;
    return 0;
}

int neox_eval_encode_pair(const neox_evaluator *ev, const char *ctx, const char *cont, neox_ll_request *out,
                          neox_error *err) {
    *out = (neox_ll_request){0};
    size_t nctx = strlen(ctx), ncont = strlen(cont);
    if (nctx == 0) {
        out->ctx = neox_malloc(sizeof(int32_t));
        out->ctx[0] = ev->prefix_id;
        out->nctx = 1;
        if (encode(ev, cont, ncont, &out->cont, &out->ncont, err) != 0) {
            neox_ll_request_release(out);
            return -1;
        }
    } else {
        // Trailing spaces of the context belong to the continuation (BPE merges a space into the
        // word after it).
        size_t keep = nctx;
        while (keep > 0 && ctx[keep - 1] == ' ') keep--;
        char *whole = neox_malloc(nctx + ncont + 1);
        memcpy(whole, ctx, nctx);
        memcpy(whole + nctx, cont, ncont + 1);
        int32_t *all;
        int nall;
        int rc = encode(ev, whole, nctx + ncont, &all, &nall, err);
        free(whole);
        if (rc != 0) return -1;
        if (encode(ev, ctx, keep, &out->ctx, &out->nctx, err) != 0) {
            free(all);
            return -1;
        }
        int start = out->nctx < nall ? out->nctx : nall;
        out->ncont = nall - start;
        out->cont = neox_malloc(((size_t)out->ncont + 1) * sizeof(int32_t));
        memcpy(out->cont, all + start, (size_t)out->ncont * sizeof(int32_t));
        free(all);
    }
    if (out->ncont == 0) {
        neox_ll_request_release(out);
        return neox_fail(err, NEOX_EXIT_USAGE, "the continuation '%s' has no tokens", cont);
    }
    return 0;
}

void neox_ll_request_release(neox_ll_request *r) {
    free(r->ctx);
    free(r->cont);
    *r = (neox_ll_request){0};
}

// ---- rolling windows ----------------------------------------------------------------------------
static neox_ll_request window(const int32_t *ctx, int nctx, const int32_t *cont, int ncont) {
    neox_ll_request r = {neox_malloc(((size_t)nctx + 1) * sizeof(int32_t)), neox_malloc(((size_t)ncont + 1) * sizeof(int32_t)),
                         nctx, ncont};
    memcpy(r.ctx, ctx, (size_t)nctx * sizeof(int32_t));
    memcpy(r.cont, cont, (size_t)ncont * sizeof(int32_t));
    return r;
}

int64_t neox_rolling_windows(const int32_t *tokens, int64_t n, int32_t prefix, int max_len, neox_ll_request **out) {
    *out = NULL;
    if (n <= 0) return 0;
    int64_t count = 1 + (n > max_len ? (n - max_len + max_len - 1) / max_len : 0), w = 0;
    *out = neox_calloc((size_t)count, sizeof **out);
    // The first window predicts its tokens from the prefix token alone (after make_disjoint_window
    // the context is just [prefix]).
    int64_t first = n < max_len ? n : max_len;
    (*out)[w++] = window(&prefix, 1, tokens, (int)first);
    // Each later window predicts the next up to max_len tokens; its context is the one token
    // before them, plus earlier ones so that the input fills max_len positions.
    for (int64_t predicted = first; predicted < n;) {
        int64_t len = n - predicted < max_len ? n - predicted : max_len, end = predicted + len;
        int64_t ctx_begin = end - max_len - 1, nctx = max_len + 1 - len;
        (*out)[w++] = window(tokens + ctx_begin, (int)nctx, tokens + predicted, (int)len);
        predicted = end;
    }
    return w;
}

// ---- scoring ------------------------------------------------------------------------------------
// Rows of logits computed at a time (bounds memory for long continuations and large vocabularies).
#define SCORE_CHUNK 32

// Rows of one pass through the decoder: NEOX_SCORE_PACK_ROWS, or seq_length if more.
static int pack_rows(const neox_evaluator *ev) {
    return ev->seq_length > NEOX_SCORE_PACK_ROWS ? ev->seq_length : NEOX_SCORE_PACK_ROWS;
}

static int input_length(const neox_ll_request *r, int max_len) {
    int total = r->nctx + r->ncont;
    return (total > max_len + 1 ? max_len + 1 : total) - 1;
}

// Buffers for scoring one pack of requests; every count is at most pack_rows (each request
// contributes at least one row).
typedef struct score_buffers {
    int32_t *ids;            // the packed inputs
    int *lens, *reqs;        // each packed request's input length and index
    int *rows, *targets, *owner;  // every scored position: packed row, target id, which request
    float *logits, *losses, *lse;
} score_buffers;

static void buffers_alloc(score_buffers *b, int max_len, int V) {
    size_t n = (size_t)max_len + 1;
    *b = (score_buffers){neox_malloc(n * sizeof(int32_t)), neox_malloc(n * sizeof(int)), neox_malloc(n * sizeof(int)),
                         neox_malloc(n * sizeof(int)), neox_malloc(n * sizeof(int)), neox_malloc(n * sizeof(int)),
                         neox_malloc((size_t)SCORE_CHUNK * V * sizeof(float)), neox_malloc(SCORE_CHUNK * sizeof(float)),
                         neox_malloc(SCORE_CHUNK * sizeof(float))};
}

static void buffers_free(score_buffers *b) {
    void *all[] = {b->ids, b->lens, b->reqs, b->rows, b->targets, b->owner, b->logits, b->losses, b->lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

// Packs request i's truncated input (the last seq_length + 1 tokens of context + continuation,
// minus the last) at row `at`, and its scored positions (the continuation's, never more than the
// input predicts) into the target lists; returns the input length.
static int pack_request(const neox_ll_request *r, int owner, int at, int max_len, score_buffers *b, int *ntargets) {
    int len = input_length(r, max_len), start = r->nctx + r->ncont - (len + 1);
    for (int t = 0; t < len; t++) {
        int i = start + t;
        b->ids[at + t] = i < r->nctx ? r->ctx[i] : r->cont[i - r->nctx];
    }
    int ncont = r->ncont < len ? r->ncont : len;
    for (int t = 0; t < ncont; t++) {
        b->rows[*ntargets] = at + len - ncont + t;
        b->targets[*ntargets] = r->cont[r->ncont - ncont + t];
        b->owner[(*ntargets)++] = owner;
    }
    return len;
}

// The scored positions' logits, SCORE_CHUNK rows per pass through the output layer: -log p of
// each target from the cross-entropy kernel, and whether it is the argmax.
static void score_targets(neox_evaluator *ev, score_buffers *b, int ntargets, neox_ll_result *res) {
    int V = ev->model->desc.vocab_size;
    for (int j0 = 0; j0 < ntargets; j0 += SCORE_CHUNK) {
        int count = ntargets - j0 < SCORE_CHUNK ? ntargets - j0 : SCORE_CHUNK;
        neox_generator_rows_logits(ev->scorer, b->rows + j0, count, b->logits);
        neox_cross_entropy_forward(b->losses, b->lse, b->logits, b->targets + j0, count, V, NEOX_ELEM_F32);
        for (int j = 0; j < count; j++) {
            const float *row = b->logits + (size_t)j * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            neox_ll_result *r = &res[b->owner[j0 + j]];
            r->ll -= b->losses[j];
            if (best != b->targets[j0 + j]) r->greedy = 0;
        }
    }
}

// Scores this rank's requests from *next (every dp-th) as one pack: as many as fit pack_rows rows
// run through the decoder together, each in its own positions. Advances *next.
static int score_pack(neox_evaluator *ev, const neox_ll_request *reqs, int64_t n, int64_t *next, score_buffers *b,
                      double *ll, double *greedy, neox_error *err) {
    int dp = ev->grid->data_size, rows = 0, count = 0, ntargets = 0;
    while (*next < n && rows + input_length(&reqs[*next], ev->seq_length) <= pack_rows(ev)) {
        b->reqs[count] = (int)*next;
        b->lens[count] = pack_request(&reqs[*next], count, rows, ev->seq_length, b, &ntargets);
        rows += b->lens[count++];
        *next += dp;
    }
    if (neox_generator_score_packed(ev->scorer, b->ids, b->lens, count, err) != 0) return -1;
    ev->tokens_scored += rows;
    neox_ll_result res[count];
    for (int i = 0; i < count; i++) res[i] = (neox_ll_result){0.0, 1};
    score_targets(ev, b, ntargets, res);
    for (int i = 0; i < count; i++) ll[b->reqs[i]] = res[i].ll, greedy[b->reqs[i]] = res[i].greedy;
    return 0;
}

static void show_progress(neox_progress *bar, double done, double start, int finish) {
    char extra[32];
    snprintf(extra, sizeof extra, "%.1f examples/s", done / (neox_now() - start + 1e-9));
    if (finish) neox_progress_finish(bar, done, extra);
    else neox_progress_update(bar, done, extra);
}

int neox_eval_loglikelihood(neox_evaluator *ev, const neox_ll_request *reqs, int64_t n, neox_ll_result *out,
                            const char *label, neox_error *err) {
    int dp = ev->grid->data_size;
    if (!ev->scorer && !(ev->scorer = neox_generator_create_packed(ev->model, pack_rows(ev), ev->seq_length, err)))
        return -1;
    double *ll = neox_calloc((size_t)n + 1, sizeof *ll), *greedy = neox_calloc((size_t)n + 1, sizeof *greedy);
    score_buffers b;
    buffers_alloc(&b, pack_rows(ev), ev->model->desc.vocab_size);
    neox_progress *bar = ev->rank0 && !ev->quiet ? neox_progress_start(label, (double)n, "examples") : NULL;
    int rc = 0;
    double start = neox_now(), last_update = 0.0;
    // Rank r takes requests r, r + dp, ...
    for (int64_t next = ev->grid->data_rank; next < n && rc == 0;) {
        rc = score_pack(ev, reqs, n, &next, &b, ll, greedy, err);
        if (bar && neox_now() - last_update > 0.2) {
            show_progress(bar, (double)(next < n ? next : n), start, 0);
            last_update = neox_now();
        }
    }
    ev->forward_seconds += neox_now() - start;
    // Every rank fails together: a rank that stopped early would leave the others waiting.
    int failed = rc != 0;
    if (dp > 1) {
        neox_allreduce_sum(&ev->grid->data, &failed, 1, NEOX_I32);
        neox_allreduce_sum(&ev->grid->data, ll, (size_t)n, NEOX_F64);
        neox_allreduce_sum(&ev->grid->data, greedy, (size_t)n, NEOX_F64);
    }
    if (bar) show_progress(bar, (double)n, start, 1);
    if (failed && rc == 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "another rank failed while scoring %s", label);
    for (int64_t i = 0; i < n && rc == 0; i++) out[i] = (neox_ll_result){ll[i], greedy[i] > 0.5};
    buffers_free(&b);
    free(ll);
    free(greedy);
    return rc;
}
