// serve_request.c: neox-eval serve's /v1/completions request parser. A body is untrusted input:
// every field is checked for its JSON type and range, unknown fields are refused by name, and
// every failure becomes a 400 with a message naming the field, never a crash.
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_parse.h"

int neox_serve_error_set(neox_serve_error *e, int http_status, const char *type, const char *param, const char *fmt, ...) {
    e->http_status = http_status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(param, ...) neox_serve_error_set(e, 400, "invalid_request_error", param, __VA_ARGS__)

void neox_serve_request_release(neox_serve_request *r) {
    for (int i = 0; i < r->nprompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; i < r->nstop; i++) free(r->stop[i]);
    free(r->model);
    json_decref(r->messages);
    *r = (neox_serve_request){0};
}

// ---- prompts: a string, a list of strings, a list of ids or a list of id lists ------------------
static int ids_of(const json_t *list, neox_serve_prompt *p, neox_serve_error *e) {
    size_t n = json_array_size(list);
    if (n == 0) return BAD("prompt", "prompt: a token list is empty");
    if (n > (size_t)1 << 24) return BAD("prompt", "prompt: %zu tokens is too many", n);
    p->ids = neox_malloc(n * sizeof *p->ids);
    p->nids = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, i);
        if (!json_is_integer(v)) return BAD("prompt", "prompt: token %zu is not an integer", i);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id > INT32_MAX) return BAD("prompt", "prompt: token id %lld is out of range", (long long)id);
        p->ids[i] = (int32_t)id;
    }
    return 0;
}

static void add_prompt(neox_serve_request *r, neox_serve_prompt **p) {
    r->prompts = neox_realloc(r->prompts, (size_t)(r->nprompts + 1) * sizeof *r->prompts);
    *p = &r->prompts[r->nprompts++];
    **p = (neox_serve_prompt){0};
}

static int parse_prompts(const json_t *v, neox_serve_request *r, neox_serve_error *e) {
    neox_serve_prompt *p;
    if (json_is_string(v)) {
        add_prompt(r, &p);
        p->text = neox_strndup(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("prompt", "prompt: must be a string, a list of strings, a list of token ids or a list of such lists");
    const json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) {
        add_prompt(r, &p);
        return ids_of(v, p, e);
    }
    size_t i;
    const json_t *item;
    json_array_foreach(v, i, item) {
        add_prompt(r, &p);
        if (json_is_string(item)) p->text = neox_strndup(json_string_value(item), json_string_length(item));
        else if (json_is_array(item) && ids_of(item, p, e) != 0) return -1;
        else if (!json_is_array(item)) return BAD("prompt", "prompt: item %zu is neither a string nor a token list", i);
    }
    return 0;
}

// ---- scalar fields --------------------------------------------------------------------------------
int neox_serve_int_field(const json_t *v, const char *name, long long lo, long long hi, long long *out, neox_serve_error *e) {
    if (!json_is_integer(v)) return BAD(name, "%s: must be an integer", name);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD(name, "%s: %lld is outside [%lld, %lld]", name, x, lo, hi);
    *out = x;
    return 0;
}

static int number_field(const json_t *v, const char *name, double lo, double hi, double *out, neox_serve_error *e) {
    if (!json_is_number(v)) return BAD(name, "%s: must be a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return BAD(name, "%s: %g is outside [%g, %g]", name, x, lo, hi);
    *out = x;
    return 0;
}

int neox_serve_bool_field(const json_t *v, const char *name, int *out, neox_serve_error *e) {
    if (!json_is_boolean(v)) return BAD(name, "%s: must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(const json_t *v, neox_serve_request *r, neox_serve_error *e) {
    if (json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return BAD("stop", "stop: an empty string");
        r->stop[r->nstop++] = neox_strndup(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return BAD("stop", "stop: must be a string or a list of strings");
    if (json_array_size(v) > NEOX_SERVE_MAX_STOP) return BAD("stop", "stop: at most %d strings", NEOX_SERVE_MAX_STOP);
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) == 0) return BAD("stop", "stop: item %zu is not a non-empty string", i);
        r->stop[r->nstop++] = neox_strndup(json_string_value(s), json_string_length(s));
    }
    return 0;
}

static int parse_logprobs(const json_t *v, neox_serve_request *r, neox_serve_error *e) {
    if (json_is_null(v)) return 0;
    long long x = 0;
    if (neox_serve_int_field(v, "logprobs", 0, NEOX_SERVE_MAX_LOGPROBS, &x, e) != 0) return -1;
    r->logprobs = (int)x;
    return 0;
}

// One known field into r; an unknown one is refused by name.
int neox_serve_parse_field(const char *key, const json_t *v, neox_serve_request *r, neox_serve_error *e) {
    long long x = 0;
    if (!strcmp(key, "prompt")) return parse_prompts(v, r, e);
    if (!strcmp(key, "model")) {
        if (!json_is_string(v)) return BAD("model", "model: must be a string");
        r->model = neox_strndup(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!strcmp(key, "max_tokens")) {
        if (json_is_null(v)) return 0;
        if (neox_serve_int_field(v, key, 0, 1 << 20, &x, e) != 0) return -1;
        r->max_tokens = (int)x;
        return 0;
    }
    if (!strcmp(key, "temperature")) return json_is_null(v) ? 0 : number_field(v, "temperature", 0.0, 100.0, &r->temperature, e);
    if (!strcmp(key, "top_p")) return json_is_null(v) ? 0 : number_field(v, "top_p", 0.0, 1.0, &r->top_p, e);
    if (!strcmp(key, "top_k")) {
        if (json_is_null(v)) return 0;
        if (neox_serve_int_field(v, key, -1, 1 << 24, &x, e) != 0) return -1;
        r->top_k = (int)x;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        if (json_is_null(v)) return 0;
        if (!json_is_integer(v)) return BAD("seed", "seed: must be an integer");
        r->seed = (unsigned long long)json_integer_value(v);
        r->has_seed = 1;
        return 0;
    }
    if (!strcmp(key, "stop")) return parse_stop(v, r, e);
    if (!strcmp(key, "echo")) return neox_serve_bool_field(v, "echo", &r->echo, e);
    if (!strcmp(key, "logprobs")) return parse_logprobs(v, r, e);
    if (!strcmp(key, "n")) {
        if (neox_serve_int_field(v, "n", 1, NEOX_SERVE_MAX_N, &x, e) != 0) return -1;
        r->n = (int)x;
        return 0;
    }
    if (!strcmp(key, "stream")) {
        int stream = 0;
        if (!json_is_null(v) && neox_serve_bool_field(v, "stream", &stream, e) != 0) return -1;
        return stream ? BAD("stream", "stream: streamed responses are not supported") : 0;
    }
    return BAD(key, "unsupported parameter '%s'", key);
}

static int parse_object(const json_t *root, neox_serve_request *r, neox_serve_error *e) {
    if (!json_is_object(root)) return BAD(NULL, "the request body must be a JSON object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (neox_serve_parse_field(key, v, r, e) != 0) return -1;
    }
    if (r->nprompts == 0) return BAD("prompt", "prompt: missing");
    if (r->nprompts * r->n > 4096) return BAD("n", "%d prompts x n %d is more than 4096 completions", r->nprompts, r->n);
    return 0;
}

int neox_serve_parse_body(const char *body, size_t size, neox_serve_request *out,
                          int (*parse)(const json_t *, neox_serve_request *, neox_serve_error *), neox_serve_error *e) {
    *out = (neox_serve_request){.max_tokens = 16, .temperature = 1.0, .top_p = 1.0, .logprobs = -1, .n = 1};
    json_error_t jerr;
    // REJECT_DUPLICATES: a field given twice would be ambiguous.
    json_t *root = json_loadb(body, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        neox_serve_error_set(e, 400, "invalid_request_error", NULL, "malformed JSON at line %d, column %d: %s", jerr.line,
                             jerr.column, jerr.text);
        return -1;
    }
    int rc = parse(root, out, e);
    json_decref(root);
    if (rc != 0) neox_serve_request_release(out);
    return rc;
}

int neox_serve_parse_request(const char *body, size_t size, neox_serve_request *out, neox_serve_error *e) {
    return neox_serve_parse_body(body, size, out, parse_object, e);
}

int neox_serve_fuzz_request(const uint8_t *data, size_t size) {
    neox_serve_request r;
    neox_serve_error e;
    if (neox_serve_parse_request((const char *)data, size, &r, &e) == 0) neox_serve_request_release(&r);
    if (neox_serve_parse_chat_request((const char *)data, size, &r, &e) == 0) neox_serve_request_release(&r);
    return 0;
}

// ---- the inverse: a tokenized request as a completions body --------------------------------------
json_t *neox_serve_request_json(const neox_serve_request *r) {
    json_t *prompts = json_array();
    for (int i = 0; i < r->nprompts; i++) {
        json_t *ids = json_array();
        for (int t = 0; t < r->prompts[i].nids; t++) json_array_append_new(ids, json_integer(r->prompts[i].ids[t]));
        json_array_append_new(prompts, ids);
    }
    json_t *stop = json_array();
    for (int i = 0; i < r->nstop; i++) json_array_append_new(stop, json_string(r->stop[i]));
    json_t *o = json_pack("{s:o, s:i, s:f, s:f, s:i, s:o, s:b, s:i}", "prompt", prompts, "max_tokens", r->max_tokens,
                          "temperature", r->temperature, "top_p", r->top_p, "top_k", r->top_k, "stop", stop, "echo",
                          r->echo, "n", r->n);
    if (r->has_seed) json_object_set_new(o, "seed", json_integer((json_int_t)r->seed));
    if (r->logprobs >= 0) json_object_set_new(o, "logprobs", json_integer(r->logprobs));
    return o;
}
