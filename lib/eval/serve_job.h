// serve_job.h: what neox-eval serve's engine (serve_engine.c) hands its response writer
// (serve_response.c): a request with, for each completion, the tokens it covers (the echoed prompt
// and the generated ones), their log-probabilities and top alternatives, and why it ended.
#ifndef NEOX_SERVE_JOB_H
#define NEOX_SERVE_JOB_H

#include "serve.h"

typedef struct neox_serve_choice {
    int32_t *tokens;         // echoed prompt tokens, then generated ones (malloc'ed)
    int nprompt, ngen;       // how many of each
    double *logprob;         // per token (NAN for the first prompt token); NULL without logprobs
    int32_t *top_ids;        // per token, request logprobs entries (the most likely first)
    double *top_logprob;
    int stop_at;             // >= 0: the generated text ends before this byte (a stop string)
    int finished;            // ended by end of document or a stop string, not by max_tokens
} neox_serve_choice;

struct neox_serve_job {
    neox_serve_request req;
    neox_serve_done done;
    neox_serve_gone gone;        // NULL: never asked
    void *ctx;
    neox_serve_choice *choices;  // req.nprompts x req.n, prompt-major
    int *owner;                  // per choice, the data-parallel rank computing it (NULL: this one)
    int left;                    // completions not yet ended (one rank's batched decoding)
    int failed;                  // computing it failed, with err
    neox_error err;
    long long id;
    struct neox_serve_job *next;
};

// ---- the engine's pieces the data-parallel ranks share (serve_engine.c) ----------------------------
// Scoring requests (echo with max_tokens 0, or one greedy token) are packed; the rest generate.
int neox_serve_is_scoring(const neox_serve_request *r);
// Allocates choice `index` of r for what computing it writes (its tokens, log-probabilities and
// top alternatives), the same on the rank that computes it and the rank that answers.
void neox_serve_choice_prepare(const neox_serve_request *r, int index, neox_serve_choice *c);
// Computes the choices of jobs[0..n) that `rank` owns (all of them without owners): the scoring
// ones packed together, then the generation ones; a failure marks its jobs failed.
void neox_serve_compute(neox_serve_engine *en, neox_serve_job **jobs, int n, int rank);
void neox_serve_job_free(neox_serve_job *job);
neox_evaluator *neox_serve_engine_evaluator(neox_serve_engine *en);

// ---- data-parallel serving (serve_ranks.c) -------------------------------------------------------
// Rank 0 answers HTTP and schedules; every batch it takes is broadcast to the other data-parallel
// ranks, each computes the choices assigned to it and sends them back. The assignment is a
// function of the batch alone, so every rank derives the same one.
void neox_serve_assign(neox_serve_job **jobs, int n, int ranks);
void neox_serve_share(neox_comm *c, neox_serve_job **jobs, int n);    // rank 0: the batch to all
void neox_serve_collect(neox_comm *c, neox_serve_job **jobs, int n);  // rank 0: the others' choices
void neox_serve_stop_workers(neox_comm *c);                           // rank 0: no more batches

// A token's text for the log-probability lists, and with bytes its UTF-8 bytes as a list of
// integers: a token that is no text of its own (part of a character, an id past the tokenizer such
// as a padding row of the embedding) is "<id N>".
struct json_t *neox_serve_token_json(const neox_evaluator *ev, int32_t id, struct json_t **bytes);
// A finished job's response body (malloc'ed): each choice through `choice`, under OpenAI's
// envelope (id "<id_prefix>-N", object, created, model, choices, usage).
typedef struct json_t *(*neox_serve_choice_json)(const neox_serve_job *job, const neox_evaluator *ev, int index,
                                                 neox_serve_error *e);
char *neox_serve_job_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name,
                          neox_serve_choice_json choice, const char *object, const char *id_prefix, neox_serve_error *e);
// The /v1/completions response body of a finished job (malloc'ed).
char *neox_serve_completion_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name,
                                 neox_serve_error *e);
void neox_serve_choice_release(neox_serve_choice *c);
// The text a choice generated: without the end-of-text token that finished it, cut before a stop
// string (malloc'ed; NULL with err set when it cannot be decoded).
char *neox_serve_generated_text(const neox_evaluator *ev, const neox_serve_choice *c, size_t *size, neox_error *err);

// /v1/chat/completions (serve_chat.c): the conversation of a chat request rendered into its prompt's
// text (400 when the server has no template or the template refuses it), and the chat.completion
// body of a finished chat job.
int neox_serve_render_chat(const neox_serve_options *o, neox_serve_request *r, neox_serve_error *e);
char *neox_serve_chat_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name, neox_serve_error *e);

#endif
