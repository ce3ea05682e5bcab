// fuzz_chat_template.c: a chat template (tokenizer_config.json's Jinja2) through the parser and,
// when it parses, the renderer. The input is the template, then optionally "\n--messages--\n" and
// a JSON list of messages to render it with (a fixed two-turn conversation otherwise).
#include <jansson.h>

#include "fuzz_util.h"
#include "tokenizer.h"

static const char default_messages[] =
    "[{\"role\": \"system\", \"content\": \" be brief \"}, {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"hello\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *source, *messages_text;
    size_t source_size, messages_size;
    fuzz_split(data, size, "\n--messages--\n", &source, &source_size, &messages_text, &messages_size);
    neox_error err = {0};
    neox_chat_template *tmpl = neox_chat_template_parse((const char *)source, source_size, "fuzz", &err);
    if (!tmpl) return 0;
    json_t *messages = messages_size ? json_loadb((const char *)messages_text, messages_size, 0, NULL)
                                     : json_loads(default_messages, 0, NULL);
    if (messages) {
        for (int generation = 0; generation < 2; generation++) {
            neox_chat_context ctx = {.messages = messages, .bos_token = "<s>", .eos_token = "</s>",
                                     .add_generation_prompt = generation};
            size_t n;
            free(neox_chat_template_render(tmpl, &ctx, &n, &err));
        }
        json_decref(messages);
    }
    neox_chat_template_free(tmpl);
    return 0;
}
