// serve.h: neox-eval serve, an OpenAI-compatible completions server over a loaded evaluator —
// request parsing and validation (lib/eval/serve_request.c; chat bodies in serve_chat.c), the
// scoring and generation engine
// with its batching scheduler (lib/eval/serve_engine.c), the JSON responses
// (lib/eval/serve_response.c) and the HTTP front end on libmicrohttpd (lib/eval/serve_http.c).
// docs/eval.md describes the API, its limits and how lm-evaluation-harness talks to it.
#ifndef NEOX_SERVE_H
#define NEOX_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "eval.h"

// ---- requests -----------------------------------------------------------------------------------
#define NEOX_SERVE_MAX_LOGPROBS 20   // the most top_logprobs entries a token may ask for
#define NEOX_SERVE_MAX_N 16          // the most completions per prompt
#define NEOX_SERVE_MAX_STOP 8        // the most stop strings

typedef struct neox_serve_prompt {
    char *text;              // the prompt as text (NULL when given as token ids)
    int32_t *ids;            // token ids: given, or the text's once tokenized
    int nids;
} neox_serve_prompt;

typedef struct neox_serve_request {
    char *model;             // NULL: not given
    neox_serve_prompt *prompts;
    int nprompts;
    int max_tokens;          // tokens to generate (OpenAI's default 16)
    double temperature;      // 0: greedy
    double top_p;            // 1: all
    int top_k;               // 0 or -1: all
    int has_seed;
    unsigned long long seed;
    char *stop[NEOX_SERVE_MAX_STOP];
    int nstop;
    int echo;                // the prompt is part of the returned text and log-probabilities
    int logprobs;            // -1: none; else top_logprobs entries per token (0 gives the chosen token's only)
    int n;                   // completions per prompt
    // /v1/chat/completions: the conversation, rendered with the chat template into the one
    // prompt's text when the request is submitted; max_tokens -1 there means "up to the context".
    int chat;
    struct json_t *messages; // owned (a reference)
} neox_serve_request;

// An error answered to the client: HTTP status, OpenAI's error type and the parameter at fault.
typedef struct neox_serve_error {
    int http_status;
    const char *type;        // "invalid_request_error", "not_found_error", ... (static)
    char param[64];          // the request field at fault ("" when none)
    char message[512];
} neox_serve_error;

int neox_serve_error_set(neox_serve_error *e, int http_status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Parses and validates a /v1/completions body (size bytes, not NUL-terminated). Every field is
// checked for type and range; unknown fields are refused by name. Returns 0, or -1 with e set
// (status 400). Prompts given as text stay untokenized (neox_serve_tokenize).
int neox_serve_parse_request(const char *body, size_t size, neox_serve_request *out, neox_serve_error *e);
void neox_serve_request_release(neox_serve_request *r);
// The same for a /v1/chat/completions body: `messages` (a list of {"role", "content"[, "name"]}
// with string contents), OpenAI's chat fields (`logprobs` true with `top_logprobs`,
// `max_completion_tokens`) and the sampling fields of completions; `prompt` and `echo` are refused.
int neox_serve_parse_chat_request(const char *body, size_t size, neox_serve_request *out, neox_serve_error *e);

// The fuzzing entry point for the request parsers (completions and chat): any bytes, never a crash
// or a leak. Returns 0.
int neox_serve_fuzz_request(const uint8_t *data, size_t size);

// ---- the engine ---------------------------------------------------------------------------------
typedef struct neox_serve_options {
    const char *model_name;  // the id /v1/models lists and requests may name
    int context;             // the longest sequence (prompt + generated) in tokens
    int max_prompt_tokens;   // longer prompts are refused (<= context)
    int queue_size;          // requests waiting or running at once; more are answered 503
    int decode_slots;        // completions decoded together, one pass over the weights per token
                             // (1..NEOX_DECODE_MAX_ROWS; one data-parallel rank)
    const neox_chat_format *chat;  // renders /v1/chat/completions (NULL: chat requests are refused
    const char *no_chat;           // with this reason)
} neox_serve_options;

typedef struct neox_serve_engine neox_serve_engine;

// Prepares scoring and generation over ev (which outlives the engine) and, on data-parallel rank
// 0, starts the scheduler thread (the other ranks run neox_serve_worker_run).
neox_serve_engine *neox_serve_engine_create(neox_evaluator *ev, const neox_serve_options *o, neox_error *err);
// On data-parallel ranks other than 0 (no HTTP there): computes the shares of the batches rank 0
// sends until it says stop. Returns 0.
int neox_serve_worker_run(neox_serve_engine *en);
// Stops the scheduler after the queued requests, then frees.
void neox_serve_engine_free(neox_serve_engine *en);
const neox_serve_options *neox_serve_engine_options(const neox_serve_engine *en);

// A request's place in the scheduler. done() is called from the scheduler thread once the
// response (a JSON body and its HTTP status) is ready.
typedef struct neox_serve_job neox_serve_job;
typedef void (*neox_serve_done)(void *ctx, int http_status, char *body);
// Asked from the scheduler thread while a request generates: nonzero when its client has gone
// (closed the connection), so that its completions stop and free their decoding slots.
typedef int (*neox_serve_gone)(void *ctx);

// Tokenizes, checks the limits and queues a parsed request (taking it over). Returns 0 when
// queued (done() follows), or -1 with e set (400 over the limits, 503 when the queue is full or
// the server is stopping); the request is released either way. gone may be NULL.
int neox_serve_submit(neox_serve_engine *en, neox_serve_request *r, neox_serve_done done, neox_serve_gone gone, void *ctx,
                      neox_serve_error *e);
// Requests queued or running.
int neox_serve_pending(neox_serve_engine *en);
// No more requests are accepted (503 "shutting down"); queued ones still complete.
void neox_serve_close_queue(neox_serve_engine *en);

// ---- responses ----------------------------------------------------------------------------------
// {"error": {"message", "type", "param", "code"}} (malloc'ed).
char *neox_serve_error_body(const neox_serve_error *e);
// {"object": "list", "data": [the model]} and {"status": "ok"} (malloc'ed).
char *neox_serve_models_body(const neox_serve_options *o);

// ---- HTTP ---------------------------------------------------------------------------------------
typedef struct neox_serve_http_options {
    const char *host;        // numeric IPv4 or IPv6 address to listen on
    int port;                // 0: any free port
    size_t max_body_bytes;   // larger request bodies are answered 413
    int max_connections;     // more are refused by the HTTP library
    double connection_timeout;  // seconds an idle connection stays open
} neox_serve_http_options;

// Serves the engine over HTTP until SIGTERM or SIGINT, then stops accepting, lets the queued
// requests finish and be answered and returns 0 (-1 with err set when it cannot listen).
// on_listening, when set, is called with the bound port once the server accepts connections.
int neox_serve_http_run(neox_serve_engine *en, const neox_serve_http_options *o, void (*on_listening)(int port),
                        neox_error *err);

#endif
