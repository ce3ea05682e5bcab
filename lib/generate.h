// generate.h: autoregressive text generation from a neox_model (lib/model/generate.c): greedy or
// sampled (temperature, top-k, top-p as GPT-NeoX's generate.py filters them), with a key/value
// cache (each new token costs one position of compute) or by recomputing the whole sequence for
// every token (GPT-NeoX's `recompute`); both give the same tokens.
#ifndef NEOX_GENERATE_H
#define NEOX_GENERATE_H

#include <stdint.h>

#include "core.h"
#include "model.h"

typedef struct neox_sampling {
    double temperature;       // 0 with top_k 0 and top_p 0: greedy (argmax)
    int top_k;                // keep the k most likely tokens (0: all)
    double top_p;             // keep the smallest set with probability > top_p (0: all)
    unsigned long long seed;  // draw i of a completion is neox_uniform(seed, i)
    int vocab;                // only ids below this are generated (the tokenizer's size; the padded
                              // rows of the embedding are no tokens); 0: every id
    int keep_logits;          // return each generated token's logits in neox_generation.logits
} neox_sampling;

typedef struct neox_generator neox_generator;

// max_len: the longest sequence (prompt + generated), at most the model's context (seq_length).
// recompute: run the full forward for every new token instead of using the cache.
neox_generator *neox_generator_create(neox_model *m, int max_len, int recompute, neox_error *err);
// A scorer whose passes hold up to `rows` rows of packed sequences (neox_generator_score_packed),
// each sequence at most max_len positions: packs of many short requests make the products of a
// pass large whatever the context, while positions stay within the model's.
neox_generator *neox_generator_create_packed(neox_model *m, int rows, int max_len, neox_error *err);
// The rows a scoring pass packs at least (neox-eval's tasks, neox-eval serve): with a short context
// a pass of context rows holds a few requests, too few rows for the products to run at the GEMM's rate.
#define NEOX_SCORE_PACK_ROWS 2048
// The rows one pass of g holds.
int neox_generator_rows(const neox_generator *g);
void neox_generator_free(neox_generator *g);

typedef struct neox_generation {
    int32_t *tokens;          // generated ids (malloc'ed; free())
    int n;
    int finished;             // stopped at a stop token (end of document), not by a length limit
    float *logits;            // with keep_logits: (n, padded vocabulary), the model's logits each token
                              // was chosen from, before temperature and filtering (malloc'ed; free())
} neox_generation;

// Generates up to max_new tokens after the prompt (1 <= nprompt < max_len), stopping after any of
// the stop ids (kept in the output) or when the sequence reaches max_len. A prompt that does not
// leave room for one token is a usage error.
int neox_generate(neox_generator *g, const int32_t *prompt, int nprompt, int max_new, const neox_sampling *s,
                  const int32_t *stop, int nstop, neox_generation *out, neox_error *err);
// Called after each generated token with the logits (vocab) it was drawn from and the tokens so
// far; a nonzero return stops the generation there (the token is kept; out->finished is set).
// neox-eval serve stops on stop strings and reports log-probabilities with it.
typedef int (*neox_token_hook)(void *ctx, const int32_t *generated, int n, const float *logits);
// neox_generate with a hook (NULL: none).
int neox_generate_hooked(neox_generator *g, const int32_t *prompt, int nprompt, int max_new, const neox_sampling *s,
                         const int32_t *stop, int nstop, neox_token_hook hook, void *ctx, neox_generation *out,
                         neox_error *err);
// The vocabulary logits of the last position scored (after neox_generate: the last step).
const float *neox_generator_logits(const neox_generator *g);
// Scoring (neox-eval): runs ids[0..n) (n <= max_len) from position 0 through the cached decoder
// and the final norm of its last `last` positions; neox_generator_score_logits then gives the
// logits of `count` of those rows from row j (0 = position n - last), (count, vocab). Only the rows
// asked for go through the output layer, which dominates the cost when few positions are scored.
int neox_generator_score(neox_generator *g, const int32_t *ids, int n, int last, neox_error *err);
void neox_generator_score_logits(neox_generator *g, int j, int count, float *logits);
// Scores nseq sequences in one pass: sequence b is lens[b] ids of ids, packed one after the other
// (each at most max_len, at most the scorer's rows in all), each from position 0 and attending only to itself. Packing several
// requests reads every weight once for all of them. The final norm covers every row, so
// neox_generator_rows_logits then takes packed rows: row r0 + t is position t of the sequence
// packed from r0.
int neox_generator_score_packed(neox_generator *g, const int32_t *ids, const int *lens, int nseq, neox_error *err);
// The logits (count, vocab) of the given rows of the last scoring (count <= max_len), in one pass
// through the output layer.
void neox_generator_rows_logits(neox_generator *g, const int *rows, int count, float *logits);

// ---- batched decoding --------------------------------------------------------------------------
// A decoder for up to `slots` sequences at once (1 <= slots <= NEOX_DECODE_MAX_ROWS), each with a
// key/value cache of its own for up to max_len positions: one decoding step takes the next token
// of every active sequence through the model together, reading the weights once for all of them.
// On the CPU each sequence's logits are exactly those it would get decoded alone.
neox_generator *neox_generator_create_batch(neox_model *m, int slots, int max_len, neox_error *err);
int neox_generator_slots(const neox_generator *g);  // 0 for the other generators
// Starts sequence `slot` over (its cache emptied) with the prompt (1 <= n < max_len): its last
// position's logits into neox_generator_slot_logits.
int neox_generator_prefill(neox_generator *g, int slot, const int32_t *prompt, int n, neox_error *err);
// One step: tokens[i] appended to sequence slots[i] (distinct, each started and not full) for i <
// count, in one pass; each one's next logits into neox_generator_slot_logits.
int neox_generator_decode(neox_generator *g, const int *slots, const int32_t *tokens, int count, neox_error *err);
const float *neox_generator_slot_logits(const neox_generator *g, int slot);  // (vocab)
int neox_generator_slot_len(const neox_generator *g, int slot);              // positions so far

// The next token from logits (vocab V) under s: greedy, or draw *draws of s->seed (then counted),
// as neox_generate chooses.
int neox_sample_token(const float *logits, int V, const neox_sampling *s, unsigned long long *draws);

#endif
