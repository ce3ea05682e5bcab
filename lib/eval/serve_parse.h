// serve_parse.h: what the completions parser (serve_request.c) shares with the chat parser
// (serve_chat.c): the typed field readers, the completions fields both bodies accept, and the
// body's JSON loading (duplicates refused, malformed JSON answered 400 with its position).
#ifndef NEOX_SERVE_PARSE_H
#define NEOX_SERVE_PARSE_H

#include <jansson.h>

#include "serve.h"

int neox_serve_int_field(const json_t *v, const char *name, long long lo, long long hi, long long *out, neox_serve_error *e);
int neox_serve_bool_field(const json_t *v, const char *name, int *out, neox_serve_error *e);
// One /v1/completions field into r; an unknown one is refused by name.
int neox_serve_parse_field(const char *key, const json_t *v, neox_serve_request *r, neox_serve_error *e);
// Loads the body and runs parse over its root with r at the completions defaults; r is released
// on failure.
int neox_serve_parse_body(const char *body, size_t size, neox_serve_request *r,
                          int (*parse)(const json_t *, neox_serve_request *, neox_serve_error *), neox_serve_error *e);

// A tokenized request as the /v1/completions body that parses back to it (prompts as token ids;
// the seed only when it has one): how a batch travels to the other data-parallel ranks.
json_t *neox_serve_request_json(const neox_serve_request *r);

#endif
