// serve_chat.c: neox-eval serve's /v1/chat/completions — the request body (a conversation and
// OpenAI's chat fields, checked as strictly as completions), the conversation rendered with the
// tokenizer's chat template (lib/tokenizer.h: apply_chat_template's rendering, generation prompt
// on) into the prompt the engine generates from, and the chat.completion response (the assistant
// message, OpenAI's per-token logprobs with their bytes).
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "serve_job.h"
#include "serve_parse.h"

#define BAD(param, ...) neox_serve_error_set(e, 400, "invalid_request_error", param, __VA_ARGS__)
#define MAX_MESSAGES 4096

// ---- the request ----------------------------------------------------------------------------------
static int check_message(const json_t *m, size_t i, neox_serve_error *e) {
    if (!json_is_object(m)) return BAD("messages", "messages[%zu]: must be an object with \"role\" and \"content\"", i);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name"))
            return BAD("messages", "messages[%zu]: unsupported field '%s'", i, key);
        if (!json_is_string(v))
            return BAD("messages", "messages[%zu].%s: must be a string%s", i, key,
                       strcmp(key, "content") ? "" : " (content parts, images and tool calls are not supported)");
    }
    const json_t *role = json_object_get(m, "role");
    if (!role || json_string_length(role) == 0) return BAD("messages", "messages[%zu]: no role", i);
    if (!json_object_get(m, "content")) return BAD("messages", "messages[%zu]: no content", i);
    return 0;
}

static int parse_messages(const json_t *v, neox_serve_request *r, neox_serve_error *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("messages", "messages: must be a non-empty list of {\"role\", \"content\"} objects");
    if (json_array_size(v) > MAX_MESSAGES) return BAD("messages", "messages: more than %d", MAX_MESSAGES);
    size_t i;
    const json_t *m;
    json_array_foreach(v, i, m) {
        if (check_message(m, i, e) != 0) return -1;
    }
    r->messages = json_incref((json_t *)v);
    return 0;
}

typedef struct chat_fields {
    int logprobs;            // OpenAI's chat logprobs is a flag...
    long long top_logprobs;  // ...and the alternatives per token a separate count
    int has_top;
} chat_fields;

static int parse_chat_field(const char *key, const json_t *v, neox_serve_request *r, chat_fields *f, neox_serve_error *e) {
    if (!strcmp(key, "messages")) return parse_messages(v, r, e);
    if (!strcmp(key, "logprobs")) return json_is_null(v) ? 0 : neox_serve_bool_field(v, key, &f->logprobs, e);
    if (!strcmp(key, "top_logprobs")) {
        if (json_is_null(v)) return 0;
        f->has_top = 1;
        return neox_serve_int_field(v, key, 0, NEOX_SERVE_MAX_LOGPROBS, &f->top_logprobs, e);
    }
    if (!strcmp(key, "prompt") || !strcmp(key, "echo"))
        return BAD(key, "%s: not a chat completions field (use /v1/completions)", key);
    // max_completion_tokens is OpenAI's newer name for max_tokens.
    return neox_serve_parse_field(strcmp(key, "max_completion_tokens") ? key : "max_tokens", v, r, e);
}

static int parse_chat_object(const json_t *root, neox_serve_request *r, neox_serve_error *e) {
    if (!json_is_object(root)) return BAD(NULL, "the request body must be a JSON object");
    if (json_object_get(root, "max_tokens") && json_object_get(root, "max_completion_tokens"))
        return BAD("max_completion_tokens", "max_tokens and max_completion_tokens: give one");
    r->chat = 1;
    r->max_tokens = -1;
    chat_fields f = {0};
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (parse_chat_field(key, v, r, &f, e) != 0) return -1;
    }
    if (!r->messages) return BAD("messages", "messages: missing");
    if (r->max_tokens == 0) return BAD("max_tokens", "max_tokens: a chat completion generates at least one token");
    if (f.has_top && !f.logprobs) return BAD("top_logprobs", "top_logprobs: needs logprobs true");
    r->logprobs = f.logprobs ? (int)f.top_logprobs : -1;
    r->prompts = neox_calloc(1, sizeof *r->prompts);  // rendered when submitted
    r->nprompts = 1;
    return 0;
}

int neox_serve_parse_chat_request(const char *body, size_t size, neox_serve_request *out, neox_serve_error *e) {
    return neox_serve_parse_body(body, size, out, parse_chat_object, e);
}

// ---- rendering ----------------------------------------------------------------------------------------
int neox_serve_render_chat(const neox_serve_options *o, neox_serve_request *r, neox_serve_error *e) {
    if (!o->chat)
        return neox_serve_error_set(e, 400, "invalid_request_error", "messages",
                                    "this server has no chat template (%s); start it with --chat-template FILE",
                                    o->no_chat ? o->no_chat : "none loaded");
    const neox_chat_format *f = o->chat;
    neox_chat_context ctx = {.messages = r->messages, .bos_token = f->bos_token, .eos_token = f->eos_token,
                             .unk_token = f->unk_token, .pad_token = f->pad_token, .add_generation_prompt = 1};
    neox_error err = {0};
    size_t size;
    char *text = neox_chat_template_render(f->tmpl, &ctx, &size, &err);
    if (!text) return BAD("messages", "messages: the chat template refused the conversation: %s", err.message);
    if (strlen(text) != size) {
        free(text);
        return BAD("messages", "messages: the rendered conversation contains a NUL character");
    }
    r->prompts[0].text = text;
    return 0;
}

// ---- the response -------------------------------------------------------------------------------------
// A token's text and its bytes (a byte-level token may be part of a character: its text is then
// the "<id N>" placeholder the completions lists use, and its bytes are exact).
static json_t *token_entry(const neox_evaluator *ev, int32_t id, double logprob) {
    json_t *bytes, *text = neox_serve_token_json(ev, id, &bytes);
    return json_pack("{s:o, s:f, s:o}", "token", text, "logprob", logprob, "bytes", bytes);
}

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}...]}]} over the
// generated tokens.
static json_t *chat_logprobs(const neox_evaluator *ev, const neox_serve_choice *c, int k) {
    json_t *content = json_array();
    for (int i = c->nprompt; i < c->nprompt + c->ngen; i++) {
        json_t *entry = token_entry(ev, c->tokens[i], c->logprob[i]), *top = json_array();
        for (int j = 0; j < k; j++)
            json_array_append_new(top, token_entry(ev, c->top_ids[(size_t)i * (k + 1) + j],
                                                   c->top_logprob[(size_t)i * (k + 1) + j]));
        json_object_set_new(entry, "top_logprobs", top);
        json_array_append_new(content, entry);
    }
    return json_pack("{s:o}", "content", content);
}

static json_t *chat_choice(const neox_serve_job *job, const neox_evaluator *ev, int index, neox_serve_error *e) {
    const neox_serve_choice *c = &job->choices[index];
    neox_error err = {0};
    size_t size;
    char *text = neox_serve_generated_text(ev, c, &size, &err);
    if (!text) {
        neox_serve_error_set(e, 500, "server_error", NULL, "%s", err.message);
        return NULL;
    }
    json_t *o = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s}", "index", index, "message", "role", "assistant", "content",
                          text, size, "logprobs", c->logprob ? chat_logprobs(ev, c, job->req.logprobs) : json_null(),
                          "finish_reason", c->finished ? "stop" : "length");
    free(text);
    if (!o) neox_serve_error_set(e, 500, "server_error", NULL, "the completion is not valid UTF-8");
    return o;
}

char *neox_serve_chat_body(const neox_serve_job *job, const neox_evaluator *ev, const char *model_name, neox_serve_error *e) {
    return neox_serve_job_body(job, ev, model_name, chat_choice, "chat.completion", "chatcmpl", e);
}
