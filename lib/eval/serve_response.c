// serve_response.c: neox-eval serve's JSON responses in OpenAI's shapes — the completions object
// (text, log-probabilities with their top alternatives, finish reason, usage), the error object,
// the model list.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_job.h"

char *neox_serve_error_body(const neox_serve_error *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:n}", "message", e->message, "type", e->type ? e->type : "server_error",
                            "param", e->param[0] ? json_string(e->param) : json_null(), "code");
    json_t *root = json_pack("{s:o}", "error", err);
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return body;
}

char *neox_serve_models_body(const neox_serve_options *o) {
    json_t *root = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id", o->model_name,
                             "object", "model", "created", (json_int_t)time(NULL), "owned_by", "neox.c", "max_model_len",
                             o->context);
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return body;
}

json_t *neox_serve_token_json(const neox_evaluator *ev, int32_t id, json_t **bytes) {
    size_t size = 0;
    neox_error err = {0};
    char *text = id < neox_tokenizer_vocab_size(ev->tokenizer) ? neox_tokenizer_decode(ev->tokenizer, &id, 1, &size, &err) : NULL;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; text && i < size; i++) json_array_append_new(*bytes, json_integer((unsigned char)text[i]));
    }
    json_t *s = text ? json_stringn(text, size) : NULL;
    if (!s) {
        char name[32];
        snprintf(name, sizeof name, "<id %d>", (int)id);
        s = json_string(name);
    }
    free(text);
    return s;
}

static json_t *token_string(const neox_evaluator *ev, int32_t id) { return neox_serve_token_json(ev, id, NULL); }

static json_t *number_or_null(double x) { return isnan(x) ? json_null() : json_real(x); }

// The k alternatives at token i: {token text: log-probability}, the most likely first (a text two
// ids share keeps the likelier).
static json_t *top_object(const neox_evaluator *ev, const neox_serve_choice *c, int i, int k) {
    json_t *top = json_object();
    for (int j = 0; j < k; j++) {
        json_t *key = token_string(ev, c->top_ids[(size_t)i * (k + 1) + j]);
        const char *name = json_string_value(key);
        if (!json_object_get(top, name)) json_object_set_new(top, name, json_real(c->top_logprob[(size_t)i * (k + 1) + j]));
        json_decref(key);
    }
    return top;
}

static json_t *logprobs_object(const neox_evaluator *ev, const neox_serve_choice *c, int k) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array();
    int64_t offset = 0;
    for (int i = 0; i < c->nprompt + c->ngen; i++) {
        json_t *tok = token_string(ev, c->tokens[i]);
        json_array_append_new(offsets, json_integer(offset));
        offset += neox_count_codepoints(json_string_value(tok));
        json_array_append_new(tokens, tok);
        json_array_append_new(lps, number_or_null(c->logprob[i]));
        json_array_append_new(tops, isnan(c->logprob[i]) ? json_null() : top_object(ev, c, i, k));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offsets);
}

char *neox_serve_generated_text(const neox_evaluator *ev, const neox_serve_choice *c, size_t *size, neox_error *err) {
    int n = c->ngen;
    if (c->finished && n > 0 && c->stop_at < 0 && neox_evaluator_ends_text(ev, c->tokens[c->nprompt + n - 1])) n--;
    char *text = neox_tokenizer_decode(ev->tokenizer, c->tokens + c->nprompt, (size_t)n, size, err);
    if (text && c->stop_at >= 0 && (size_t)c->stop_at < *size) text[*size = (size_t)c->stop_at] = 0;
    return text;
}

static json_t *choice_object(const neox_serve_job *job, const neox_evaluator *ev, int index, neox_serve_error *e) {
    const neox_serve_request *r = &job->req;
    const neox_serve_choice *c = &job->choices[index];
    const neox_serve_prompt *p = &r->prompts[index / r->n];
    neox_error err = {0};
    size_t gsize, psize = 0;
    char *gen = neox_serve_generated_text(ev, c, &gsize, &err), *prompt = NULL;
    if (gen && r->echo) {
        prompt = p->text ? neox_strdup(p->text) : neox_tokenizer_decode(ev->tokenizer, p->ids, (size_t)p->nids, &psize, &err);
        if (p->text) psize = strlen(p->text);
    }
    if (!gen || (r->echo && !prompt)) {
        free(gen);
        neox_serve_error_set(e, 500, "server_error", NULL, "%s", err.message);
        return NULL;
    }
    char *text = neox_malloc(psize + gsize + 1);
    memcpy(text, prompt ? prompt : "", psize);
    memcpy(text + psize, gen, gsize + 1);
    free(gen);
    free(prompt);
    json_t *o = json_pack("{s:i, s:s%, s:o, s:s}", "index", index, "text", text, psize + gsize, "logprobs",
                          c->logprob ? logprobs_object(ev, c, r->logprobs) : json_null(), "finish_reason",
                          c->finished ? "stop" : "length");
    free(text);
    if (!o) neox_serve_error_set(e, 500, "server_error", NULL, "the completion is not valid UTF-8");
    return o;
}

char *neox_serve_job_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name,
                         neox_serve_choice_json choice, const char *object, const char *id_prefix, neox_serve_error *e) {
    const neox_serve_request *r = &job->req;
    json_t *choices = json_array();
    long long prompt_tokens = 0, completion_tokens = 0;
    for (int i = 0; i < r->nprompts; i++) prompt_tokens += r->prompts[i].nids;
    for (int i = 0; i < r->nprompts * r->n; i++) {
        json_t *c = choice(job, ev, i, e);
        if (!c) {
            json_decref(choices);
            return NULL;
        }
        json_array_append_new(choices, c);
        completion_tokens += job->choices[i].ngen;
    }
    char id[48];
    snprintf(id, sizeof id, "%s-%lld", id_prefix, job->id);
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:I, s:I, s:I}}", "id", id, "object", object, "created",
                             (json_int_t)time(NULL), "model", model_name, "choices", choices, "usage", "prompt_tokens",
                             (json_int_t)prompt_tokens, "completion_tokens", (json_int_t)completion_tokens,
                             "total_tokens", (json_int_t)(prompt_tokens + completion_tokens));
    char *body = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    return body;
}

char *neox_serve_completion_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name,
                                 neox_serve_error *e) {
    return neox_serve_job_body(job, ev, model_name, choice_object, "text_completion", "cmpl", e);
}
