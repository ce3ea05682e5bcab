// chat_template_driver.c: lib/tokenizer's chat templates for tests/oracle/test_chat_template.py,
// which compares them with transformers' apply_chat_template (jinja2).
//   chat_template_driver TEMPLATE CASES.json
// CASES.json is a list of {"messages": [...], "add_generation_prompt": bool, "bos_token": str,
// "eos_token": str}; the output is a JSON list with, per case, {"text": ...} or {"error": ...}.
// A template that does not parse prints its error on stderr and exits with its status.
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "tokenizer.h"

static json_t *render_case(const neox_chat_template *tmpl, const json_t *c) {
    neox_chat_context ctx = {
        .messages = json_object_get(c, "messages"),
        .bos_token = json_string_value(json_object_get(c, "bos_token")),
        .eos_token = json_string_value(json_object_get(c, "eos_token")),
        .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
    };
    neox_error err = {0};
    size_t size;
    char *text = neox_chat_template_render(tmpl, &ctx, &size, &err);
    json_t *out = text ? json_pack("{ss%}", "text", text, size) : json_pack("{ss}", "error", err.message);
    free(text);
    return out;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TEMPLATE CASES.json\n", argv[0]);
        return 2;
    }
    neox_error err = {0};
    size_t size;
    char *source = neox_read_file(argv[1], &size, &err);
    neox_chat_template *tmpl = source ? neox_chat_template_parse(source, size, argv[1], &err) : NULL;
    free(source);
    json_error_t jerr;
    json_t *cases = tmpl ? json_load_file(argv[2], 0, &jerr) : NULL;
    if (!tmpl || !cases) {
        fprintf(stderr, "%s\n", tmpl ? jerr.text : err.message);
        neox_chat_template_free(tmpl);
        return tmpl ? 1 : err.status;
    }
    json_t *results = json_array();
    for (size_t i = 0; i < json_array_size(cases); i++) json_array_append_new(results, render_case(tmpl, json_array_get(cases, i)));
    char *dump = json_dumps(results, JSON_ENSURE_ASCII);
    puts(dump);
    free(dump);
    json_decref(results);
    json_decref(cases);
    neox_chat_template_free(tmpl);
    return 0;
}
